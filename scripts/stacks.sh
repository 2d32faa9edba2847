# The course's software stacks, by name (issue 56). Sourced by scripts/setup.sh, lock.sh and
# find-python.sh; `make ... STACK=next` chooses one (default: 2.15).
#
#   2.15   Python 3.11, TensorFlow 2.15.1, Keras 2 inside TensorFlow      .venv       constraints.txt
#   next   Python 3.12, TensorFlow 2.21.0 with tf-keras 2.21.0 (Keras 2)  .venv-next  constraints-next.txt
#
# Both build Horovod 0.28.1 (its last release) from source with Gloo and MPI; `next` applies
# scripts/horovod-next/tf2.21.patch first. TF 2.16+ ship Keras 3, whose variables lack the `.ref()`
# Horovod's DistributedGradientTape calls (horovod#4290): on `next`, every process the venv's Python
# starts (the kernel, each task, each rank) sets TF_USE_LEGACY_KERAS=1, by a .pth line setup writes
# (on 2.15, the same line unsets it: a process of one stack started from the other's runs right).
# numpy stays 1.x and pandas 2.x on both (requirements/base.in), so that no number a student sees
# changes with the stack.
STACK=${STACK:-2.15}
HOROVOD_VERSION=0.28.1
case "$STACK" in
  2.15)
    STACK_PYTHON=3.11 TF_VERSION=2.15.1 TF_KERAS_VERSION= LEGACY_KERAS=0
    STACK_VENV=.venv STACK_LOCK=requirements/constraints.txt HOROVOD_PATCH= ;;
  next)
    STACK_PYTHON=3.12 TF_VERSION=2.21.0 TF_KERAS_VERSION=2.21.0 LEGACY_KERAS=1
    STACK_VENV=.venv-next STACK_LOCK=requirements/constraints-next.txt HOROVOD_PATCH=scripts/horovod-next/tf2.21.patch ;;
  *)
    printf 'STACK=%s: no such stack; choose STACK=2.15 (the default: Python 3.11, TensorFlow 2.15.1) or STACK=next (Python 3.12, TensorFlow 2.21.0)\n' "$STACK" >&2
    exit 2 ;;
esac
