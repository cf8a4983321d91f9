#!/usr/bin/env bash
# The browser tests' headless Chromium: Debian's `chromium` package, installed with apt when
# /usr/bin/chromium is absent (KEDGE_CHROMIUM names another binary instead). Idempotent: a
# second run finds the binary and costs nothing. Prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KEDGE_CHROMIUM:-/usr/bin/chromium}
if [ -n "${KEDGE_CHROMIUM:-}" ] && [ ! -x "$bin" ]; then
  echo "browser-env: KEDGE_CHROMIUM=$bin is not an executable file" >&2
  exit 1
fi
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
# One installer at a time (test binaries or shells started together on a fresh machine); apt
# holds its own lock too, but would fail instead of waiting for it.
mkdir -p target
exec 9>target/browser-env.lock
flock 9
# Installed by whoever held the lock before us.
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "browser-env: $bin is missing and there is no apt-get: install Chromium and set" \
    "KEDGE_CHROMIUM to its binary" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "browser-env: $bin is missing and installing it needs root: run" \
    "'apt-get install chromium' as root, or set KEDGE_CHROMIUM to a Chromium binary" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update >&2
"${sudo[@]}" apt-get install -y --no-install-recommends chromium >&2
[ -x "$bin" ] || { echo "browser-env: apt installed chromium but $bin is missing" >&2; exit 1; }
echo "$bin"
