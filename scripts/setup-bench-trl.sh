#!/usr/bin/env bash
# The TRL side of bench/vs_trl.py: bench/.venv-trl with requirements/bench-trl.txt (not rlkit's lock). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
REQ=requirements/bench-trl.txt
STAMP=bench/.venv-trl/.installed-$(sha256sum "$REQ" | cut -c1-16)
if [ -f "$STAMP" ]; then exit 0; fi
[ -x bench/.venv-trl/bin/python ] || "$PY" -m venv bench/.venv-trl
PIP="bench/.venv-trl/bin/pip --disable-pip-version-check -q"
if [ -n "${PIP_FIND_LINKS:-}" ]; then
  $PIP install "torch==2.13.0"
else
  $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
$PIP install -r "$REQ"
rm -f bench/.venv-trl/.installed-*
touch "$STAMP"
