#!/usr/bin/env bash
# Build horovod==0.28.1 against the TensorFlow already installed in the given Python's
# environment, with TensorFlow, Gloo and MPI (and NCCL when GPU=1), then verify it.
# Called by scripts/setup.sh (.venv), binder/postBuild and the conda path of the README:
#   bash scripts/build-horovod.sh "$(command -v python)"
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:?usage: build-horovod.sh PYTHON}
GPU=${GPU:-0}
LOG=${HOROVOD_BUILD_LOG:-$("$PY" -c 'import sys; print(sys.prefix)')/horovod-build.log}
BIN=$(dirname "$PY")
die() { printf 'build-horovod: %s\n' "$*" >&2; exit 1; }

"$PY" -c 'import tensorflow' 2>/dev/null || die "TensorFlow is not installed for $PY: install it first (Horovod builds against it)"
export PATH="$BIN:$PATH"   # the environment's cmake (<4) and compilers wrappers come first
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
CACHE=()
if [ "$GPU" = 1 ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
  CACHE=(--no-cache-dir)   # never reuse a CPU-only wheel from pip's cache
fi
if ! "$PY" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  echo "==> building horovod==0.28.1 (about 4 minutes on 2 cores; pip caches the wheel; log: $LOG)"
  if ! "$PY" -m pip install --disable-pip-version-check "${CACHE[@]}" --no-build-isolation \
       -c "$ROOT/requirements/constraints.txt" "horovod==0.28.1" >"$LOG" 2>&1; then
    tail -n 25 "$LOG" >&2
    die "the Horovod build failed (full log: $LOG). Usual causes: no C++ compiler (install g++),
  no MPI headers (install libopenmpi-dev), or a TensorFlow other than 2.15.1 installed."
  fi
fi
CHECK=$("$PY" -m horovod.runner.launch --check-build 2>/dev/null) || die "horovodrun --check-build failed; see $LOG"
for want in "\[X\] TensorFlow" "\[X\] MPI" "\[X\] Gloo"; do
  grep -q "$want" <<<"$CHECK" || die "Horovod was built without ${want#*] }: see $LOG; uninstall it (pip uninstall horovod) and run this again"
done
echo "==> horovod OK: TensorFlow, MPI and Gloo"
