#!/usr/bin/env bash
# PostgreSQL's server binaries (initdb, pg_ctl, postgres) and its system user, from
# Debian's `postgresql` package when absent. The tests make a throwaway cluster of
# their own (tests/services.py); nothing here starts a server. Idempotent.
set -euo pipefail
found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -n "$found" ] && [ -x "$found/initdb" ] && id postgres >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "ensure-postgres: install Debian's postgresql package (needs root and apt)" >&2; exit 1
fi
echo "ensure-postgres: installing postgresql" >&2
DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# The package may make and start a cluster of its own; the tests do not use it.
if command -v pg_lsclusters >/dev/null; then
  pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
    pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
  done
fi
