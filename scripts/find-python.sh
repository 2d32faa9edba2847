#!/usr/bin/env bash
# Print the path of the Python the stack needs (scripts/stacks.sh: 3.12 for STACK=2.21, the
# default, 3.11 for STACK=2.15) for its venv (scripts/setup.sh and lock.sh call this).
#
# TensorFlow 2.21 supports 3.10-3.13 and Horovod 0.28.1 is built against it; Ubuntu 24.04 ships
# 3.12, Debian 12 3.11 and Debian 13 3.13. In order, for version V:
#   1. $PYTHON, pythonV, python3 on PATH, when they are V;
#   2. the newest V.N that pyenv installed ($PYENV_ROOT, else ~/.pyenv), even where pyenv's
#      shim for pythonV refuses it because another version is pyenv's global one;
#   3. a V that uv already knows (`uv python find --system V`: its managed Pythons, PATH; not a
#      venv, which `uv python find` would report, the course's own .venv among them);
#   4. otherwise uv's managed Python (`uv python install V`, python-build-standalone: ~30 MB,
#      once, into ~/.local/share/uv), saying so in one line. uv itself comes from PyPI, installed
#      by whatever python3 exists into $LABS_TOOLS_DIR (default .tools/, nothing system-wide).
# Status lines go to stderr; stdout holds only the interpreter's path.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=${LABS_TOOLS_DIR:-$ROOT/.tools}
. "$ROOT/scripts/stacks.sh"
V=$STACK_PYTHON

die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }
is_v() { "$1" -c "import sys; sys.exit(0 if sys.version_info[:2] == (${V%%.*}, ${V#*.}) else 1)" >/dev/null 2>&1; }

MANUAL="Get it one of these ways, then run the same make command again:
    uv:     pip install uv && uv python install $V && make test STACK=$STACK PYTHON=\$(uv python find --system $V)
    conda:  conda env create -f environment.yml && conda activate dl-labs   (no make needed; the default stack)
    pyenv:  pyenv install $V && make test STACK=$STACK PYTHON=\$(pyenv root)/versions/$V*/bin/python$V
    Debian/Ubuntu:  apt-get install python$V python$V-venv python$V-dev   (Ubuntu: deadsnakes PPA)"

for cand in ${PYTHON:-} "python$V" python3; do
  if command -v "$cand" >/dev/null 2>&1 && is_v "$cand"; then command -v "$cand"; exit 0; fi
done

# pyenv's releases of V (3.12.1, 3.12.10), not its -dev or free-threaded (3.13.0t) builds, newest first
PYENV_DIR=${PYENV_ROOT:-$HOME/.pyenv}
if [ -d "$PYENV_DIR/versions" ]; then
  for release in $(ls "$PYENV_DIR/versions" | grep -E "^${V//./\\.}\.[0-9]+\$" | sort -t. -k3,3nr); do
    cand="$PYENV_DIR/versions/$release/bin/python$V"
    if [ -x "$cand" ] && is_v "$cand"; then
      say "Python $V found in pyenv's versions: $cand"
      printf '%s\n' "$cand"; exit 0
    fi
  done
fi

# uv on PATH, or the one an earlier run installed; else install it with any python3 (a venv
# of its own, or pip --target where venv is missing, as on Ubuntu without python3-venv).
find_uv() {
  local py
  for uv in "$(command -v uv 2>/dev/null || true)" "$TOOLS/uv/bin/uv" "$TOOLS/uv-pkgs/bin/uv"; do
    if [ -n "$uv" ] && [ -x "$uv" ]; then printf '%s\n' "$uv"; return 0; fi
  done
  py=$(command -v python3 2>/dev/null || command -v python 2>/dev/null || true)
  [ -n "$py" ] || return 1
  say "installing uv from PyPI with $py into $TOOLS (to get Python $V)"
  if "$py" -m venv "$TOOLS/uv" >/dev/null 2>&1 && "$TOOLS/uv/bin/python" -m pip install -q uv >&2 \
     && [ -x "$TOOLS/uv/bin/uv" ]; then
    printf '%s\n' "$TOOLS/uv/bin/uv"; return 0
  fi
  rm -rf "$TOOLS/uv"
  if "$py" -m pip install -q --target "$TOOLS/uv-pkgs" uv >&2 && [ -x "$TOOLS/uv-pkgs/bin/uv" ]; then
    printf '%s\n' "$TOOLS/uv-pkgs/bin/uv"; return 0
  fi
  rm -rf "$TOOLS/uv-pkgs"
  return 1
}

UV=$(find_uv) || die "Python $V is needed (the $STACK stack: TensorFlow $TF_VERSION, with Horovod $HOROVOD_VERSION built against it), none found${PYTHON:+ (PYTHON=$PYTHON is not $V)}, and uv could not be installed to get one.
  $MANUAL"

if PY=$("$UV" python find --system "$V" 2>/dev/null) && is_v "$PY"; then
  say "Python $V found by uv: $PY"
else
  say "no Python $V on PATH${PYTHON:+ (PYTHON=$PYTHON is not $V)}: getting one with uv (uv python install $V, about 30 MB, once)"
  "$UV" python install "$V" >&2 || die "uv python install $V failed (see above).
  $MANUAL"
  PY=$("$UV" python find --system "$V") || die "uv installed Python $V but cannot find it"
  is_v "$PY" || die "uv's Python ($PY) is not $V"
fi
printf '%s\n' "$PY"
