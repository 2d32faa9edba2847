#!/usr/bin/env bash
# Re-resolve requirements/base.in (+ TensorFlow) into requirements/constraints.txt, the lock
# that scripts/setup.sh, environment.yml and binder/requirements.txt all install from.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3.11}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q -U pip setuptools wheel
"$TMP/venv/bin/pip" install -q -r "$ROOT/requirements/base.in" "tensorflow-cpu==2.15.1"
{
  echo "# The lock: exact versions of everything the course lab installs, resolved together for"
  echo "# Python 3.11 on Linux x86_64 (tensorflow-cpu 2.15.1, numpy 1.x). Used as a pip constraints"
  echo "# file (-c) by scripts/setup.sh, environment.yml and binder/requirements.txt."
  echo "# Regenerate with 'make lock'; do not edit by hand."
  "$TMP/venv/bin/pip" freeze --exclude-editable | grep -v '^lab_utils'
  echo "horovod==0.28.1"
  "$TMP/venv/bin/pip" list --format=freeze | grep -E '^(pip|setuptools|wheel)=='
} > "$ROOT/requirements/constraints.txt"
echo "wrote requirements/constraints.txt"
