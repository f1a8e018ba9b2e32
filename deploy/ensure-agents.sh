#!/usr/bin/env bash
# The real agents' programs the tests drive, pinned, from the npm registry: Claude Code,
# Gemini CLI and Codex (whose package carries its native binary). Each version is
# installed once into a folder of its own under the cache, and kept:
#   ${WORLDLINE_AGENTS_CACHE:-~/.cache/worldline/agents}/<name>-<version>/node_modules/.bin/
# Node comes from Debian's packages when absent. Idempotent; prints nothing when all is
# there. A registry that cannot be reached fails here, with npm's reason.
set -euo pipefail
cache=${WORLDLINE_AGENTS_CACHE:-$HOME/.cache/worldline/agents}
# name  package  version  (the second pins are the versions whose behaviour differs)
pins=(
  "claude-code @anthropic-ai/claude-code 2.1.197"
  "gemini-cli @google/gemini-cli 0.61.0"
  # the last Gemini CLI that writes its session as one JSON document (0.39.0 made it
  # JSONL) and that trusts every folder when headless (0.39.0 made that explicit)
  "gemini-cli @google/gemini-cli 0.38.2"
  "codex @openai/codex 0.171.0"
)
if ! command -v ip >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  # tests/agents/sandbox.py runs each agent where only loopback exists (unshare, ip)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure-agents: install Node.js 20 or newer and npm (needs root and apt)" >&2; exit 1
  fi
  echo "ensure-agents: installing nodejs and npm" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$cache"
for pin in "${pins[@]}"; do
  read -r name pkg version <<<"$pin"
  dir="$cache/$name-$version"
  [ -f "$dir/.installed" ] && continue
  echo "ensure-agents: installing $pkg@$version into $dir" >&2
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  if ! npm install --prefix "$dir.tmp" --no-audit --no-fund --loglevel=error \
      --no-update-notifier "$pkg@$version" >"$dir.tmp.log" 2>&1; then
    echo "ensure-agents: npm could not install $pkg@$version:" >&2
    tail -n 20 "$dir.tmp.log" >&2
    exit 1
  fi
  touch "$dir.tmp/.installed" && rm -rf "$dir" && mv "$dir.tmp" "$dir" && rm -f "$dir.tmp.log"
done
