#!/usr/bin/env bash
# The browser of the widget and console tests (tests/src/browser.rs): Debian's chromium and
# chromium-driver, headless. `make test` runs `install` first.
#
#   deploy/local/browser.sh install   # quick when both are there
#
# Installing needs apt-get as root (CI and the project's machines run as root); anyone else is
# told the one command to run. No browser build is downloaded from anywhere else.
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

case "${1:-install}" in
  install)
    if have; then
      exit 0
    fi
    if [ "$(id -u)" != 0 ]; then
      echo "browser.sh: the browser tests need Debian's chromium and chromium-driver:" >&2
      echo "  sudo apt-get install -y chromium chromium-driver" >&2
      exit 1
    fi
    echo "browser.sh: installing Debian's chromium and chromium-driver (once)" >&2
    export DEBIAN_FRONTEND=noninteractive
    for attempt in 1 2 3; do
      if apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
         { apt-get update -q >/dev/null 2>&1 &&
           apt-get install -y -q chromium chromium-driver >/dev/null; }; then
        break
      fi
      if [ "$attempt" = 3 ]; then
        echo "browser.sh: apt-get could not install chromium and chromium-driver" >&2
        exit 1
      fi
      sleep $((attempt * 5))
    done
    have
    chromium --version >&2
    ;;
  *)
    echo "usage: $0 install" >&2
    exit 2
    ;;
esac
