#!/usr/bin/env bash
# Give the Python's environment its stack's Keras (scripts/stacks.sh; STACK=2.15 for the other stack).
# Called by scripts/setup.sh, binder/postBuild, the student image and the conda path of the README:
#   bash scripts/stack-keras.sh "$(command -v python)"
# TensorFlow 2.16+ ship Keras 3, whose variables lack the `.ref()` Horovod's DistributedGradientTape
# calls (horovod#4290). On such a stack this installs tf-keras (Keras 2) at the locked version, and
# makes every process that environment's Python starts (the kernel, each task, each rank) set
# TF_USE_LEGACY_KERAS=1, by a .pth line. On 2.15 the same line unsets it (2.15 would look for
# tf-keras, which that stack has not): a process of one stack started from the other's runs right.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:?usage: stack-keras.sh PYTHON}
. "$ROOT/scripts/stacks.sh"
CONSTRAINTS=${STACK_CONSTRAINTS:-$ROOT/$STACK_LOCK}
if [ -n "$TF_KERAS_VERSION" ]; then
  # tf-keras's one requirement is the `tensorflow` wheel, which would land beside tensorflow-cpu
  # in the same package folder: it is installed without its dependencies, TensorFlow being there
  "$PY" -m pip --disable-pip-version-check install -q --no-deps -c "$CONSTRAINTS" "tf-keras==$TF_KERAS_VERSION"
fi
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$LEGACY_KERAS" = 1 ]; then
  echo 'import os; os.environ["TF_USE_LEGACY_KERAS"] = "1"  # the course lab: scripts/stacks.sh' >"$SITE/labs-keras.pth"
else
  echo 'import os; os.environ.pop("TF_USE_LEGACY_KERAS", None)  # the course lab: scripts/stacks.sh' >"$SITE/labs-keras.pth"
fi
"$PY" -c 'import os, sys; sys.exit(0 if os.environ.get("TF_USE_LEGACY_KERAS") == ("1" if '"$LEGACY_KERAS"' else None) else 1)' \
  || { echo "stack-keras: $SITE/labs-keras.pth is not read by $PY" >&2; exit 1; }
echo "==> Keras for the $STACK stack: $([ "$LEGACY_KERAS" = 1 ] && echo "tf-keras $TF_KERAS_VERSION, TF_USE_LEGACY_KERAS=1 in every process" || echo "TensorFlow's own")"
