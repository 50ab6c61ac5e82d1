#!/usr/bin/env bash
# tinker-cookbook's side of bench/tinker_cookbook_rl.py: bench/.venv-tinker with requirements/tinker-cookbook.txt
# (not rlkit's lock), then tinker-cookbook 0.6.1 without its dependencies (see that file for why). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side-venv.sh
side_venv bench/.venv-tinker requirements/tinker-cookbook.txt tinker-cookbook==0.6.1
