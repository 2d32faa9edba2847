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
