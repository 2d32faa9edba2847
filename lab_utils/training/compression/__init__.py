"""Communication-efficient all-reduce (Lab 6, Part A): fp16, 1-bit and top-k with error feedback.

- ``codecs`` (both sides, NumPy only): the codecs, their wire bytes and the student's
  functions they call;
- ``settings`` (both sides, no TensorFlow; ``task`` re-exports it): the command line
  and the student's ``compressors.py`` checked for a method;
- ``task`` (task side, under ``horovodrun``): training with a codec between the
  gradients and Horovod's all-reduce (``make_exchange``);
- ``runs`` (kernel side): one run per method, the summary table and plot.

The package's names are ``compression.codecs``'s.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "codecs")
