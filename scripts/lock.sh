#!/usr/bin/env bash
# Resolve requirements/base.in + dev.in (+ TensorFlow) into requirements/constraints.txt, the lock
# that scripts/setup.sh, environment.yml, binder/requirements.txt and deploy/ all install from.
#   make lock              keeps every version already locked and adds what base.in/dev.in gained
#                          (as pip-compile does without --upgrade); fails if a new package conflicts
#   make lock UPGRADE=1    re-resolves everything to the newest versions the .in files allow
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3.11}
LOCK=$ROOT/requirements/constraints.txt
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
KEEP=()
if [ "${UPGRADE:-0}" != 1 ] && [ -f "$LOCK" ]; then
  grep -v -E '^(horovod|pip|setuptools|wheel)==' "$LOCK" >"$TMP/keep.txt"   # pins to keep
  KEEP=(-c "$TMP/keep.txt")
fi
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q -U pip setuptools wheel
"$TMP/venv/bin/pip" install -q "${KEEP[@]}" -r "$ROOT/requirements/base.in" -r "$ROOT/requirements/dev.in" \
  "tensorflow-cpu==2.15.1"
{
  echo "# The lock: exact versions of everything the course lab installs (requirements/base.in and dev.in),"
  echo "# resolved together for Python 3.11 on Linux x86_64 (tensorflow-cpu 2.15.1, numpy 1.x). Used as a"
  echo "# pip constraints file (-c) by scripts/setup.sh, environment.yml, binder/requirements.txt and deploy/."
  echo "# Regenerate with 'make lock' (UPGRADE=1 to re-resolve everything); do not edit by hand."
  "$TMP/venv/bin/pip" freeze --exclude-editable | grep -v '^lab_utils'
  echo "horovod==0.28.1"
  "$TMP/venv/bin/pip" list --format=freeze | grep -E '^(pip|setuptools|wheel)=='
} >"$LOCK"
echo "wrote requirements/constraints.txt"
