"""The Slurm grading's pure parts: the array's sbatch, squeue's records, what an element
that ended without a result leaves, and the machine-wide sandbox slots."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab_utils.grading import batch, slurm
from lab_utils.grading.settings import DEFAULTS


def test_array_indices_read_every_form_squeue_prints():
    assert slurm.array_indices("3") == [3]
    assert slurm.array_indices("2-4") == [2, 3, 4]
    assert slurm.array_indices("[2-4,7]") == [2, 3, 4, 7]
    assert slurm.array_indices("5-7%2") == [5, 6, 7]  # the throttle is not an index
    assert slurm.array_indices("N/A") == []


def test_element_states_gives_pending_records_to_the_array(monkeypatch):
    out = "12 0 COMPLETED n1 None\n12 1 RUNNING n2 None\n12 2-4%2 PENDING  JobArrayTaskLimit\n13 N/A CANCELLED  None\n"
    monkeypatch.setattr(slurm, "_run", lambda cmd, timeout=60: subprocess.CompletedProcess(cmd, 0, out, ""))
    states = slurm.element_states(["12", "13"])
    assert states[("12", 0)] == ("COMPLETED", "n1")
    assert states[("12", 1)][0] == "RUNNING"
    assert [states[("12", i)][0] for i in (2, 3, 4)] == ["PENDING"] * 3
    assert states[("13", None)][0] == "CANCELLED"  # elements cancelled while pending: one record


def test_sbatch_asks_for_the_labs_cores_memory_and_time_and_never_requeues(tmp_path):
    settings = {**DEFAULTS, "cpus": 1.5, "memory_mb": 3000}
    cmd = slurm.sbatch_command(tmp_path / "02_ps_async", 7, settings, ["--partition=labs"], max_running=3)
    assert "--array=0-6%3" in cmd and "--cpus-per-task=2" in cmd  # 1.5 cores: two whole ones
    assert f"--mem={3000 + slurm.ELEMENT_MB}M" in cmd and "--no-requeue" in cmd
    assert f"--time={-(-slurm.time_limit_s(settings) // 60)}" in cmd
    assert cmd[cmd.index("--partition=labs") + 1] == "--wrap"
    assert cmd[-1].endswith(f"lab_utils.grading.slurm element {tmp_path / '02_ps_async'} $SLURM_ARRAY_TASK_ID")


@pytest.mark.parametrize(
    ("state", "status", "says"),
    [
        ("CANCELLED", "cancelled", "the same command grades it"),
        ("NODE_FAIL", "infrastructure error", "its node n3 failed while it was graded"),
        ("TIMEOUT", "infrastructure error", "past its time limit"),
        ("FAILED", "infrastructure error", "ended FAILED without a result"),
    ],
)
def test_an_element_without_a_result_is_never_scored(tmp_path, state, status, says):
    log = tmp_path / "3.log"
    log.write_text("element 3: s/01 on n3\nTraceback: boom\n")
    r = slurm._not_graded({"student": "s"}, "01", state, "n3", log)
    assert r["status"] == status and r["score"] is None and says in r["reason"], r
    assert r["flags"] == ([] if state == "CANCELLED" else [{"kind": "regrade", "detail": r["reason"]}])


def test_slot_claims_are_exclusive_on_a_machine_and_freed_with_their_holder(tmp_path):
    first = batch.SlotClaims(3, tmp_path)
    second = batch.SlotClaims(2, tmp_path)
    assert first.slots == [0, 1, 2] and second.slots == [3, 4]  # two batches never share a slot (a uid)
    first.release()
    third = batch.SlotClaims(4, tmp_path)
    assert third.slots == [0, 1, 2, 5]
    second.release()
    third.release()
    assert sorted(p.name for p in Path(tmp_path).iterdir())[:1] == ["slot-0.lock"]


def test_a_result_without_a_score_keeps_the_logs_last_lines(tmp_path):
    from lab_utils.grading import results

    log = tmp_path / "worker.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    r = results.not_graded("s", "01", "the grading worker exited 1", log)
    assert r["status"] == "infrastructure error" and r["score"] is None and r["max_score"] is None
    assert r["log_tail"] == [f"line {i}" for i in range(60, 100)] and r["cells"] == [] and r["flags"] == []
    assert results.not_graded("s", "01", "why", tmp_path / "absent.log")["log_tail"] == []
