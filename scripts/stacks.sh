# The course's software stacks, by name (issue 56). Sourced by scripts/setup.sh, lock.sh and
# find-python.sh; `make ... STACK=2.15` chooses the other one (default: 2.21).
#
#   2.21   Python 3.12, TensorFlow 2.21.0 with tf-keras 2.21.0 (Keras 2)  .venv        constraints.txt
#   2.15   Python 3.11, TensorFlow 2.15.1, Keras 2 inside TensorFlow      .venv-2.15   constraints-2.15.txt
#
# 2.21 is the default since 2026-12 (Python 3.11 ends in 2027-10; Ubuntu 24.04 ships 3.12). 2.15 is
# kept for one term, for classes that began on it; it goes in 2027-07.
# Both build Horovod 0.28.1 (its last release) from source with Gloo and MPI; 2.21 applies
# scripts/horovod-patches/tf2.21.patch first. TF 2.16+ ship Keras 3, whose variables lack the `.ref()`
# Horovod's DistributedGradientTape calls (horovod#4290): on 2.21, every process the venv's Python
# starts (the kernel, each task, each rank) sets TF_USE_LEGACY_KERAS=1, by a .pth line setup writes
# (on 2.15, the same line unsets it: a process of one stack started from the other's runs right).
# numpy stays 1.x and pandas 2.x on both (requirements/base.in), so that no number a student sees
# changes with the stack.
STACK=${STACK:-2.21}
HOROVOD_VERSION=0.28.1
case "$STACK" in
  2.21)
    STACK_PYTHON=3.12 TF_VERSION=2.21.0 TF_KERAS_VERSION=2.21.0 LEGACY_KERAS=1
    STACK_VENV=.venv STACK_LOCK=requirements/constraints.txt HOROVOD_PATCH=scripts/horovod-patches/tf2.21.patch ;;
  2.15)
    STACK_PYTHON=3.11 TF_VERSION=2.15.1 TF_KERAS_VERSION= LEGACY_KERAS=0
    STACK_VENV=.venv-2.15 STACK_LOCK=requirements/constraints-2.15.txt HOROVOD_PATCH= ;;
  *)
    printf 'STACK=%s: no such stack; choose STACK=2.21 (the default: Python 3.12, TensorFlow 2.21.0) or STACK=2.15 (Python 3.11, TensorFlow 2.15.1, for classes that began on it)\n' "$STACK" >&2
    exit 2 ;;
esac
