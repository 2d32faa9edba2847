"""A stand-in for the grader's clock (``lab_utils.grading.throughput._clock``): jobs that take
exactly the seconds they are given, so timing logic is tested without timing anything."""

from __future__ import annotations


class FakeClock:
    """perf_counter stand-in: each job advances it by the seconds it is given (a number, or a
    list taken one per run); ``runs`` counts the jobs run."""

    def __init__(self):
        self.now = 0.0
        self.runs = 0

    def __call__(self):
        return self.now

    def job(self, seconds, result=None):
        def run():
            self.runs += 1
            self.now += seconds.pop(0) if isinstance(seconds, list) else seconds
            return result

        return run
