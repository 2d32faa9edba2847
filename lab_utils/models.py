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

Lab 5 (``labs/05_alexnet``) adds :func:`alexnet`, a Keras model in eager mode (its
towers, MirroredStrategy and Horovod runs build it in their own processes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings

__all__ = [
    "import_tensorflow",
    "trace_horovod_as_written",
    "tensorflow_version",
    "logistic_regression",
    "cross_entropy",
    "accuracy",
    "ALEXNET_VARIANTS",
    "ALEXNET_224_PARAMS",
    "alexnet",
]


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
    from lab_utils import resources

    os.environ.update(resources.allocator_env())  # TensorFlow's own allocator, as in every task
    with native_stderr_without(TF_IMPORT_NOISE):
        import tensorflow as tf  # noqa: WPS433 (import inside: keep `import lab_utils` cheap)

    tf.get_logger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # absl ships with TensorFlow; tolerate a stripped install
        pass
    trace_horovod_as_written()
    return tf


#: what TensorFlow 2.16+ writes to stderr at import whatever TF_CPP_MIN_LOG_LEVEL says (its absl
#: logging is not initialized yet: tensorflow/tensorflow#102212): the oneDNN notice, twice, each
#: after absl's own warning. TF 2.15 honours the level and writes none of it.
TF_IMPORT_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|port\.cc:\d+\] oneDNN custom operations are on"
)


@contextlib.contextmanager
def native_stderr_without(noise: re.Pattern):
    """While the block runs, what is written to file descriptor 2 (by C++ as well as Python)
    goes to a file; afterwards every line of it that ``noise`` does not match is written to
    stderr. A notebook shows a kernel's fd 2, and nbgrader scores a test cell 0 for any stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(True) if not noise.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def trace_horovod_as_written() -> None:
    """Let ``tf.function`` trace Horovod's functions as they are written, without converting
    them with AutoGraph first, as TensorFlow already does for its own and Keras's code.

    AutoGraph rewrites every Python function a ``tf.function`` calls, unless a rule in its
    conversion list exempts the module. Horovod is not exempt, so the first call of a
    training step that uses ``hvd.DistributedGradientTape`` or ``hvd.allreduce`` parsed and
    rewrote Horovod's own source: about 6 s of CPU on every rank of every job, against 0.2 s
    of training for a Lab 4 run of 100 steps (one rank, this course's 2-core machine: 13.9 s
    in all before, 7.6 s after, the same loss to the last digit). Horovod's TensorFlow code is
    graph code already: its branches on tensors are explicit ``tf.cond``s, and it ran under
    TensorFlow 1's graphs, which never had AutoGraph. A student's own functions are still
    converted. Idempotent; called by :func:`import_tensorflow` and by the training loops
    that run a student's Horovod step (TensorFlow 2.15's rule list is read at each
    conversion, so this works at any time before the step is first traced)."""
    from tensorflow.python.autograph.core import config as autograph_config

    rules = tuple(autograph_config.CONVERSION_RULES)
    if not any(isinstance(r, autograph_config.DoNotConvert) and r.matches("horovod") for r in rules):
        autograph_config.CONVERSION_RULES = (autograph_config.DoNotConvert("horovod"), *rules)


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


# ----------------------------------------------------------------------------- Lab 5: AlexNet

#: Input shape and default classes of each AlexNet variant.
ALEXNET_VARIANTS = {"cifar": ((32, 32, 3), 10), "224": ((224, 224, 3), 1000)}
#: Parameters of :func:`alexnet` ``("224")`` with 1000 classes: the one-tower AlexNet of
#: Krizhevsky (2014, "One weird trick"), as in torchvision; the 2012 paper says "60 million".
ALEXNET_224_PARAMS = 61_100_840


def _alexnet_layers(variant: str, width: float, num_classes: int, dropout: float, seed: int) -> list:
    import tensorflow as tf

    layers = tf.keras.layers
    init = tf.keras.initializers

    def ch(n: int) -> int:
        return max(4, round(n * width))

    def conv(n, k, name, **kw):
        return layers.Conv2D(ch(n), k, activation="relu", kernel_initializer=init.GlorotUniform(seed), name=name, **kw)

    def dense(n, name, act="relu"):
        return layers.Dense(n, activation=act, kernel_initializer=init.GlorotUniform(seed), name=name)

    if variant == "224":  # 224 -> 55 -> 27 -> 13 -> 6: 256 x 6 x 6 features, like the paper
        head = [layers.ZeroPadding2D(2), conv(64, 11, "conv1", strides=4), layers.MaxPool2D(3, 2)]
        head += [conv(192, 5, "conv2", padding="same"), layers.MaxPool2D(3, 2)]
        pool, hidden = layers.MaxPool2D(3, 2), ch(4096)
    else:  # 32 -> 16 -> 8 -> 4: the same five convolutions, 3x3 kernels, 2x2 pooling
        head = [conv(64, 3, "conv1", padding="same"), layers.MaxPool2D(2)]
        head += [conv(192, 3, "conv2", padding="same"), layers.MaxPool2D(2)]
        pool, hidden = layers.MaxPool2D(2), ch(1024)
    body = [conv(384, 3, "conv3", padding="same"), conv(256, 3, "conv4", padding="same")]
    body += [conv(256, 3, "conv5", padding="same"), pool, layers.Flatten()]
    tail = [layers.Dropout(dropout, seed=seed), dense(hidden, "fc6"), layers.Dropout(dropout, seed=seed)]
    tail += [dense(hidden, "fc7"), dense(num_classes, "fc8", act=None)]
    # Inputs in [0, 1] centred to about zero mean and unit spread: without it (and without batch
    # normalisation, which AlexNet predates) plain SGD sits on a plateau for hundreds of steps.
    centre = [layers.Rescaling(4.0, offset=-2.0, name="centre")]
    # Logits in float32 even under a mixed-precision policy (the loss and softmax need the range).
    return centre + head + body + tail + [layers.Activation("linear", dtype="float32", name="logits")]


def alexnet(
    variant: str = "cifar", *, num_classes: int | None = None, width: float = 1.0, dropout: float = 0.5, seed: int = 0
):
    """AlexNet (Krizhevsky, Sutskever and Hinton, 2012) as a built Keras ``Sequential``.

    ``variant="224"``: the ImageNet network for real GPUs, 224x224x3 inputs, five
    convolutions (64, 192, 384, 256, 256 filters; 11x11 stride 4, 5x5, 3x3), three
    max-pools, two fully-connected layers of 4096 and the classifier: with 1000
    classes, :data:`ALEXNET_224_PARAMS` (61.1 M) parameters, 94 % of them in the
    fully-connected layers. ``variant="cifar"``: the same layers for 32x32x3 images
    (3x3 kernels, 2x2 pools, 1024-wide fully-connected layers; 7.5 M parameters with
    10 classes), what a laptop can train. Both drop the 2012 paper's local response
    normalisation (later work found it unnecessary) and its split over two GPUs.

    ``width`` scales every layer's filters and units (``0.25``: 1/16 of the compute,
    for CI); ``dropout`` before the two hidden fully-connected layers (0 for runs
    whose weights are compared); ``seed`` draws the initial weights."""
    import tensorflow as tf

    if variant not in ALEXNET_VARIANTS:
        raise ValueError(f"unknown AlexNet variant {variant!r}; choose one of {sorted(ALEXNET_VARIANTS)}")
    if not 0 < width <= 4:
        raise ValueError(f"width must be in (0, 4], got {width}")
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    shape, default_classes = ALEXNET_VARIANTS[variant]
    num_classes = default_classes if num_classes is None else int(num_classes)
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    model = tf.keras.Sequential(_alexnet_layers(variant, width, num_classes, dropout, seed), name=f"alexnet_{variant}")
    model.build((None, *shape))
    return model
