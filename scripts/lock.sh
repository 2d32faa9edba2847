#!/usr/bin/env bash
# Resolve requirements/base.in + dev.in (+ the stack's TensorFlow) into the stack's lock, the one
# that scripts/setup.sh, environment.yml, binder/requirements.txt and deploy/ all install from:
# requirements/constraints.txt for STACK=2.21 (the default), constraints-2.15.txt for STACK=2.15
# (scripts/stacks.sh names both).
#   make lock              keeps every version already locked and adds what base.in/dev.in gained
#                          (as pip-compile does without --upgrade); fails if a new package conflicts
#   make lock UPGRADE=1    re-resolves everything to the newest versions the .in files allow
#   make lock STACK=2.15   the same for the other stack (Python 3.11, found as setup finds it)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/stacks.sh"
PY=$(bash "$ROOT/scripts/find-python.sh")
LOCK=$ROOT/$STACK_LOCK
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
KEEP=()
if [ "${UPGRADE:-0}" != 1 ] && [ -f "$LOCK" ]; then
  grep -v -E '^(horovod|pip|setuptools|wheel)==' "$LOCK" >"$TMP/keep.txt"   # pins to keep
  KEEP=(-c "$TMP/keep.txt")
fi
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q -U pip setuptools wheel
"$TMP/venv/bin/pip" install -q "${KEEP[@]}" -r "$ROOT/requirements/base.in" -r "$ROOT/requirements/dev.in" \
  "tensorflow-cpu==$TF_VERSION"
# tf-keras requires the `tensorflow` wheel, which would sit beside tensorflow-cpu: without its
# dependencies, as scripts/setup.sh installs it
[ -z "$TF_KERAS_VERSION" ] || "$TMP/venv/bin/pip" install -q --no-deps "tf-keras==$TF_KERAS_VERSION"
{
  echo "# The lock: exact versions of everything the course lab installs (requirements/base.in and dev.in),"
  KERAS=; [ -z "$TF_KERAS_VERSION" ] || KERAS=", tf-keras $TF_KERAS_VERSION"
  MAKE_LOCK="make lock"; [ "$STACK" = 2.21 ] || MAKE_LOCK="make lock STACK=$STACK"
  echo "# resolved together for Python $STACK_PYTHON on Linux x86_64 (tensorflow-cpu $TF_VERSION$KERAS, numpy 1.x): the"
  echo "# STACK=$STACK lock (scripts/stacks.sh), a pip constraints file (-c) for scripts/setup.sh (the default"
  echo "# stack's for environment.yml, binder/requirements.txt and deploy/ too)."
  echo "# Regenerate with '$MAKE_LOCK' (UPGRADE=1 to re-resolve everything); do not edit by hand."
  "$TMP/venv/bin/pip" freeze --exclude-editable | grep -v -E '^(lab_utils|(pip|setuptools|wheel)==)'   # pip, setuptools, wheel: below
  echo "horovod==$HOROVOD_VERSION"
  "$TMP/venv/bin/pip" list --format=freeze | grep -E '^(pip|setuptools|wheel)=='
} >"$LOCK"
echo "wrote $STACK_LOCK"
