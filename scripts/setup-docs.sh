#!/usr/bin/env bash
# What `make docs` and the docs build test need: MkDocs, Material, mkdocstrings and mkdocs-jupyter, exactly
# requirements/docs-lock.txt, installed into .venv beside the CPU lock (they change none of its versions).
# Idempotent like scripts/setup.sh: skips the install when the stamp of this lock is there. Needs .venv
# (scripts/setup.sh first).
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements/docs-lock.txt
STAMP=.venv/.docs-installed-$(sha256sum "$LOCK" | cut -c1-16)
if [ -f "$STAMP" ]; then exit 0; fi
[ -x .venv/bin/python ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }
.venv/bin/pip install --disable-pip-version-check -q --no-deps -r "$LOCK"
rm -f .venv/.docs-installed-*
touch "$STAMP"
