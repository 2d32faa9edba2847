#!/usr/bin/env bash
# Build horovod==0.28.1 against the TensorFlow already installed in the given Python's
# environment, with TensorFlow, Gloo and MPI (and NCCL when GPU=1), then verify it.
# Called by scripts/setup.sh (.venv), binder/postBuild and the conda path of the README:
#   bash scripts/build-horovod.sh "$(command -v python)"
# The stack (scripts/stacks.sh; STACK=2.15 for the other one) names the lock to install with
# (HOROVOD_CONSTRAINTS overrides it) and the patch to the release's source (2.21's). The sdist is
# patched and built into a wheel kept in ~/.cache/dl-labs/horovod/<key> (HOROVOD_WHEEL_CACHE), the
# key being the patch, Python's, TensorFlow's and MPI's versions and GPU: the next setup of the same
# stack installs that wheel instead of building again (pip's own cache holds only wheels of
# unmodified sources).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:?usage: build-horovod.sh PYTHON}
GPU=${GPU:-0}
LOG=${HOROVOD_BUILD_LOG:-$("$PY" -c 'import sys; print(sys.prefix)')/horovod-build.log}
. "$ROOT/scripts/stacks.sh"
CONSTRAINTS=${HOROVOD_CONSTRAINTS:-$ROOT/$STACK_LOCK}
PATCH=${HOROVOD_PATCH:+$ROOT/$HOROVOD_PATCH}
BIN=$(dirname "$PY")
die() { printf 'build-horovod: %s\n' "$*" >&2; exit 1; }

"$PY" -c 'import tensorflow' 2>/dev/null || die "TensorFlow is not installed for $PY: install it first (Horovod builds against it)"
export PATH="$BIN:$PATH"   # the environment's cmake (<4) and compilers wrappers come first
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
CACHE=()
if [ "$GPU" = 1 ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
  CACHE=(--no-cache-dir)   # never reuse a CPU-only wheel from pip's cache
  # NCCL from the nvidia-nccl-cu12 wheel that tensorflow[and-cuda] installs, where no NCCL is given
  # (HOROVOD_NCCL_HOME/_LIB): Horovod's FindNCCL.cmake looks for libnccl.so, the wheel ships only
  # libnccl.so.2, so a link to it is made in the environment (lib/horovod-nccl/)
  NCCL_WHEEL=$("$PY" -c 'import os, sysconfig as s; d = [os.path.join(s.get_paths()[k], "nvidia", "nccl") for k in ("platlib", "purelib")]; print(next((p for p in d if os.path.isfile(os.path.join(p, "include", "nccl.h"))), ""))')
  if [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-}" ] && [ -n "$NCCL_WHEEL" ] && [ -f "$NCCL_WHEEL/lib/libnccl.so.2" ]; then
    NCCL_LINKS=$("$PY" -c 'import sys; print(sys.prefix)')/lib/horovod-nccl
    mkdir -p "$NCCL_LINKS" && ln -sfn "$NCCL_WHEEL/lib/libnccl.so.2" "$NCCL_LINKS/libnccl.so"
    export HOROVOD_NCCL_INCLUDE=$NCCL_WHEEL/include HOROVOD_NCCL_LIB=$NCCL_LINKS HOROVOD_NCCL_LINK=SHARED
    echo "==> NCCL from the nvidia-nccl-cu12 wheel: $NCCL_WHEEL"
  fi
fi
FAILED="the Horovod build failed (full log: $LOG). Usual causes: no C++ compiler (install g++),
  no MPI headers (install libopenmpi-dev), or a TensorFlow other than the stack's installed
  (scripts/stacks.sh)."
PIP=("$PY" -m pip --disable-pip-version-check)

# The release's sdist with $PATCH applied, built into a wheel in the cache (once per key)
patched_wheel() {
  local key wheels tmp
  [ -f "$PATCH" ] || die "HOROVOD_PATCH=$PATCH: no such file"
  key=$({ cat "$PATCH"; "$PY" -c 'import sys, tensorflow as tf; print(sys.version, tf.__version__)' 2>/dev/null
          mpirun --version 2>/dev/null | head -n 1; echo "GPU=$GPU"; } | sha256sum | cut -c1-16)
  wheels=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-${HOME:?}/.cache}/dl-labs/horovod}/$key
  if ! compgen -G "$wheels/horovod-0.28.1-*.whl" >/dev/null; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    echo "==> building horovod==0.28.1 with $(basename "$PATCH") (about 9 minutes on 2 cores, once: the wheel is kept in $wheels; log: $LOG)" >&2
    { "${PIP[@]}" download --no-deps --no-binary :all: -d "$tmp" "horovod==0.28.1" \
        && tar xzf "$tmp"/horovod-0.28.1.tar.gz -C "$tmp" \
        && patch -d "$tmp/horovod-0.28.1" -p1 --forward <"$PATCH" \
        && "${PIP[@]}" wheel --no-deps --no-build-isolation -w "$tmp/wheel" "$tmp/horovod-0.28.1"; } >"$LOG" 2>&1 \
      || { tail -n 25 "$LOG" >&2; die "$FAILED"; }
    mkdir -p "$wheels" && mv "$tmp"/wheel/horovod-0.28.1-*.whl "$wheels/"
  fi
  compgen -G "$wheels/horovod-0.28.1-*.whl" | head -n 1
}

if ! "$PY" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  if [ -n "$PATCH" ]; then
    WHEEL=$(patched_wheel)
    echo "==> installing $WHEEL"
    "${PIP[@]}" install -q -c "$CONSTRAINTS" "$WHEEL" >>"$LOG" 2>&1 || { tail -n 25 "$LOG" >&2; die "$FAILED"; }
  else
    echo "==> building horovod==0.28.1 (about 4 minutes on 2 cores; pip caches the wheel; log: $LOG)"
    if ! "${PIP[@]}" install "${CACHE[@]}" --no-build-isolation -c "$CONSTRAINTS" "horovod==0.28.1" >"$LOG" 2>&1; then
      tail -n 25 "$LOG" >&2
      die "$FAILED"
    fi
  fi
fi
CHECK=$("$PY" -m horovod.runner.launch --check-build 2>&1) || { tail -n 5 <<<"$CHECK" >&2; die "horovodrun --check-build failed (above); see $LOG"; }
for want in "\[X\] TensorFlow" "\[X\] MPI" "\[X\] Gloo"; do
  grep -q "$want" <<<"$CHECK" || die "Horovod was built without ${want#*] }: see $LOG; uninstall it (pip uninstall horovod) and run this again"
done
echo "==> horovod OK: TensorFlow, MPI and Gloo"
