# Sourced by the set-up steps of `make test` and `make book` (tools/ensure_browser.sh,
# ensure_sandbox.sh, ensure_graphviz.sh): `apt_install NEED PACKAGES` installs PACKAGES
# (space-separated) with apt-get if this user may (root, or passwordless sudo); otherwise
# it stops at once with one line saying what to install and returns 1. NEED says what
# needs them and why; TARGET (default "make test") is the command the messages name.
TARGET="${TARGET:-make test}"
say() { echo "$TARGET: $*" >&2; }

apt_install() {
  local need="$1" packages="$2" sudo
  if ! command -v apt-get >/dev/null 2>&1; then
    say "$need: install $packages with your package manager" \
        "(Debian/Ubuntu: apt-get install $packages), then run $TARGET again"
    return 1
  fi
  if [ "$(id -u)" = 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    say "$need: run 'sudo apt-get install -y $packages', then $TARGET again"
    return 1
  fi
  echo "$TARGET: installing $packages with apt-get ($need)"
  export DEBIAN_FRONTEND=noninteractive
  if ! { $sudo apt-get update -qq && \
         $sudo apt-get install -y -qq --no-install-recommends $packages; } >/dev/null; then
    say "apt-get could not install $packages (see above); install them, then run $TARGET again"
    return 1
  fi
}
