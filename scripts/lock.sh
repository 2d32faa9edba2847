#!/usr/bin/env bash
# Resolve requirements/base.in + dev.in (+ the stack's TensorFlow) into the stack's lock, the one
# that scripts/setup.sh, environment.yml, binder/requirements.txt and deploy/ all install from:
# requirements/constraints.txt for STACK=2.15 (the default), constraints-next.txt for STACK=next
# (scripts/stacks.sh names both).
#   make lock              keeps every version already locked and adds what base.in/dev.in gained
#                          (as pip-compile does without --upgrade); fails if a new package conflicts
#   make lock UPGRADE=1    re-resolves everything to the newest versions the .in files allow
#   make lock STACK=next   the same for the next stack (Python 3.12, found as setup finds it)
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
  if [ "$STACK" = 2.15 ]; then
    echo "# resolved together for Python 3.11 on Linux x86_64 (tensorflow-cpu 2.15.1, numpy 1.x). Used as a"
    echo "# pip constraints file (-c) by scripts/setup.sh, environment.yml, binder/requirements.txt and deploy/."
    echo "# Regenerate with 'make lock' (UPGRADE=1 to re-resolve everything); do not edit by hand."
  else
    echo "# resolved together for Python $STACK_PYTHON on Linux x86_64 (tensorflow-cpu $TF_VERSION, tf-keras"
    echo "# $TF_KERAS_VERSION, numpy 1.x): the STACK=$STACK lock (scripts/stacks.sh), used by scripts/setup.sh."
    echo "# Regenerate with 'make lock STACK=$STACK' (UPGRADE=1 to re-resolve everything); do not edit by hand."
  fi
  "$TMP/venv/bin/pip" freeze --exclude-editable | grep -v -E '^(lab_utils|(pip|setuptools|wheel)==)'   # pip, setuptools, wheel: below
  echo "horovod==$HOROVOD_VERSION"
  "$TMP/venv/bin/pip" list --format=freeze | grep -E '^(pip|setuptools|wheel)=='
} >"$LOCK"
echo "wrote $STACK_LOCK"
