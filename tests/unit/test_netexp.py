"""netexp's arguments are checked by its task's own parser before anything launches
(Labs 4 and 6 pass NETWORK_SIZE / SCALING_SIZE through to ``mb`` and ``compute_s``), and
its model steps (Lab 4's model sizes) are the thesis's models, scaled as the lab says."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lab_utils.training import runs as training_runs
from lab_utils.training.netexp import runs as netexp
from lab_utils.training.netexp import task as netexp_task
from lab_utils.training.runs import RanksRun


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="tree", workers=2), "mode must be one of"),
        (dict(mode="ps", workers=2, mb=0), "need --mb > 0"),
        (dict(mode="ps", workers=2, mb=float("nan")), "need --mb > 0"),
        (dict(mode="allreduce", workers=2, compute_s=-0.25), "--compute-s >= 0"),
        (dict(mode="allreduce", workers=2, steps=0), "--steps >= 1"),
    ],
)
def test_run_refuses_bad_sizes_before_launching(kwargs, match, monkeypatch):
    monkeypatch.setattr(training_runs, "MPIJob", None)  # nothing may launch
    with pytest.raises(ValueError, match=match):
        netexp.run_netexp(hosts="local", **kwargs)


def test_the_task_parses_without_mpi():
    a = netexp_task.check_args(["--mode", "ps", "--mb", "0.75", "--compute-s", "0.25"])
    assert (a.mode, a.mb, a.compute_s, a.steps) == ("ps", 0.75, 0.25, 5)
    # a notebook's kernel imports the task to check arguments: that must not start MPI in it
    code = "import sys; from lab_utils.training import netexp; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out


# ---------------------------------------------------------------------- model size as the variable
def test_the_models_are_the_thesis_s_table_3_1():
    table = {n: (m.mb, m.gflops) for n, m in netexp.MODELS.items()}
    assert table == {
        "AlexNet": (233, 0.7),
        "VGG16": (528, 15.5),
        "VGG19": (548, 19.6),
        "ResNet50": (98, 3.9),
        "ResNet152": (230, 11.3),
    }


def test_a_model_step_shrinks_its_bytes_over_bandwidth_and_its_compute_together():
    alex = netexp.model_step("AlexNet", "100mbit", 1.0)  # 10 Gbit/s and 1 TFLOP/s by default
    assert alex["compute_s"] == pytest.approx(32 * 3 * 0.7 / 1000)  # 67 ms for 32 images, forward + backward
    assert alex["mb"] == pytest.approx(2.33)  # 1/100 of 233 MB: as long on 100 Mbit/s as all of it on 10 Gbit/s
    assert alex["real_send_s"] == pytest.approx(233 * 8e6 / 10e9)
    for name in ("AlexNet", "ResNet50", "VGG16"):
        for link, scale in (("100mbit", 1.0), ("100mbit", 0.25), ("1gbit", 0.5)):
            step = netexp.model_step(name, link, scale)
            on_link = step["mb"] * 8e6 / (1e8 if link == "100mbit" else 1e9)
            assert on_link / step["compute_s"] == pytest.approx(step["ratio"])  # the model's ratio, at any scale
            assert step["compute_s"] == pytest.approx(scale * step["real_compute_s"])
    ratio = {n: netexp.model_step(n)["ratio"] for n in ("AlexNet", "ResNet50", "VGG16")}
    assert ratio["AlexNet"] > 1 > ratio["VGG16"] > ratio["ResNet50"]  # AlexNet is the communication-bound one
    assert netexp.model_step("AlexNet", reference_link="100gbit")["ratio"] == pytest.approx(ratio["AlexNet"] / 10)
    with pytest.raises(ValueError, match="unknown model 'LeNet'; known: AlexNet, VGG16"):
        netexp.model_step("LeNet")
    with pytest.raises(ValueError, match="scale and tflops must be > 0"):
        netexp.model_step("AlexNet", scale=0)


def test_the_prediction_is_the_notebook_s_arithmetic():
    free = netexp.predicted(0.0, 4)
    assert free == {"PS speedup": 4.0, "ring speedup": 4.0, "ring / PS examples/s": 1.0}
    p = netexp.predicted(0.24, 4)  # Part D's 3 MB step: 1 s + 4 x 0.48 s through the PS, 1 s + 0.36 s around the ring
    assert p["PS speedup"] == pytest.approx(4 * 1.48 / 2.92) and p["ring speedup"] == pytest.approx(4 / 1.36)
    assert p["ring / PS examples/s"] == pytest.approx(2.92 / 1.36)
    ring_over_ps = [netexp.predicted(r, 4)["ring / PS examples/s"] for r in (0.1, 0.3, 1, 3, 30)]
    assert ring_over_ps == sorted(ring_over_ps) and ring_over_ps[-1] < 16 / 3  # towards N^2 / (N - 1)


def _fake_runs(monkeypatch, seen):
    def fake(mode, w, hosts=None, mb=None, compute_s=None, steps=None):
        seen.append((mode, w, round(mb, 6), round(compute_s, 6)))
        step = compute_s + (2 * w if mode == "ps" else 2 * (w - 1) / w) * mb * 8e6 / 1e8
        row = {"mode": mode, "workers": w, "examples_per_s": 64 * w / step, "step_s": step, "network": "fake"}
        return RanksRun(label=mode, row=row)

    monkeypatch.setattr(netexp, "run_netexp", fake)


def test_models_runs_each_model_s_step_at_the_fewest_and_most_workers(monkeypatch, capsys):
    from lab_utils.cluster import netem

    monkeypatch.setattr(netem, "unavailable_reason", lambda: None)
    seen = []
    _fake_runs(monkeypatch, seen)
    table = netexp.models(["AlexNet", "ResNet50"], workers=[1, 2, 4], scale=0.25, steps=2)
    alex = netexp.model_step("AlexNet", "100mbit", 0.25)
    assert seen[:4] == [
        (mode, w, round(alex["mb"], 6), round(alex["compute_s"], 6)) for mode in netexp.MODES for w in (1, 4)
    ]
    assert len(seen) == 8 and "reference" not in table.attrs and table.attrs["workers"] == 4
    for name, row in table.iterrows():  # the fake links follow the arithmetic exactly
        want = netexp.predicted(netexp.model_step(name)["ratio"], 4)
        assert row[list(want)].to_dict() == pytest.approx(want)
    assert table.loc["AlexNet", "ring / PS examples/s"] > table.loc["ResNet50", "ring / PS examples/s"]
    assert capsys.readouterr().out.count("at 4 workers the PS") == 2  # one line per model
    with pytest.raises(ValueError, match="at least two different counts"):
        netexp.models(workers=[4, 4])


@pytest.mark.parametrize("hosts", ["local", "emulated:100mbit"])
def test_models_without_links_run_nothing_and_show_the_labelled_reference(hosts, monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    from lab_utils import reference_runs
    from lab_utils.cluster import netem

    monkeypatch.setattr(netem, "unavailable_reason", lambda: "user namespaces are off here")
    monkeypatch.setattr(netexp, "run_netexp", None)  # nothing may run
    table = netexp.models(["AlexNet", "ResNet50", "VGG16"], hosts=hosts)
    out = capsys.readouterr().out
    assert "Model sizes need links" in out and "so nothing ran" in out and out.count("\n") == 1 + (hosts != "local")
    assert table.attrs["reference"].startswith("reference run: the thesis's models on emulated 100 Mbit/s links")
    ref = reference_runs.load(netexp.MODELS_REFERENCE)
    assert ref["made_with"].startswith("python bench/bench_network.py --models")
    # what the shipped run shows: the more a model sends per computation, the more the ring wins
    assert list(table.sort_values("send / compute").index) == ["ResNet50", "VGG16", "AlexNet"]
    assert table.sort_values("send / compute")["ring / PS examples/s"].is_monotonic_increasing
    assert (table["ring / PS examples/s"] > 1).all() and table.loc["AlexNet", "PS speedup"] < 1.5
    fig = netexp.plot_models(table)
    assert fig._suptitle.get_text() == table.attrs["reference"]
