#!/usr/bin/env bash
# The set-up step of `make book` for the diagrams (transformer_course.viz.diagrams): Graphviz's
# `dot`, which lays them out. When it is missing it installs Debian's graphviz with apt-get if
# this user may (root, or passwordless sudo); otherwise it stops at once with one line saying
# what to install (tools/apt_install.sh). (Colab's image has graphviz already.)
set -u
PACKAGES="graphviz"

command -v dot >/dev/null 2>&1 && exit 0

TARGET="make book"
. "${BASH_SOURCE[0]%/*}/apt_install.sh"
apt_install "the diagrams need Graphviz's dot" "$PACKAGES" || exit 1
if ! command -v dot >/dev/null 2>&1; then
  say "apt-get installed $PACKAGES but dot is still not on PATH"
  exit 1
fi
