#!/usr/bin/env bash
# Wheels for running bench/gpu_check.py (and the in-process policy tests) on a GPU machine that has PyTorch and
# transformers but neither network nor rlkit's other imports (e.g. this workplace's borrowed H200: Python 3.12).
# Writes them to .whl/ (git-ignored); there: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# and PYTHONPATH=/tmp/site. The list is what `import rlkit` and the script need beyond that machine's packages,
# found by running the script with only those packages importable (2026-12-04).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_28_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  megatron-core==0.17.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 jsonschema==4.26.0 \
  referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
ls .whl
