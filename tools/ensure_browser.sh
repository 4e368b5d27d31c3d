#!/usr/bin/env bash
# The set-up step of `make test` for its browser tests (tests/test_browser.py, test_a11y.py):
# Debian's chromium at $CHROMIUM and the DejaVu fonts. When either is missing it installs
# them with apt-get if this user may (root, or passwordless sudo); otherwise it stops at
# once with one line saying what to install. Nothing else is needed on a fresh machine.
set -u
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
FONT="${FONT:-/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf}"
PACKAGES="chromium fonts-dejavu-core"

[ -x "$CHROMIUM" ] && [ -f "$FONT" ] && exit 0

say() { echo "make test: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
  say "the browser tests need chromium at $CHROMIUM and DejaVu fonts: install them" \
      "with your package manager (Debian/Ubuntu: apt-get install $PACKAGES), then run make test again"
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  say "the browser tests need chromium at $CHROMIUM: run 'sudo apt-get install -y $PACKAGES'," \
      "then make test again"
  exit 1
fi
echo "make test: installing $PACKAGES with apt-get (the browser tests need them)"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq && \
       $SUDO apt-get install -y -qq --no-install-recommends $PACKAGES; } >/dev/null; then
  say "apt-get could not install $PACKAGES (see above); install them, then run make test again"
  exit 1
fi
if [ ! -x "$CHROMIUM" ]; then
  say "apt-get installed chromium but $CHROMIUM is still missing (the tests launch that path)"
  exit 1
fi
