#!/usr/bin/env bash
# The set-up step of `make test` for its browser tests (tests/site/test_browser.py, test_a11y.py):
# Debian's chromium at $CHROMIUM and the DejaVu fonts. When either is missing it installs
# them with apt-get if this user may (root, or passwordless sudo); otherwise it stops at
# once with one line saying what to install (tools/apt_install.sh).
set -u
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
FONT="${FONT:-/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf}"

[ -x "$CHROMIUM" ] && [ -f "$FONT" ] && exit 0

. "${BASH_SOURCE[0]%/*}/apt_install.sh"
apt_install "the browser tests need chromium at $CHROMIUM and the DejaVu fonts" \
  "chromium fonts-dejavu-core" || exit 1
if [ ! -x "$CHROMIUM" ]; then
  say "apt-get installed chromium but $CHROMIUM is still missing (the tests launch that path)"
  exit 1
fi
