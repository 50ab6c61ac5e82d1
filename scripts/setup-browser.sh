#!/usr/bin/env bash
# What the browser tests need (scripts/test.sh browser): Debian's headless-capable Chromium and the Playwright
# Python package. Playwright drives /usr/bin/chromium: no browser is downloaded (`playwright install` is never
# run; machines without outside access cannot fetch one anyway). Idempotent: skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PLAYWRIGHT_VERSION=1.65.2

if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
fi

if ! .venv/bin/python -c "import playwright.sync_api" 2>/dev/null; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 .venv/bin/pip install --disable-pip-version-check -q "playwright==${PLAYWRIGHT_VERSION}"
fi

/usr/bin/chromium --version 2>/dev/null
.venv/bin/python -c "import importlib.metadata as m; print('playwright', m.version('playwright'))"
