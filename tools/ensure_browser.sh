#!/usr/bin/env bash
# The set-up step of `make test` for its browser tests (tests/site/test_browser.py, test_a11y.py):
# Debian's chromium at $CHROMIUM, the DejaVu fonts, and Noto CJK for the Chinese pages (their
# headings must render in a CJK font, not as empty boxes). When any is missing it installs
# them with apt-get if this user may (root, or passwordless sudo); otherwise it stops at
# once with one line saying what to install (tools/apt_install.sh).
set -u
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
FONT="${FONT:-/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf}"
CJK_FONT="${CJK_FONT:-/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc}"

[ -x "$CHROMIUM" ] && [ -f "$FONT" ] && [ -f "$CJK_FONT" ] && exit 0

. "${BASH_SOURCE[0]%/*}/apt_install.sh"
apt_install "the browser tests need chromium at $CHROMIUM, the DejaVu and the Noto CJK fonts" \
  "chromium fonts-dejavu-core fonts-noto-cjk" || exit 1
if [ ! -x "$CHROMIUM" ]; then
  say "apt-get installed chromium but $CHROMIUM is still missing (the tests launch that path)"
  exit 1
fi
