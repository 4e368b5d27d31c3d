#!/usr/bin/env bash
# The set-up step of `make book` for the diagrams (transformer_course.viz.diagrams): Graphviz's
# `dot`, which lays them out. When it is missing it installs Debian's graphviz with apt-get if
# this user may (root, or passwordless sudo); otherwise it stops at once with one line saying
# what to install. (Colab's image has graphviz already.)
set -u
PACKAGES="graphviz"

command -v dot >/dev/null 2>&1 && exit 0

say() { echo "make book: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
  say "the diagrams need Graphviz's dot: install graphviz with your package manager" \
      "(macOS: brew install graphviz), then run make again"
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  say "the diagrams need Graphviz's dot: run 'sudo apt-get install -y $PACKAGES', then make again"
  exit 1
fi
echo "make book: installing $PACKAGES with apt-get (the diagrams need dot)"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq && \
       $SUDO apt-get install -y -qq --no-install-recommends $PACKAGES; } >/dev/null; then
  say "apt-get could not install $PACKAGES (see above); install it, then run make again"
  exit 1
fi
if ! command -v dot >/dev/null 2>&1; then
  say "apt-get installed $PACKAGES but dot is still not on PATH"
  exit 1
fi
