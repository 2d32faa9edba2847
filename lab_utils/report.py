"""Events from training scripts: one JSON object per line, one file per task.

Training scripts (the ``train_*.py`` files a lab launches) call::

    from lab_utils import report
    report.ready(port=...)                      # "my server is serving"
    report.step(step, examples, loss=..., accuracy=...)
    report.result(accuracy=0.91, examples_per_sec=1234.0)

and, for the run's timeline (:mod:`lab_utils.timeline`), the parts of a step::

    with report.span("allreduce", "comm"):       # or report.add_span(name, cat, start, end)
        ...
    report.step(step, examples, started=t0)     # the spans recorded since go with this step

A span's category is one of :data:`CATEGORIES`: ``compute``, ``comm`` (push, pull,
all-reduce...), ``wait`` (a token, a barrier, a slower worker), ``delay`` (a straggler's
injected sleep), ``eval`` (the chief's evaluation, not training). What a step's spans do
not cover is ``other`` (the input pipeline, Python). ``LABS_TRACE=0`` records none.

The launcher (``lab_utils.cluster``) tells each task where to write through
environment variables, reads ``ready`` events to know a task is up, and returns
``result`` events from ``cluster.results()``. ``lab_utils.metrics`` joins step
events with resource samples on wall-clock time.

Where the file goes:
- ``LABS_REPORT_FILE``: this exact file (TensorFlow tasks: one per task);
- else ``LABS_REPORT_DIR``: ``<dir>/rank-<r>.jsonl`` with the rank read from
  Horovod, Open MPI or PMI variables (mpirun/horovodrun jobs: one per rank);
- else standard output, so a script run by hand shows what it reports.

Each record carries ``time`` (wall clock, seconds since the epoch), ``kind``,
``task`` (for example ``"worker:1"``), ``pid`` and the fields given.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lab_utils import config

__all__ = [
    "event",
    "ready",
    "step",
    "result",
    "span",
    "add_span",
    "tracing",
    "CATEGORIES",
    "read_events",
    "iter_events",
    "EventTail",
    "task_name",
    "rank",
    "peers",
    "straggle",
    "parse_straggler",
]

#: What a span of a step may be (``other``: what no span covers, added by the reader).
CATEGORIES = ("compute", "comm", "wait", "delay", "eval")

_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_handle = None
_handle_path: str | None = None
_spans: list[list] = []  # [name, category, start, end] of the step in progress
_tracing: bool | None = None
_straggle: float | None = None  # LABS_STRAGGLER for this task, read once


def rank() -> int | None:
    """This process's rank in an MPI/Horovod job, or None outside one."""
    for name in _RANK_VARS:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None


def peers(ranks: Sequence[int] | None = None) -> list[str]:
    """The other ranks of this MPI/Horovod job as tasks (``rank:<r>``), of ``ranks`` (default
    every rank of the job): what a collective's span is ``on``. Empty outside a job."""
    mine = rank()
    if ranks is None:
        size = next((int(v) for v in (os.environ.get(n) for n in _SIZE_VARS) if v and v.isdigit()), 0)
        ranks = range(size) if mine is not None else ()
    return [f"rank:{r}" for r in ranks if r != mine]


def task_name() -> str:
    """``LABS_TASK`` (set by the launcher, e.g. ``ps:0``), else ``rank:<r>``, else ``local:0``."""
    name = config.get(config.TASK)
    if name:
        return name
    r = rank()
    return f"rank:{r}" if r is not None else "local:0"


def _target() -> str | None:
    path = config.get(config.REPORT_FILE)
    if path:
        return path
    directory = config.get(config.REPORT_DIR)
    if directory:
        r = rank()
        return str(Path(directory) / f"rank-{r if r is not None else 0}.jsonl")
    return None


def _clean(value: Any) -> Any:
    """Make NumPy scalars and non-finite floats JSON-safe."""
    if hasattr(value, "item") and callable(value.item):  # numpy scalar / 0-d array
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def event(kind: str, **fields: Any) -> dict:
    """Write one event and return it. Lines are flushed at once (the launcher
    and the metrics sampler read them while the task runs)."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"event kind must be a non-empty string, got {kind!r}")
    return _write(_record(kind, fields))


def _record(kind: str, fields: dict) -> dict:
    return {"time": time.time(), "kind": kind, "task": task_name(), "pid": os.getpid(), **_clean(fields)}


@atexit.register
def _close() -> None:
    """The event file closed as the process exits (its lines are flushed as written)."""
    global _handle, _handle_path
    if _handle is not None:
        _handle.close()
        _handle, _handle_path = None, None


def _write(record: dict) -> dict:
    global _handle, _handle_path
    line = json.dumps(record, separators=(",", ":"))
    path = _target()
    if path is None:
        print(line, flush=True)
        return record
    if _handle is None or _handle_path != path:
        if _handle is not None:
            _handle.close()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _handle = open(path, "a", buffering=1, encoding="utf-8")
        _handle_path = path
    _handle.write(line + "\n")
    _handle.flush()
    return record


def ready(**fields: Any) -> dict:
    """Tell the launcher this task is up (its server is serving)."""
    return event("ready", **fields)


def tracing() -> bool:
    """Whether this process records spans (``LABS_TRACE``, read once; default on)."""
    global _tracing
    if _tracing is None:
        _tracing = config.flag(config.TRACE) is not False
    return _tracing


def _on(cat: str, on: str | Sequence[str] | None) -> list[str] | None:
    if on is None:
        return None
    if cat not in ("wait", "comm", "compute"):
        raise ValueError(f"a wait, or a collective's comm or compute, is on other tasks, not a {cat!r} span")
    names = [on] if isinstance(on, str) else list(on)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"on must name tasks ('worker:1' or a list of them), got {on!r}")
    return names


def add_span(name: str, cat: str, start: float, end: float, *, on: str | Sequence[str] | None = None) -> None:
    """Record that this step spent ``[start, end]`` (``time.time()`` seconds) on ``name``,
    of category ``cat`` (one of :data:`CATEGORIES`); it goes out with the next :func:`step`.
    ``on``: a wait's task(s) it waited for, where the code knows them (the critical path and
    the causes of waits then look only there, :mod:`lab_utils.critical_path`); on a ``comm``
    or ``compute`` span, the other tasks of a collective (an all-reduce, an all-gather): it
    could not finish before each of them began its span of the same name, and the timeline
    shows the time until the last one did as waiting (:mod:`lab_utils.timeline`)."""
    if cat not in CATEGORIES:
        raise ValueError(f"span category must be one of {', '.join(CATEGORIES)}, got {cat!r}")
    if end < start:
        raise ValueError(f"span {name!r} ends ({end}) before it starts ({start})")
    names = _on(cat, on)
    if tracing():
        _spans.append([name, cat, round(start, 6), round(end, 6), *([names] if names else [])])


class span:
    """``with report.span(name, cat):`` times the block as a span of this step (see
    :func:`add_span`); the span is recorded even when the block raises."""

    __slots__ = ("name", "cat", "start", "on")

    def __init__(self, name: str, cat: str, *, on: str | Sequence[str] | None = None):
        if cat not in CATEGORIES:
            raise ValueError(f"span category must be one of {', '.join(CATEGORIES)}, got {cat!r}")
        self.name, self.cat, self.on = name, cat, _on(cat, on)

    def __enter__(self) -> span:
        self.start = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        if tracing():
            row = [self.name, self.cat, round(self.start, 6), round(time.time(), 6)]
            _spans.append([*row, self.on] if self.on else row)


def parse_straggler(spec: str | Mapping[str, float] | None) -> dict[str, float]:
    """``"worker:1=0.05"`` (seconds), ``"worker:1=50ms"``, several joined by commas,
    or a dict ``{"worker:1": 0.05}`` -> ``{"worker:1": 0.05}``. ``None``/"" -> {}."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, str):
        items = []
        for part in spec.split(","):
            name, sep, value = part.strip().partition("=")
            if not sep or not name.strip() or not value.strip():
                raise ValueError(f"straggler must look like 'worker:1=0.05' (seconds) or 'worker:1=50ms', got {spec!r}")
            items.append((name.strip(), value.strip()))
    else:
        raise TypeError(f"straggler must be a string like 'worker:1=0.05' or a dict, got {type(spec).__name__}")
    out = {}
    for name, value in items:
        if isinstance(value, str):
            scale = 1.0
            if value.endswith("ms"):
                value, scale = value[:-2], 1e-3
            elif value.endswith("s"):
                value = value[:-1]
            try:
                seconds = float(value) * scale
            except ValueError:
                raise ValueError(
                    f"straggler delay for {name!r} must be a number of seconds (or '50ms'), got {value!r}"
                ) from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            raise TypeError(f"straggler delay for {name!r} must be a number, got {value!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"straggler delay for {name!r} must be >= 0 seconds, got {seconds}")
        out[str(name)] = seconds
    return out


def straggle() -> float:
    """At the start of a timed step: sleep as long as ``LABS_STRAGGLER`` says for this task
    (``rank:1=0.2``, several joined by commas), recorded as the step's ``straggler delay``
    (``delay``). Every run kind's step loop calls it; the seconds slept (0.0: not named)."""
    global _straggle
    if _straggle is None:
        _straggle = parse_straggler(config.get(config.STRAGGLER) or "").get(task_name(), 0.0)
    if _straggle > 0:
        with span("straggler delay", "delay"):
            time.sleep(_straggle)  # the injected slowness: the one deliberate sleep, as Labs 2-3's
    return _straggle


def step(step: int, examples: int, *, started: float | None = None, **fields: Any) -> dict:
    """Progress: ``step`` (global or local, say which in a field if it matters),
    ``examples`` processed by this task so far, plus e.g. ``loss``, ``accuracy``.
    ``started``: when this step began (``time.time()``): with it, and the spans recorded
    since the previous step, the step is a bar of the run's timeline."""
    if step < 0 or examples < 0:
        raise ValueError(f"step and examples must be >= 0, got step={step}, examples={examples}")
    record = _record("step", {"step": int(step), "examples": int(examples), **fields})
    if started is not None and tracing():  # already plain floats and strings: not cleaned again
        record["started"] = round(started, 6)
        if _spans:
            record["spans"] = _spans[:]
    _spans.clear()
    return _write(record)


def result(**fields: Any) -> dict:
    """The task's final numbers (returned by ``cluster.results()``)."""
    return event("result", **fields)


def iter_events(path: str | os.PathLike) -> Iterator[dict]:
    """Events in a file. A half-written last line (the task is still writing) is skipped."""
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break
                line = line.strip()
                if line:
                    yield json.loads(line)
    except FileNotFoundError:
        return


def read_events(path: str | os.PathLike, kind: str | None = None) -> list[dict]:
    """All complete events in ``path`` (optionally only those of ``kind``)."""
    return [e for e in iter_events(path) if kind is None or e.get("kind") == kind]


class EventTail:
    """Reads a growing events file incrementally: each :meth:`read` returns only the
    complete events written since the previous call (long runs write thousands)."""

    def __init__(self, path: str | os.PathLike):
        self.path, self.offset = Path(path), 0

    def read(self, kind: str | None = None) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        events = (json.loads(line) for line in complete.splitlines() if line.strip())
        return [e for e in events if kind is None or e.get("kind") == kind]


if __name__ == "__main__":  # pragma: no cover - tiny manual check
    json.dump(event("hello", argv=sys.argv[1:]), sys.stdout)
