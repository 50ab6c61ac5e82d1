#!/usr/bin/env bash
# The TRL side of bench/vs_trl.py: bench/.venv-trl with requirements/bench-trl.txt (not rlkit's lock). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side-venv.sh
side_venv bench/.venv-trl requirements/bench-trl.txt
