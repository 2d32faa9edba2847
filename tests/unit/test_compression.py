"""Lab 6's gradient compression without processes, with the instructor's ``compressors.py``
(extracted from the instructor notebook, the one copy of the solution) as the student's
file: the top-k codec sends exactly k entries and, with error accumulation, loses
nothing; 1-bit with error feedback keeps its error bounded; the messages round-trip
through the byte layouts; a wrong student function is named at the first step; the bytes
on the wire; the settings and the notebook side's checks before anything launches; the
figure."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lab_utils.grading import reference_script
from lab_utils.training import compression
from lab_utils.training.compression import ErrorFeedback, OneBit, TopK, message_bytes, topk_decompress, wire_bytes
from lab_utils.training.compression import runs as compression_runs
from lab_utils.training.compression import task as compression_task

REFERENCE = reference_script("06_communication", "compressors.py")
STUDENT = compression_task.load_compressors(REFERENCE, "topk")
onebit, onebit_decompress, topk = STUDENT.onebit, STUDENT.onebit_decompress, STUDENT.topk
#: Lab 6's MLP, 784 -> 1024 -> 10: its tensors' sizes.
MLP = [784 * 1024, 1024, 1024 * 10, 10]


def gradients(steps: int, shape=(50, 40), seed: int = 0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(dtype) for _ in range(steps)]


# ----------------------------------------------------------------------------- top-k


def sent(codec: TopK, message: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices and values in one tensor's top-k message (int32 indices, then float32 values)."""
    k = codec.count(n)
    return message[: 4 * k].view("<i4"), message[4 * k :].view("<f4")


@pytest.mark.parametrize("ratio", [0.0005, 0.0035, 0.05, 0.9995, 1.0])
def test_topk_codec_sends_exactly_k_entries_of_largest_magnitude(ratio):
    g, error = (x.astype(np.float32) for x in gradients(2))
    codec = TopK(topk, ratio)
    k = codec.count(g.size)
    message, new_error = codec.encode(g, error)
    assert message.size == codec.message_bytes(g.size) == 8 * k
    idx, values = sent(codec, message, g.size)
    c = (g + error).ravel()
    assert idx.shape == values.shape == (k,) and new_error.shape == g.shape and new_error.dtype == np.float32
    assert np.all(np.diff(idx) > 0)  # ascending, no repeats
    np.testing.assert_array_equal(values, c[idx])
    kept = np.zeros(c.size, bool)
    kept[idx] = True
    if k < c.size:
        assert np.abs(c[kept]).min() >= np.abs(c[~kept]).max()
    np.testing.assert_array_equal(new_error.ravel()[kept], 0)
    np.testing.assert_array_equal(new_error.ravel()[~kept], c[~kept])
    np.testing.assert_array_equal(codec.decode(message, g.shape) + new_error, c.reshape(g.shape))


def test_topk_ties_keep_the_lower_indices_and_still_exactly_k():
    def indices(grad, k):
        grad = np.asarray(grad, np.float32)
        codec = TopK(topk, k / grad.size)
        assert codec.count(grad.size) == k
        return sent(codec, codec.encode(grad, np.zeros_like(grad))[0], grad.size)

    idx, values = indices([1.0, -3.0, 2.0, 3.0, -2.0, 2.0, 0.5], 4)  # 3 and -3, then the first two |2|s
    assert idx.tolist() == [1, 2, 3, 4]
    assert values.tolist() == [-3.0, 2.0, 3.0, -2.0]
    assert indices(np.ones((3, 4)), 5)[0].tolist() == [0, 1, 2, 3, 4]  # all equal: the first five
    assert indices(np.zeros(6), 2)[0].tolist() == [0, 1]


def test_topk_error_accumulation_loses_nothing():
    """Over many steps: everything sent plus the last residual is every gradient given."""
    grads = gradients(60, dtype=np.float32)
    fb = ErrorFeedback(TopK(topk, 37 / 2000), [grads[0].shape])
    total = np.zeros(grads[0].shape, np.float64)
    for g in grads:
        (decoded,) = fb.decode(fb.encode(g))
        assert np.count_nonzero(decoded) == 37
        total += decoded
    np.testing.assert_allclose(total + fb.residuals[0], np.sum(grads, axis=0, dtype=np.float64), atol=1e-4)
    assert fb.error_norm() < np.linalg.norm(np.sum(grads, axis=0)) + 60  # and nothing blew up


@pytest.mark.parametrize(
    ("student", "message"),
    [
        (lambda g, k, e: (np.arange(k), (g + e).ravel()[:k]), r"must return \(indices, values, new_error\)"),
        (lambda g, k, e: (np.arange(k - 1), (g + e).ravel()[: k - 1], e), "exactly k=2 positions"),
        (lambda g, k, e: (np.arange(k, dtype=float), (g + e).ravel()[:k], e), "integer array"),
        (lambda g, k, e: (np.array([0, 5]), (g + e).ravel()[:k], e), r"must lie in \[0, 5\)"),
        (lambda g, k, e: (np.array([-1, 0]), (g + e).ravel()[:k], e), r"must lie in \[0, 5\)"),
        (lambda g, k, e: (np.array([3, 3]), (g + e).ravel()[:k], e), "k=2 distinct positions, got 1"),
        (lambda g, k, e: (np.arange(k), (g + e).ravel(), e), "values as k=2 numbers"),
        (lambda g, k, e: (np.arange(k), (g + e).ravel()[:k], e[:1]), "new_error must have grad's shape"),
    ],
)
def test_a_wrong_student_topk_is_named_at_the_first_step(student, message):
    fb = ErrorFeedback(TopK(student, 0.4), [(5,)])
    with pytest.raises(ValueError, match=message):
        fb.encode(np.arange(5, dtype=np.float32))


def test_topk_decompress_places_values_and_checks_its_input():
    out = topk_decompress(np.array([0, 5]), np.array([1.5, -2.0], np.float32), (2, 3))
    assert out.dtype == np.float32 and out.shape == (2, 3)
    assert out.ravel().tolist() == [1.5, 0, 0, 0, 0, -2.0]
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 6\)"):
        topk_decompress(np.array([6]), np.array([1.0]), (2, 3))
    with pytest.raises(ValueError, match="one length"):
        topk_decompress(np.array([0, 1]), np.array([1.0]), 6)


def test_topk_count():
    assert compression.topk_count(1000, 0.01) == 10
    assert compression.topk_count(10, 0.01) == 1  # at least one
    assert compression.topk_count(10, 1.0) == 10
    for ratio in (0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match=r"ratio must be a fraction in \(0, 1\]"):
            compression.topk_count(10, ratio)


# ----------------------------------------------------------------------------- 1-bit


def test_onebit_reference_sends_signs_and_the_mean_magnitude():
    g = np.array([[0.5, -1.5], [0.0, 2.0]], np.float32)
    signs, scale, new_error = onebit(g, np.zeros_like(g))
    assert signs.dtype == bool and signs.tolist() == [[True, False], [True, True]]
    assert scale == pytest.approx(1.0) and np.asarray(scale).dtype == np.float32
    np.testing.assert_allclose(onebit_decompress(signs, scale), [[1, -1], [1, 1]])
    np.testing.assert_allclose(new_error, g - [[1, -1], [1, 1]])


def test_onebit_error_feedback_stays_bounded_and_loses_nothing():
    """2000 steps of random gradients: each step's error is no larger than what it came
    from, the error does not drift upwards, and sent + error = the gradients' sum."""
    grads = gradients(2000, shape=(300,), seed=2)
    error, sent, norms = np.zeros(300), np.zeros(300), []
    for g in grads:
        c = g + error
        signs, scale, error = onebit(g, error)
        sent += onebit_decompress(signs, scale)
        norms.append(np.linalg.norm(error))
        assert norms[-1] <= np.linalg.norm(c) + 1e-9
    grad_norm = np.mean([np.linalg.norm(g) for g in grads])
    assert max(norms) < 3 * grad_norm
    assert np.mean(norms[-200:]) < 1.5 * np.mean(norms[100:300])
    np.testing.assert_allclose(sent + error, np.sum(grads, axis=0), atol=1e-8)


# ----------------------------------------------------------------------------- messages


def test_a_onebit_message_is_packed_bits_and_a_scale_and_decodes_to_the_reference():
    shapes = [(5, 7), (3,), (1,)]
    grads = [g.astype(np.float32) for g in (gradients(1, s, seed=i)[0] for i, s in enumerate(shapes))]
    fb = ErrorFeedback(OneBit(onebit, onebit_decompress), shapes)
    assert fb.message_bytes == message_bytes("onebit", [35, 3, 1]) == (5 + 4) + (1 + 4) + (1 + 4)
    msg = fb.encode(*grads)
    assert msg.dtype == np.uint8 and msg.size == fb.message_bytes
    expected = [onebit_decompress(*onebit(g, np.zeros_like(g))[:2]) for g in grads]
    for got, want in zip(fb.decode(msg), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for got, g, want in zip(fb.residuals, grads, expected, strict=True):
        np.testing.assert_allclose(got, g - want, rtol=1e-6, atol=1e-7)


def test_decoding_several_ranks_messages_averages_them():
    shape = [(40,)]
    a, b = (np.asarray(x, np.float32) for x in gradients(2, (40,), seed=3))
    ra, rb = ErrorFeedback(TopK(topk, 0.1), shape), ErrorFeedback(TopK(topk, 0.1), shape)
    gathered = np.concatenate([ra.encode(a), rb.encode(b)])
    assert gathered.size == 2 * 8 * 4  # 4 entries of 40, 8 bytes each, two ranks
    (avg,) = ra.decode(gathered)
    want = sum(topk_decompress(*topk(x, 4, np.zeros_like(x))[:2], (40,)) for x in (a, b)) / 2
    np.testing.assert_allclose(avg, want, rtol=1e-6)
    np.testing.assert_array_equal(avg, rb.decode(gathered)[0])  # every rank decodes the same
    with pytest.raises(ValueError, match="not whole messages of 32 bytes"):
        ra.decode(gathered[:-1])


@pytest.mark.parametrize(
    ("student", "message"),
    [
        (lambda g, e: (np.sign(g + e), 1.0, e), "signs as a bool array"),
        (lambda g, e: (g >= 0, np.ones(2), e), "one finite scale"),
        (lambda g, e: (g >= 0, 1.0, e[:1]), "new_error must have grad's shape"),
        (lambda g, e: (g >= 0, 1.0), r"must return \(signs, scale, new_error\)"),
    ],
)
def test_a_wrong_student_onebit_is_named_at_the_first_step(student, message):
    fb = ErrorFeedback(OneBit(student, onebit_decompress), [(4,)])
    with pytest.raises(ValueError, match=message):
        fb.encode(np.ones(4, np.float32))


def test_error_feedback_checks_its_input():
    with pytest.raises(ValueError, match="codec must be a TopK or OneBit"):
        ErrorFeedback("topk", [(3,)])
    with pytest.raises(ValueError, match="non-empty"):
        ErrorFeedback(TopK(topk, 0.5), [])
    with pytest.raises(ValueError, match="takes 1 gradients"):
        ErrorFeedback(TopK(topk, 0.5), [(3,)]).encode(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="not finite"):
        ErrorFeedback(TopK(topk, 0.5), [(2,)]).encode(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="onebit needs two functions"):
        OneBit(onebit, None)
    with pytest.raises(ValueError, match=r"topk needs a function select\(grad, k, error\)"):
        TopK(0.5, topk)
    with pytest.raises(ValueError, match=r"ratio must be a fraction in \(0, 1\]"):
        TopK(topk, 0)


# ----------------------------------------------------------------------------- bytes


def test_wire_bytes_of_lab_6s_mlp():
    n = sum(MLP)
    assert n == 814_090
    assert wire_bytes("none", MLP) == wire_bytes("none", n) == 4 * n  # 2 ranks: 2 (N - 1) / N = 1
    assert wire_bytes("fp16", n) == 2 * n
    assert wire_bytes("onebit", MLP) == sum(-(-m // 8) + 4 for m in MLP) == 101_778
    k = sum(compression.topk_count(m, 0.01) for m in MLP)
    assert wire_bytes("topk", MLP, k) == 8 * k == 65_128
    assert wire_bytes("none", n) > wire_bytes("fp16", n) > wire_bytes("onebit", MLP) > wire_bytes("topk", MLP, k)


def test_wire_bytes_all_reduce_stays_flat_all_gather_grows_with_ranks():
    assert wire_bytes("none", 1000, ranks=1) == wire_bytes("onebit", 1000, ranks=1) == 0
    assert wire_bytes("none", 1000, ranks=4) == 6000  # 2 x 3/4 x 4000
    assert wire_bytes("fp16", 1000, ranks=8) == 3500
    assert wire_bytes("onebit", 1000, ranks=4) == 3 * 129
    assert wire_bytes("topk", 1000, 10, ranks=5) == 4 * 80


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("gzip", 10), {}, "method must be one of none, fp16, onebit, topk, got 'gzip'"),
        (("topk", 10), {}, "topk needs k"),
        (("topk", 10, 11), {}, "k must be at most the parameter count 10, got 11"),
        (("none", 0), {}, "n_params must be an integer >= 1, got 0"),
        (("none", []), {}, "no tensors"),
        (("none", "many"), {}, "each tensor's size must be an integer"),
        (("none", 10), {"ranks": 0}, "ranks must be an integer >= 1, got 0"),
    ],
)
def test_wire_bytes_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        wire_bytes(*args, **kwargs)


# ----------------------------------------------------------------------------- settings and the notebook side


def test_task_settings_are_checked_before_anything_starts():
    s = compression_task.check_args(["--method", "topk", "--ratio", "0.05", "--student", str(REFERENCE)])
    assert (s.method, s.ratio, s.hidden, s.student) == ("topk", 0.05, 1024, str(REFERENCE))
    with pytest.raises(ValueError, match=r"--method onebit needs --student FILE \(compressors.py\)"):
        compression_task.check_args(["--method", "onebit"])
    with pytest.raises(ValueError, match=r"--method topk needs --student FILE .*topk\(grad, k, error\)"):
        compression_task.check_args(["--method", "topk"])
    with pytest.raises(ValueError, match=r"--ratio must be in \(0, 1\]"):
        compression_task.check_args(["--ratio", "0"])
    with pytest.raises(ValueError, match="no such file"):
        compression_task.check_args(["--student", "/nonexistent/compressors.py"])


def test_load_compressors_names_what_is_missing(tmp_path):
    path = tmp_path / "compressors.py"
    path.write_text("def onebit(grad, error):\n    pass\n")
    with pytest.raises(ValueError, match=r"must define onebit\(grad, error\) and .*missing \['onebit_decompress'\]"):
        compression_task.load_compressors(path, "onebit")
    with pytest.raises(ValueError, match=r"must define topk\(grad, k, error\) for method 'topk'; missing \['topk'\]"):
        compression_task.load_compressors(path, "topk")
    with pytest.raises(ValueError, match="method 'fp16' uses no student functions"):
        compression_task.load_compressors(path, "fp16")
    assert compression_task.load_compressors(REFERENCE, "onebit").topk(np.ones(3), 1, np.zeros(3))[0].tolist() == [0]


@pytest.mark.parametrize(
    ("method", "kwargs", "message"),
    [
        ("zip", {}, "method must be one of none, fp16, onebit, topk, got 'zip'"),
        ("onebit", {}, "needs student="),
        ("topk", {}, r"'topk' needs student=: compressors.py, the file with your topk\(grad, k, error\)"),
        ("none", {"args": {"batch_size": 0}}, "--batch-size must be >= 1, got 0"),
        ("none", {"hosts": "emulated:n=2"}, "one emulated host per rank"),
    ],
)
def test_run_refuses_bad_input_before_launching(refuse_processes, method, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compression_runs.run_compression(method, 2, progress=False, **kwargs)


ONEBIT_FORGETS = """
import numpy as np

def onebit(grad, error):
    c = grad + error
    return c >= 0, np.abs(c).mean(), np.zeros_like(c)  # forgets what it did not send

def onebit_decompress(signs, scale):
    return np.where(signs, scale, -scale)
"""
TOPK_IGNORES_ERROR = """
import numpy as np

def topk(grad, k, error):
    flat = grad.ravel()  # error never added: what earlier steps did not send is lost
    idx = np.sort(np.argsort(-np.abs(flat), kind="stable")[:k])
    rest = flat.copy()
    rest[idx] = 0
    return idx, flat[idx], rest.reshape(grad.shape)
"""
TOPK_ONE_SHORT = """
import numpy as np

def topk(grad, k, error):
    c = (grad + error).ravel()
    idx = np.argsort(-np.abs(c))[: k - 1]
    return idx, c[idx], np.zeros_like(grad)
"""


@pytest.mark.parametrize("method", ["onebit", "topk"])
def test_check_student_passes_the_reference(method):
    compression_runs.check_student(REFERENCE, method)


@pytest.mark.parametrize(
    ("method", "source", "message"),
    [
        ("onebit", ONEBIT_FORGETS, r"step 1: onebit_decompress\(signs, scale\) \+ new_error differs"),
        ("topk", TOPK_IGNORES_ERROR, r"step 2: the values at the indices \+ new_error differs from grad \+ error"),
        ("topk", TOPK_ONE_SHORT, "exactly k=7 positions"),
        ("topk", ONEBIT_FORGETS, r"missing \['topk'\]"),
        ("none", ONEBIT_FORGETS, "method 'none' uses no student functions"),
    ],
)
def test_check_student_runs_two_steps_in_the_kernel_and_names_what_is_wrong(tmp_path, method, source, message):
    path = tmp_path / "compressors.py"
    path.write_text(source)
    with pytest.raises(ValueError, match=message):
        compression_runs.check_student(path, method)


def test_make_exchange_checks_before_importing_horovod():
    with pytest.raises(ValueError, match="method must be one of"):
        compression_task.make_exchange("gzip", [])
    for method in ("onebit", "topk"):
        with pytest.raises(ValueError, match=f"'{method}' needs student="):
            compression_task.make_exchange(method, [])
    with pytest.raises(ValueError, match=r"missing \['topk'\]"):
        compression_task.make_exchange("topk", [], student=SimpleNamespace(onebit=onebit))
    codec = compression.make_codec("topk", STUDENT, ratio=0.25)
    assert isinstance(codec, TopK) and codec.select is topk and codec.count(8) == 2
    assert repr(codec) == "TopK(topk, ratio=0.25)"


def fake_run(method: str, bytes_per_step: int, seconds_per_step: float) -> compression_runs.CompressionRun:
    steps = [10, 20, 30]
    events = pd.DataFrame(
        [
            {"task": task, "step": s, "train_s": s * seconds_per_step, "bytes_sent": s * bytes_per_step}
            | ({"accuracy": 0.5 + s / 100} if task == "rank:0" else {})
            for s in steps
            for task in ("rank:0", "rank:1")
        ]
    )
    result = {"accuracy": 0.8, "steps": 30, "local_steps": 30, "train_time": 30 * seconds_per_step}
    result["bytes_per_step"] = bytes_per_step
    result |= {"batch_size": 60, "examples": 1800}
    return compression_runs.CompressionRun(
        label=method,
        method="horovod (mpi)",
        ranks=2,
        results={"rank:0": result, "rank:1": result},
        events=events,
        wall_time=5.0,
        compression=method,
    )


def test_curve_summary_and_plot_of_runs():
    import matplotlib

    matplotlib.use("Agg")
    runs = [fake_run("none", 3_256_360, 0.4), fake_run("topk", 65_128, 0.03)]
    curve = runs[1].curve()
    assert list(curve.columns) == ["step", "train_s", "bytes_sent", "accuracy"] and len(curve) == 3
    assert curve["bytes_sent"].tolist() == [651_280, 1_302_560, 1_953_840]
    table = compression_runs.summary(runs)
    assert (
        table.loc["none", "ms/step"] == pytest.approx(400) and table.loc["topk", "bytes/step (sent per rank)"] == 65_128
    )
    assert "30.0 ms/step" in repr(runs[1])
    fig = compression_runs.plot(runs)
    assert [ax.get_xlabel() for ax in fig.axes] == ["training step", "seconds of training", "MB sent per rank"]
    assert all(len(ax.lines) == 2 for ax in fig.axes)
    with pytest.raises(ValueError, match="at least one run"):
        compression_runs.plot([])
