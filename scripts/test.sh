#!/usr/bin/env bash
# Set up the environment, then run a test target: default (fast suite), slow, browser, or all.
# The default and browser targets also set up the docs packages (scripts/setup-docs.sh): they build the site.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
target=${1:-default}
shift || true
case "$target" in
  # two worker processes (pytest-xdist): one pytest process keeps ~1.2 of the 2 cores busy (Python overhead of tiny
  # models, kernel and engine start-ups); each worker takes a contiguous half and steals from the other when idle,
  # so a module's fixtures are mostly built once. `-n 0` after the target runs everything in one process.
  default) scripts/setup-docs.sh && exec .venv/bin/python -m pytest -m "not slow and not browser" -n 2 --dist worksteal --durations=40 "$@" ;;
  slow)    exec .venv/bin/python -m pytest -m "slow" "$@" ;;
  browser) scripts/setup-browser.sh && scripts/setup-docs.sh && exec .venv/bin/python -m pytest -m "browser" "$@" ;;
  all)     scripts/setup-browser.sh && scripts/setup-docs.sh && exec .venv/bin/python -m pytest "$@" ;;
  *) echo "unknown target '$target' (default | slow | browser | all)" >&2; exit 2 ;;
esac
