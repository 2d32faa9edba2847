"""Reference models for the labs, in ``tf.compat.v1`` graph mode.

Lab 1 (``labs/01_single_node``) has students write ``logistic_regression`` and
``cross_entropy`` themselves; the reference versions here are what the Lab 2-3
training scripts (``train_*.py``, run in their own processes) import, and what
Lab 1's hidden tests compare against. Build them inside a graph::

    tf = import_tensorflow()
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 784])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        logits = logistic_regression(x)
        loss = cross_entropy(logits, y)

Nothing here calls ``disable_eager_execution()``: graphs are built under
``tf.Graph().as_default()``, so a notebook kernel keeps its default eager mode.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["import_tensorflow", "tensorflow_version", "logistic_regression", "cross_entropy", "accuracy"]


def tensorflow_version() -> str:
    """The installed TensorFlow's version, read from the package metadata without
    importing it (a kernel that only launches clusters need not load TensorFlow)."""
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise ModuleNotFoundError("TensorFlow is not installed in this environment (run `make setup`)")


def import_tensorflow():
    """Import TensorFlow with its C++ and Python logging quieted, and return it.

    nbgrader scores a test cell 0 when anything reaches stderr, and TensorFlow
    logs to stderr at import and at session start. Sets ``TF_CPP_MIN_LOG_LEVEL=2``
    unless already set (it must be set before the first import), and puts the
    ``tensorflow`` and ``absl`` Python loggers at ERROR. Call it from the
    notebook (this is an explicit, documented change to the kernel's logging).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: WPS433 (import inside: keep `import lab_utils` cheap)

    tf.get_logger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # absl ships with TensorFlow; tolerate a stripped install
        pass
    return tf


def logistic_regression(x, num_classes: int = 10, scope: str = "logreg"):
    """Logits of multinomial logistic regression (softmax regression): one dense
    layer whose kernel and bias start at zero, as in the CS 744 assignment.

    TensorFlow's own layer (Lab 1 has students write the same model by hand): its
    variables are made with ``get_variable`` under ``scope``, so that
    ``replica_device_setter`` (Lab 2) places them on the parameter server.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    zeros = v1.zeros_initializer()
    with v1.variable_scope(scope, reuse=v1.AUTO_REUSE), warnings.catch_warnings():
        # The TF1 layer is what these graph-mode labs teach; its deprecation notice would reach stderr.
        warnings.filterwarnings("ignore", message=r"`tf.layers.dense` is deprecated", category=UserWarning)
        return v1.layers.dense(x, num_classes, kernel_initializer=zeros, bias_initializer=zeros, name="softmax")


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy of ``logits`` (N, C) against int class
    ``labels`` (N,): TensorFlow's fused op, stable for large logits (it never
    takes ``log(softmax)``, which gives ``-inf`` when a probability underflows)."""
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def accuracy(logits, labels):
    """Fraction of rows whose arg-max logit equals the int label."""
    import tensorflow as tf

    correct = tf.equal(tf.argmax(logits, axis=1), tf.cast(labels, tf.int64))
    return tf.reduce_mean(tf.cast(correct, tf.float32))
