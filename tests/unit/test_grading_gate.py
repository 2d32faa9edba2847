"""The grading batch's turn-taking (lab_utils.grading.gate): weighted turns that a stopping
batch opens for good, and the two pipes between the batch and a worker."""

from __future__ import annotations

import os
import threading

import pytest

from lab_utils.grading.gate import EXECUTED, READY, Admission, Gate, Turns, notify, wait_for_go


def _taken_in_thread(turns: Turns, k: int):
    got = []
    t = threading.Thread(target=lambda: got.append(turns.take(k)), daemon=True)
    t.start()
    return t, got


def test_a_two_core_notebook_waits_until_two_turns_are_free():
    turns = Turns(2)
    assert turns.take(1)
    t, got = _taken_in_thread(turns, 2)
    t.join(0.2)
    assert t.is_alive() and got == []  # one core free: the two-core notebook waits
    turns.give(1)
    t.join(5)
    assert got == [True] and turns.free == 0
    with pytest.raises(ValueError, match="3 of 2"):
        turns.take(3)


def test_stopping_lets_every_waiter_go_empty_handed():
    turns = Turns(1)
    assert turns.take()
    waiters = [_taken_in_thread(turns, 1) for _ in range(3)]
    turns.stop()
    for t, got in waiters:
        t.join(5)
        assert got == [False]
    assert not Admission(turns).held


def test_an_admission_is_given_back_once():
    turns = Turns(1)
    held = Admission(turns)
    assert held.held and turns.free == 0
    held.release()
    held.release()
    assert turns.free == 1


def test_the_gate_hears_ready_and_executed_then_end_of_file():
    gate = Gate()
    go_fd, note_fd = (os.dup(fd) for fd in gate.worker_fds)  # the worker's ends, as Popen(pass_fds) hands them
    gate.started()
    try:
        assert gate.wait_for(READY, 0.05) is None  # nothing said yet: timed out
        notify(note_fd, READY)
        assert gate.wait_for(READY, 5) is True
        assert gate.go()
        wait_for_go(go_fd)  # returns: the worker may start its kernel
        notify(note_fd, EXECUTED)
        assert gate.wait_for(EXECUTED, 5) is True
    finally:
        os.close(note_fd)
    assert gate.wait_for(EXECUTED, 5) is False  # the worker is gone (False), not a timeout (None)
    gate.close()
    with pytest.raises(RuntimeError, match="closed the gate"):
        wait_for_go(go_fd)  # the batch went away before the turn
    os.close(go_fd)


def test_without_a_gate_the_worker_side_does_nothing():
    notify(-1, READY)
    wait_for_go(-1)


class _Box:
    """A sandbox that records what the batch asks of it (nothing is started)."""

    name = "labgrade-0-test"

    def __init__(self):
        self.calls = []

    def start(self, *args, **kw):
        self.calls.append("start")

    def kill(self):
        self.calls.append("kill")

    def wait(self, timeout):
        self.calls.append("wait")
        return 0


def _stoppable_batch():
    from lab_utils.grading.batch import Batch

    batch = Batch.__new__(Batch)  # only what stop() and _run() touch: no course, no cgroups
    batch.lock, batch.active, batch.stopped, batch.pipeline = threading.Lock(), set(), False, True
    batch.admitted, batch.executing = Turns(2), Turns(1)
    return batch


def test_a_sandbox_made_before_a_stop_never_starts_its_worker_after_it(tmp_path):
    """SIGTERM while a sandbox is being made (its cgroup there, its worker not yet started):
    stop() found nothing to kill, then the worker started and prepared for minutes while
    the interrupted batch waited for it (a CI run's `the batch did not stop within 120 s`)."""
    from lab_utils.grading.batch import _Stopped

    batch, box, gate = _stoppable_batch(), _Box(), Gate()
    admission = Admission(batch.admitted)
    batch.active.add(box)
    batch.stop()  # the interrupt, between the sandbox's making and its worker's start
    assert box.calls == ["kill"]
    try:
        with pytest.raises(_Stopped):
            batch._run(box, tmp_path, gate, {"cpus": 1}, admission)
    finally:
        gate.close()
    assert box.calls == ["kill"]  # not started, not waited for
    assert not admission.held  # its turn given back for the next sandbox (none comes: stopped)
