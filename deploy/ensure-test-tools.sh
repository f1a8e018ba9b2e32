#!/usr/bin/env bash
# The command-line tools the test suite uses to make files as an agent would, installed
# from Debian's packages when absent: setfattr (attr), setfacl (acl), setcap
# (libcap2-bin), setpriv (util-linux). Idempotent.
set -euo pipefail
missing=()
command -v setfattr >/dev/null || missing+=(attr)
command -v setfacl >/dev/null || missing+=(acl)
command -v setcap >/dev/null || missing+=(libcap2-bin)
command -v setpriv >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure-test-tools: install ${missing[*]} (needs root and apt)" >&2; exit 1
  fi
  echo "ensure-test-tools: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
