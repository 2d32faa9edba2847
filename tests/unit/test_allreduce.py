"""Lab 4's plumbing without processes: settings, data order, weights, the ring checker's
pieces, bandwidth and scaling tables, the Horovod timeline summary."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lab_utils.training import allreduce, tables
from lab_utils.training import runs as training_runs
from lab_utils.training.allreduce import ring_check as ring
from lab_utils.training.allreduce import runs as allreduce_runs


def _data(n=12):
    return SimpleNamespace(
        x_train=np.arange(n, dtype=np.float32).reshape(n, 1), y_train=np.arange(n), x_test=None, y_test=None
    )


# ----------------------------------------------------------------------------- settings


def test_parse_args_defaults_and_values():
    s = allreduce.parse_args(["--batch-size", "32", "--steps", "5", "--fp16", "--model", "cnn"])
    assert (s.batch_size, s.steps, s.fp16, s.model, s.strategy) == (32, 5, True, "cnn", "hvd")
    assert allreduce.parse_args([]).learning_rate == 0.5


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--steps", "-3"], "--steps must be >= 1"),
        (["--learning-rate", "0"], "--learning-rate must be > 0"),
        (["--emulate-ranks", "2"], "--emulate-ranks is for --strategy single"),
        (["--model", "resnet"], "invalid choice: 'resnet'"),
    ],
)
def test_check_args_turns_argparse_errors_into_value_errors(argv, match):
    with pytest.raises(ValueError, match=match):
        allreduce.check_args(argv)


# ----------------------------------------------------------------------------- data order


def test_global_batches_are_the_ranks_batches_side_by_side():
    data = _data(12)
    ranks = [allreduce.rank_batches(data, r, 3, 2, seed=5) for r in range(3)]
    big = allreduce.global_batches(data, 3, 2, seed=5)
    for _ in range(4):  # more than one pass over each 4-example shard
        parts = [next(s) for s in ranks]
        x, y = next(big)
        assert np.array_equal(y, np.concatenate([p[1] for p in parts]))
        assert np.array_equal(x, np.concatenate([p[0] for p in parts]))
    # rank r draws only from its own contiguous shard
    assert set(next(allreduce.rank_batches(data, 1, 3, 4, seed=0))[1]) == {4, 5, 6, 7}


def test_rank_batches_follow_lab3s_sync_worker_order():
    """Rank r's order is the one Lab 3's synchronous worker r draws (seed 1000 * seed + r)."""
    from lab_utils.training import loop

    data = _data(12)
    ours = allreduce.rank_batches(data, 1, 2, 3, seed=2)
    lab3 = loop.load_shard(2, 1, 3, data).batches(3, 2 * 1000 + 1)
    for _ in range(3):
        assert np.array_equal(next(ours)[1], next(lab3)[1])


# ----------------------------------------------------------------------------- weights


def test_weights_round_trip_and_differences(tmp_path):
    w = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    model = SimpleNamespace(weights=[SimpleNamespace(numpy=lambda a=a: a) for a in w])
    allreduce.save_weights(model, tmp_path / "w.npz")
    back = allreduce.load_weights_file(tmp_path / "w.npz")
    assert [a.shape for a in back] == [(3, 2), (2,)] and all(np.array_equal(a, b) for a, b in zip(w, back, strict=True))
    other = [w[0] + 1e-3, w[1]]
    d = allreduce.max_difference(w, other)
    assert d["max_abs"] == pytest.approx(1e-3, rel=1e-3) and d["max_rel"] == pytest.approx(1e-3, rel=1e-3)
    assert allreduce.max_difference(w, w) == {"max_abs": 0.0, "max_rel": 0.0}
    with pytest.raises(ValueError, match="different shapes"):
        allreduce.max_difference(w, [w[0]])
    table = allreduce_runs.weights_table({"a": w, "b": other})
    assert table.attrs["reference"] == "a" and table.loc["b", "max rel diff"] > 0 == table.loc["a", "max rel diff"]


# ----------------------------------------------------------------------------- ring checker pieces


def test_case_inputs_are_deterministic_and_differ_by_rank():
    a, b = ring.case_input(50, "float32", 0), ring.case_input(50, "float32", 1)
    assert a.dtype == np.float32 and not np.array_equal(a, b)
    assert np.array_equal(a, ring.case_input(50, "float32", 0))
    ints = ring.case_input(1000, "int32", 3)
    assert ints.dtype == np.int32 and np.abs(ints).max() < 1000


def test_counting_comm_counts_what_is_sent():
    sent = []
    fake = SimpleNamespace(Sendrecv=lambda buf, **kw: sent.append(buf), Get_rank=lambda: 4)
    comm = ring.CountingComm(fake)
    comm.Sendrecv(np.zeros(10, np.float64), dest=1, recvbuf=np.zeros(10), source=0)
    comm.Sendrecv([np.zeros(3, np.int32), "INT"], dest=1)
    assert (comm.bytes_sent, comm.messages, comm.Get_rank()) == (80 + 12, 2, 4)


def test_load_ring_explains_a_file_without_the_function(tmp_path):
    (tmp_path / "ring.py").write_text("def ring_allreduce(comm, x):\n    return x\n")
    assert ring.load_ring(tmp_path / "ring.py")(None, 3) == 3
    (tmp_path / "other.py").write_text("x = 1\n")
    with pytest.raises(ImportError, match="defines no function ring_allreduce"):
        ring.load_ring(tmp_path / "other.py")


def test_check_ring_needs_the_file_first(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the `%%writefile ring.py` cell first"):
        allreduce_runs.check_ring(tmp_path / "ring.py")


# ----------------------------------------------------------------------------- tables


def test_busbw_table_uses_the_given_byte_count():
    times = pd.DataFrame([{"bytes": 1000, "np": 2, "mpi_s": 1e-6, "ring_s": 2e-6, "memcpy_s": 5e-7}])
    t = allreduce_runs.busbw_table(times, lambda nbytes, n: nbytes * 2 * (n - 1) / n)
    row = t.loc[1000]
    assert row["MPI Allreduce (GB/s)"] == pytest.approx(1.0) and row["hand ring (GB/s)"] == pytest.approx(0.5)
    assert row["ring / MPI"] == pytest.approx(0.5) and row["memcpy (GB/s)"] == pytest.approx(2.0)


def _run(method, n, eps):
    return SimpleNamespace(method=method, size=n, examples_per_sec=eps)


def test_scaling_table_speedup_efficiency_and_oversubscription(monkeypatch):
    monkeypatch.setattr(tables, "usable_cores", lambda: 2)
    ps = [SimpleNamespace(method="PS (sync)", size=n, examples_per_sec=e) for n, e in ((1, 100.0), (2, 150.0))]
    t = allreduce_runs.scaling_table([_run("horovod (gloo)", 1, 100.0), _run("horovod (gloo)", 2, 180.0), *ps])
    hvd = t[t["method"] == "horovod (gloo)"].set_index("workers")
    assert hvd.loc[2, "speedup"] == pytest.approx(1.8) and hvd.loc[2, "efficiency"] == pytest.approx(0.9)
    assert not hvd["oversubscribed"].any()
    sync = t[t["method"] == "PS (sync)"].set_index("workers")
    assert list(sync["oversubscribed"]) == [False, True]  # 1 PS + 2 workers on 2 cores
    fig = allreduce_runs.plot_scaling(t)
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert any("oversubscribed" in label for label in labels) and "ideal (linear)" in labels


# ----------------------------------------------------------------------------- timeline


def _trace(path, unfinished=False):
    ev = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_a"}},
        {"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "grad_b"}},
    ]
    for step in range(3):  # step 0 is the warm-up: left out
        t = step * 10_000
        for pid, shift in ((1, 0), (2, 500)):  # two tensors negotiate at the same time
            ev += [
                {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t + shift, "pid": pid},
                {"ph": "E", "ts": t + 2000, "pid": pid},
                {"ph": "B", "name": "ALLREDUCE", "ts": t + 2000, "pid": pid},
                {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": t + 2100, "pid": pid},
                {"ph": "E", "ts": t + 2900, "pid": pid},
                {"ph": "E", "ts": t + 3000, "pid": pid},
            ]
    text = json.dumps(ev)
    path.write_text(text[:-1] + "," if unfinished else text)  # a running job leaves the array open
    return path


@pytest.mark.parametrize("unfinished", [False, True])
def test_timeline_summary_counts_parallel_tensors_once(tmp_path, unfinished):
    path = _trace(tmp_path / "timeline.json", unfinished)
    t = allreduce_runs.timeline_summary(path)
    assert t.loc["NEGOTIATE_ALLREDUCE", "seconds"] == pytest.approx(2 * 0.002)  # 2 steps after the warm-up
    assert t.loc["ALLREDUCE", "seconds"] == pytest.approx(2 * 0.001)
    assert t.loc["ALLREDUCE", "cycles"] == 2 and "GLOO_ALLREDUCE" not in t.index  # nested: inside ALLREDUCE
    run = allreduce_runs.TrainRun(
        "horovod (gloo)",
        2,
        {"rank:0": {"steps": 3, "warmup_steps": 1, "local_steps": 2, "train_time": 0.010, "accuracy": 0.9}},
        label="x",
        wall_time=1.0,
        timeline_path=str(path),
    )
    per_step = allreduce_runs.timeline_summary(run)
    assert per_step.loc["compute and the rest", "per step (ms)"] == pytest.approx(5.0 - 2.0 - 1.0)
    assert per_step["share of a step"].sum() == pytest.approx(1.0)


def test_timeline_summary_without_a_timeline(tmp_path):
    with pytest.raises(ValueError, match="timeline=True"):
        allreduce_runs.timeline_summary(tmp_path / "missing.json")


def test_horovod_is_traced_as_written_and_a_students_step_still_trains():
    """AutoGraph leaves Horovod's modules alone once TensorFlow is imported through lab_utils
    (about 6 s of CPU per rank saved) and keeps converting the student's code; a step with
    ``DistributedGradientTape`` (fp16 too) and ``grouped_allreduce`` traces and trains."""
    code = """
from tensorflow.python.autograph.core import config
from tensorflow.python.autograph.impl import conversion
import horovod.tensorflow as hvd
before = conversion.is_allowlisted(hvd.allreduce)
from lab_utils import models
tf = models.import_tensorflow()
models.trace_horovod_as_written()
def mine(): pass
rules = [r for r in config.CONVERSION_RULES if r.matches("horovod.tensorflow")]
print(before, conversion.is_allowlisted(hvd.allreduce), conversion.is_allowlisted(mine), len(rules))
hvd.init()
w = tf.Variable([1.0, -2.0])
for compression in (hvd.Compression.none, hvd.Compression.fp16):
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * x) if x.shape[0] else tf.constant(0.0)  # a branch AutoGraph converts
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        return tape.gradient(loss, [w])[0]
    print(step(tf.constant([3.0, 4.0])).numpy().tolist())
print(tf.function(lambda: hvd.grouped_allreduce([tf.ones(2)], op=hvd.Average))()[0].numpy().tolist())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    assert lines[0] == "False True False 1", out.stdout  # exempted once, and only Horovod
    assert lines[1:4] == ["[3.0, 4.0]", "[3.0, 4.0]", "[1.0, 1.0]"], out.stdout


@pytest.mark.parametrize(
    "run, where, job, key, kind",
    [
        (
            lambda a: allreduce_runs.run_hvd("train_hvd.py", 2, args=a),
            training_runs,
            "MPIJob",
            "memory_per_rank",
            "horovod",
        ),
        (lambda a: allreduce_runs.run_mwms(2, args=a), allreduce_runs, "TFCluster", "memory_per_task", "mwms"),
    ],
)
def test_alexnet_processes_are_counted_at_their_measured_memory(monkeypatch, tmp_path, run, where, job, key, kind):
    """The resource check counts an AlexNet rank at what one was measured to hold (a Horovod rank
    0.49 GB, an MWMS worker 0.71 GB at width 1.0), not at a small MNIST task's 288 MB."""
    monkeypatch.setenv("LABS_RUN_ROOT", str(tmp_path))
    seen = []

    class Stop(Exception):
        pass

    def capture(**kwargs):
        seen.append(kwargs[key])
        raise Stop

    monkeypatch.setattr(where, job, capture)
    for model in ("alexnet", "logreg"):
        with pytest.raises(Stop):
            run({"model": model, "steps": 2})
    assert seen == [allreduce_runs.ALEXNET_RANK_MEMORY_BYTES[kind], None]
    assert allreduce_runs.ALEXNET_RANK_MEMORY_BYTES[kind] > 480 * 2**20
