#!/usr/bin/env bash
# The set-up step of `make test` for its grading tests (tests/slow/test_grading.py), which run
# every submission in a bubblewrap sandbox: `bwrap` on PATH. When it is missing it installs
# bubblewrap with apt-get if this user may (root, or passwordless sudo); otherwise it stops
# at once with one line saying what to install (tools/apt_install.sh). Whether bwrap can
# then run here (user namespaces; Docker needs --privileged) the tests check themselves,
# and the sandbox attack tests skip, naming why, where it cannot.
set -u
command -v bwrap >/dev/null 2>&1 && exit 0

. "${BASH_SOURCE[0]%/*}/apt_install.sh"
apt_install "the grading tests sandbox each submission with bubblewrap" "bubblewrap" || exit 1
if ! command -v bwrap >/dev/null 2>&1; then
  say "apt-get installed bubblewrap but bwrap is still not on PATH"
  exit 1
fi
