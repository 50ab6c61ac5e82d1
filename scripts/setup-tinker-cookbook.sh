#!/usr/bin/env bash
# tinker-cookbook's side of bench/tinker_cookbook_rl.py: bench/.venv-tinker with requirements/tinker-cookbook.txt
# (not rlkit's lock), then tinker-cookbook 0.6.1 without its dependencies (see that file for why). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
REQ=requirements/tinker-cookbook.txt
COOKBOOK=tinker-cookbook==0.6.1
STAMP=bench/.venv-tinker/.installed-$( (cat "$REQ"; echo "$COOKBOOK") | sha256sum | cut -c1-16)
if [ -f "$STAMP" ]; then exit 0; fi
[ -x bench/.venv-tinker/bin/python ] || "$PY" -m venv bench/.venv-tinker
PIP="bench/.venv-tinker/bin/pip --disable-pip-version-check -q"
if [ -n "${PIP_FIND_LINKS:-}" ]; then
  $PIP install "torch==2.13.0"
else
  $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
$PIP install -r "$REQ"
$PIP install --no-deps "$COOKBOOK"
rm -f bench/.venv-tinker/.installed-*
touch "$STAMP"
