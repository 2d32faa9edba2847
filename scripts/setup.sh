#!/usr/bin/env bash
# Create the stack's venv with the pinned stack and a Horovod built against it. Idempotent.
#
#   scripts/setup.sh            # CPU: Python 3.12, tensorflow-cpu==2.21.0 + tf-keras, in .venv
#   GPU=1 scripts/setup.sh      # tensorflow[and-cuda]==2.21.0 and Horovod with NCCL
#   PYTHON=/path/to/python3.12 scripts/setup.sh
#   STACK=2.15 scripts/setup.sh # the stack of classes begun on it: Python 3.11, TF 2.15.1, in .venv-2.15
#   (no Python of the stack's version on the machine: scripts/find-python.sh gets one with uv,
#   saying so; the stacks are named in scripts/stacks.sh)
#
# The environment counts as complete only when the stamp file is written, as the very
# last step, after Horovod imports and reports TensorFlow, MPI and Gloo. A failed or
# interrupted run removes the stamp first, so the next `make` redoes the work instead
# of trusting a half-built .venv.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/stacks.sh"
VENV=${VENV:-$ROOT/$STACK_VENV}
GPU=${GPU:-0}
STAMP=$VENV/.labs-setup-stamp
CONSTRAINTS=$ROOT/$STACK_LOCK
# The test tools, where this checkout has the tests (the public student repository has neither)
DEV=(); [ -f "$ROOT/requirements/dev.in" ] && DEV=("$ROOT/requirements/dev.in")
TESTS=0; [ -d "$ROOT/tests" ] && TESTS=1

die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*"; }

case "$GPU" in 0|1) ;; *) die "GPU must be 0 or 1, got GPU=$GPU" ;; esac

fingerprint() {
  { cat "$CONSTRAINTS" "$ROOT/requirements/base.in" "${DEV[@]}" "$ROOT/pyproject.toml" "$0" \
      "$ROOT/scripts/build-horovod.sh" "$ROOT/scripts/stack-keras.sh" "$ROOT/scripts/jupyterlab-overrides.json" \
      "$ROOT/slides/package-lock.json" "$ROOT/scripts/stacks.sh" ${HOROVOD_PATCH:+"$ROOT/$HOROVOD_PATCH"}
    echo "GPU=$GPU STACK=$STACK"; } | sha256sum | cut -d' ' -f1
}
WANT=$(fingerprint)

# Fast path: nothing changed since the last complete setup (no Python start-up, no imports).
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ] \
   && compgen -G "$VENV/lib/python$STACK_PYTHON/site-packages/horovod/tensorflow/mpi_lib*.so" >/dev/null; then
  say "environment up to date ($VENV)"
  exit 0
fi

[ -f "$CONSTRAINTS" ] || die "no lock for STACK=$STACK ($STACK_LOCK): make it with make lock STACK=$STACK"

# ---- Python 3.12 (3.11 for STACK=2.15) -----------------------------------------------
# On PATH, or from uv's managed Pythons when the system has none (scripts/find-python.sh)
is_stack_py() { "$1" -c "import sys; sys.exit(0 if sys.version_info[:2] == (${STACK_PYTHON%%.*}, ${STACK_PYTHON#*.}) else 1)" 2>/dev/null; }
PY=$(bash "$ROOT/scripts/find-python.sh") || exit 1
"$PY" -c 'import venv, ensurepip' 2>/dev/null || die "$PY lacks venv/ensurepip: install python$STACK_PYTHON-venv"
INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$INCLUDE/Python.h" ] || die "Python headers missing ($INCLUDE/Python.h), needed to build Horovod: install python$STACK_PYTHON-dev"

# ---- System tools Horovod and mpi4py build against ---------------------------------
need_apt=()
command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin libopenmpi-dev)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${need_apt[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
      || die "apt-get install ${need_apt[*]} failed"
  else
    die "missing: ${need_apt[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${need_apt[*]}),
  or use the conda path: conda env create -f environment.yml"
  fi
fi

# ---- A browser for the real-browser test (tests/browser; optional) -----------------------
if [ "$TESTS" = 1 ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing chromium (Debian's) for the browser test"
  { apt-get install -y -qq chromium >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; } \
    || say "chromium could not be installed: the browser test will be skipped (it says why)"
fi

# ---- sshd for the ssh-hosts test (tests/process/test_ssh_hosts.py; optional) ---------------
# The test runs private sshd's inside emulated hosts. policy-rc.d keeps the package from
# starting a machine-wide sshd on port 22 while it installs.
if [ "$TESTS" = 1 ] && ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing openssh-server (Debian's, not started) for the ssh-hosts test"
  policy=/usr/sbin/policy-rc.d; own_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null 2>&1 \
    || say "openssh-server could not be installed: the ssh-hosts test will be skipped (it says why)"
  if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi
fi

# ---- Slurm and munge for the Slurm tests (tests/process/test_slurm.py; optional) ----------
# The Slurm test runs a private slurmctld, slurmd's and munged inside emulated hosts: the
# packages only, not started (policy-rc.d, as for openssh-server).
if [ "$TESTS" = 1 ] && { [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/munged ]; } && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing slurm-wlm and munge (Debian's, not started) for the Slurm test"
  policy=/usr/sbin/policy-rc.d; own_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1; fi
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1; }; } \
    || say "slurm-wlm and munge could not be installed: the Slurm tests will be skipped (they say why)"
  if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi
fi

# ---- configurable-http-proxy for the JupyterHub test (tests/process/test_hub.py; optional) ---
# JupyterHub's proxy is a Node.js program from npm, installed into .tools/chp (no root needed).
CHP_VERSION=5.3.0
CHP=$ROOT/.tools/chp/node_modules/.bin/configurable-http-proxy
if [ "$TESTS" = 1 ] && [ ! -x "$CHP" ]; then
  if command -v npm >/dev/null 2>&1; then
    say "installing configurable-http-proxy $CHP_VERSION (npm) into .tools/chp for the JupyterHub test"
    npm install --silent --no-audit --no-fund --prefix "$ROOT/.tools/chp" "configurable-http-proxy@$CHP_VERSION" >/dev/null 2>&1 \
      || say "configurable-http-proxy could not be installed: the JupyterHub test will be skipped (it says why)"
  else
    say "no npm (Node.js): the JupyterHub test will be skipped (it says why)"
  fi
fi

# ---- reveal.js for the lecture decks (make slides; tests/notebooks/test_slides.py) ---------
# The decks load reveal.js, require.js and jQuery from these npm packages, never from a CDN.
# `make slides` installs them itself on first use (lab_utils/grading/slides.py); the tests never
# download, so a checkout with the tests gets them here.
SLIDES=$ROOT/.tools/slides
if [ "$TESTS" = 1 ] && ! cmp -s "$ROOT/slides/package-lock.json" "$SLIDES/installed.lock"; then
  if command -v npm >/dev/null 2>&1; then
    say "installing the lecture decks' reveal.js (npm, slides/package-lock.json) into .tools/slides"
    mkdir -p "$SLIDES" && rm -f "$SLIDES/installed.lock" \
      && cp "$ROOT/slides/package.json" "$ROOT/slides/package-lock.json" "$SLIDES/"
    # the marker last: a cut-short install is never taken for a whole one (lab_utils/grading/slides.py)
    (cd "$SLIDES" && npm ci --ignore-scripts --silent --no-audit --no-fund >/dev/null 2>&1) \
      && cp "$ROOT/slides/package-lock.json" "$SLIDES/installed.lock" \
      || say "reveal.js could not be installed: the slides test will be skipped (it says why)"
  else
    say "no npm (Node.js): the slides test will be skipped (it says why)"
  fi
fi

# ---- The virtual environment -------------------------------------------------------
rm -f "$STAMP"
if [ -x "$VENV/bin/python" ] && ! is_stack_py "$VENV/bin/python"; then
  say "$VENV is not Python $STACK_PYTHON (the $STACK stack's): recreating it. The default stack is 2.21 since 2026-12; a class that keeps TensorFlow 2.15 runs every make target with STACK=2.15 (in .venv-2.15)"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
export PATH="$VENV/bin:$PATH"   # the pinned cmake (<4) and the venv's tools come first
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -c "$CONSTRAINTS" pip setuptools wheel

if [ "$GPU" = 1 ]; then TF_REQ="tensorflow[and-cuda]==$TF_VERSION"; else TF_REQ="tensorflow-cpu==$TF_VERSION"; fi
say "installing $TF_REQ and the pinned stack ($STACK_LOCK)"
DEV_REQ=(); [ ${#DEV[@]} -eq 0 ] || DEV_REQ=(-r "${DEV[0]}")
"${PIP[@]}" install -q -c "$CONSTRAINTS" -r "$ROOT/requirements/base.in" "${DEV_REQ[@]}" "$TF_REQ"
# the stack's Keras in every process this venv's Python starts (tf-keras and TF_USE_LEGACY_KERAS=1 on 2.21)
STACK=$STACK STACK_CONSTRAINTS=$CONSTRAINTS bash "$ROOT/scripts/stack-keras.sh" "$VENV/bin/python"
"${PIP[@]}" install -q --no-deps -e "$ROOT"
# JupyterLab opens Markdown files rendered (the course map, labs/README.md), not in the editor
install -D -m 0644 "$ROOT/scripts/jupyterlab-overrides.json" "$VENV/share/jupyter/lab/settings/overrides.json"

# ---- Horovod, built against the TensorFlow just installed --------------------------
GPU=$GPU STACK=$STACK HOROVOD_BUILD_LOG=$VENV/horovod-build.log HOROVOD_CONSTRAINTS=$CONSTRAINTS \
  bash "$ROOT/scripts/build-horovod.sh" "$VENV/bin/python"

fingerprint >"$STAMP"
say "environment ready: $VENV (check it with: make doctor)"
