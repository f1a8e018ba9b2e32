#!/usr/bin/env bash
# The browser the console's tests drive: Debian's chromium and its driver, installed when
# absent (Playwright's own browser download cannot work without the internet beyond the
# package registries; its Python package drives this one). Idempotent.
set -euo pipefail
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure-browser: install chromium (needs root and apt)" >&2; exit 1
  fi
  echo "ensure-browser: installing chromium" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi
