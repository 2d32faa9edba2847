"""The :class:`Monitor`: a daemon thread that samples a cluster's tasks and the host.

Why a thread in the kernel and not a sidecar process: a sample of a 3-task TF
cluster costs about 1.7 ms CPU (5 ms when it also re-lists the process trees,
once a second), mostly ``/proc`` reads that release the GIL; the bench measured
0.5 % of one core at 1 Hz and 1.7 % at 10 Hz. A sidecar would cost a second
interpreter (~20 MB, ~0.3 s to start), IPC to bring rows back into the
notebook, and one more process that can outlive a killed kernel. The thread is a
daemon, holds no lock while sampling and stops with ``stop()``/``with``.
``bench/bench_metrics_overhead.py`` measures its cost (CPU % of one core).

History is a bounded buffer (``max_samples``); peaks, means and byte totals are
running aggregates, so :meth:`Monitor.summary` covers the whole run anyway.

Nothing here writes to stderr (nbgrader scores a cell with stderr 0): problems
are kept in :attr:`Monitor.notes`.
"""

from __future__ import annotations

import collections
import html
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab_utils import checks
from lab_utils.cluster.hosts import is_local
from lab_utils.display import is_headless
from lab_utils.metrics.sampler import METRICS, ROLES, Row, Sampler, TaskSource, validate_interval
from lab_utils.metrics.tables import event_files, events_frame, summary_table

__all__ = ["Monitor", "watch"]

_ROW_ROLES = ROLES + ("host", "gpu", "total")
_COLUMNS = ["time", "role", "task", "metric", "value"]


def _check_role_filter(role: str | None) -> None:
    if role is not None and role not in _ROW_ROLES:
        raise ValueError(f"unknown role {role!r}; allowed: {', '.join(_ROW_ROLES)}")


def _add(agg: dict, key: tuple, value: float) -> None:
    """Fold ``value`` into the running ``[max, sum, count]`` of ``key``."""
    a = agg.get(key)
    if a is None:
        agg[key] = [value, value, 1]
    else:
        a[0] = max(a[0], value)
        a[1] += value
        a[2] += 1


class Monitor:
    """Background sampler of a cluster's tasks and the host (a daemon thread).

    ``tasks``: ``{task: pid}`` or a callable returning it. ``cluster``: an object
    with ``task_pids()`` (else its ``tasks`` list of objects with ``name``/``pid``
    is used); its events files are used for summary/plot unless ``events`` is given.
    ``events``: events file(s) or directory (``*.jsonl``) for Examples/s, s/batch,
    per-task network bytes and plots. ``max_samples`` bounds the kept history
    (the summary's peaks and totals cover the whole run anyway).
    """

    def __init__(
        self,
        tasks: TaskSource | None = None,
        *,
        cluster: Any = None,
        interval: float = 1.0,
        events: Any = None,
        max_samples: int = 3600,
        host: bool = True,
        gpu: bool = True,
        sampler: Sampler | None = None,
    ):
        self.interval = validate_interval(interval)
        checks.count("max_samples", max_samples, low=2)
        if tasks is not None and cluster is not None:
            raise ValueError("give either tasks= or cluster=, not both")
        self.cluster = cluster
        if cluster is not None:
            if not (callable(getattr(cluster, "task_pids", None)) or hasattr(cluster, "tasks")):
                raise TypeError(
                    f"cluster {type(cluster).__name__} has neither task_pids() nor tasks; "
                    "pass tasks={'worker:0': pid, ...} instead"
                )
            tasks = self._cluster_pids
        self.sampler = sampler or Sampler(tasks, host=host, gpu=gpu, loopback=self._private_loopback)
        self._events = events
        self._buffer: collections.deque = collections.deque(maxlen=max_samples)
        self._agg: dict[tuple, list] = {}  # (scope, task, metric) -> [max, sum, count]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._render: threading.Thread | None = None
        self._live: dict | None = None
        self._static_at_stop = False
        self.error: BaseException | None = None
        self.notes: list[str] = []
        self.start_time: float | None = None
        self.stop_time: float | None = None
        self.dropped = 0  # samples pushed out of the bounded buffer
        self.on_sample: Callable[[float, list[Row]], None] | None = None
        if self.sampler.gpu is not None and not self.sampler.gpu.available:
            self.notes.append(f"no GPU metrics: {self.sampler.gpu.reason}")

    # -- sources
    def _private_loopback(self) -> tuple[str, tuple[int, int]] | None:
        """The cluster's private network's loopback counters (they carry the tasks' traffic;
        read before the network went, when the job has ended: the last sample still counts)."""
        net = getattr(self.cluster, "network", None)
        return net.loopback() if getattr(net, "kind", None) == "private" else None

    def _cluster_pids(self) -> dict[str, int]:
        c = self.cluster
        fn = getattr(c, "task_pids", None)
        if callable(fn):
            return dict(fn() or {})
        out = {}
        for t in getattr(c, "tasks", []):
            if not getattr(t, "pid", None):
                continue
            if not is_local(getattr(t, "host", None)):  # the local pid is ssh's, not the task's
                note = f"{t.name} runs on {t.host}: not sampled (only local tasks can be)"
                if note not in self.notes:
                    self.notes.append(note)
                continue
            out[t.name] = t.pid
        return out

    def event_files(self) -> list[Path]:
        """The events files read for summary/plot: ``events`` if given, else the cluster's."""
        if self._events is not None:
            return event_files(self._events)
        c = self.cluster
        if c is None:
            return []
        files = [getattr(t, "events_path", None) for t in getattr(c, "tasks", [])]
        files = [f for f in files if f]
        if not files and getattr(c, "run_dir", None):
            files = event_files(c.run_dir)
        return [Path(f) for f in files]

    def steps(self):
        """Step events of the monitored tasks (a DataFrame)."""
        return events_frame(self.event_files(), "step")

    # -- life cycle
    def start(self) -> Monitor:
        if self._thread is not None:
            raise RuntimeError("this Monitor is already running; use a new Monitor for a new run")
        self.start_time = time.time()
        self.record(*self.sampler.sample())  # baseline (first rates come with the next sample)
        self._thread = threading.Thread(target=self._run, name="lab_utils.metrics", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        clock = self.sampler.clock
        due = clock() + self.interval
        while not self._stop.wait(max(0.0, due - clock())):
            try:
                self.record(*self.sampler.sample())
            except Exception as exc:  # noqa: BLE001 - not swallowed: kept and re-raised by stop(), never printed
                self.error = exc
                return
            due += self.interval
            now = clock()
            if due < now:  # fell behind (suspended laptop, busy host): skip missed ticks
                due = now + self.interval

    def record(self, wall: float, rows: list[Row]) -> None:
        """Keep one sample (``Sampler.sample()``'s ``(wall_time, rows)``): append it to
        the bounded history and fold it into the running peaks and means. The
        thread calls this at every tick; call it yourself to drive a Monitor by hand."""
        totals: dict[str, float] = {}  # per-sample sums over tasks
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
            self._buffer.append((wall, rows))
            for _, _role, task, metric, value in rows:
                scope = METRICS[metric].scope
                _add(self._agg, (scope, task, metric), value)
                if scope == "task" and metric in ("cpu_percent", "rss"):
                    totals[metric] = totals.get(metric, 0.0) + value
            for metric in ("cpu_percent", "rss"):
                if metric in totals:
                    a = self._agg.setdefault(("total", "total", metric), [totals[metric], 0.0, 0])
                    a[0] = max(a[0], totals[metric])
                    a[1] += totals[metric]
                    a[2] += 1
        if self.on_sample is not None:
            self.on_sample(wall, rows)

    def stop(self, _raise: bool = True) -> None:
        """Stop sampling (idempotent); draw the final live/static figure; raise a sampler error."""
        if self._thread is None or self.stop_time is not None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 3 * self.interval))
        if self.error is None and not self._thread.is_alive():
            # a last sample: what moved since the last tick counts (a run shorter than a few
            # intervals lost up to half its network bytes without it)
            try:
                self.record(*self.sampler.sample())
            except Exception as exc:  # noqa: BLE001 - not swallowed: kept in notes, shown with the run
                self.notes.append(f"metrics: the last sample failed: {exc!r}")
        if self._render is not None:
            self._render.join(timeout=10.0)
        self.stop_time = time.time()
        if self._live is not None:
            self._draw_live()
        elif self._static_at_stop:
            self._display_static()
        if self.error is not None and not _raise:
            self.notes.append(f"metrics sampler stopped early: {self.error!r}")
        elif self.error is not None:
            raise RuntimeError(f"metrics sampler stopped early: {self.error!r}") from self.error

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(_raise=exc_type is None)  # never hide the body's own exception

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- outputs
    def frame(self, role: str | None = None, metric: str | None = None):
        """Tidy DataFrame: ``time`` (epoch s, joins with report events), ``role``,
        ``task``, ``metric``, ``value``. Units: :data:`~lab_utils.metrics.METRICS`."""
        import pandas as pd

        _check_role_filter(role)
        if metric is not None and metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        with self._lock:
            rows = [r for _, sample in self._buffer for r in sample]
        df = pd.DataFrame.from_records(rows, columns=_COLUMNS)
        if role is not None:
            df = df[df["role"] == role]
        if metric is not None:
            df = df[df["metric"] == metric]
        return df.reset_index(drop=True)

    def to_csv(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.frame().to_csv(path, index=False)
        return path

    def summary(self, events: Any = None, role: str | None = None):
        """The seeds' table per task plus ``total``: Peak Mem, Peak CPU, Network R,
        Network W (with ``network_scope``), Examples/s, s/batch. Units in ``.attrs``."""
        _check_role_filter(role)
        steps = events_frame(events, "step") if events is not None else self.steps()
        with self._lock:
            agg = {k: list(v) for k, v in self._agg.items()}
            host_bytes = collections.defaultdict(float)
            task_bytes: dict = collections.defaultdict(dict)
            for (dev, metric), total in self.sampler.counters.totals.items():
                if metric in ("net_recv", "net_sent"):
                    host_bytes[metric] += total
                elif metric in ("task_net_recv", "task_net_sent"):
                    task_bytes[dev][metric] = total
        df = summary_table(agg, host_bytes, steps, self.start_time, self.stop_time, task_bytes)
        if role is not None:
            df = df[df["role"] == role]
        return df

    def plot(self, events: Any = None):
        """A static matplotlib Figure: throughput/accuracy, CPU, memory, network vs time
        (:func:`lab_utils.plots.plot_metrics`)."""
        from lab_utils.plots import plot_metrics

        steps = events_frame(events, "step") if events is not None else self.steps()
        return plot_metrics(self.frame(), steps, t0=self.start_time)

    # -- live view
    @property
    def view(self) -> str | None:
        """What :meth:`live` set up: ``"live"`` (a widget redrawn in place), ``"static"``
        (one figure when the monitor stops: headless) or None (not asked)."""
        return "live" if self._live is not None else ("static" if self._static_at_stop else None)

    def live(self, every: float = 2.0, headless: bool | None = None):
        """In JupyterLab: show a figure updated in place at most every ``every``
        seconds (default 2). Headless (papermill, nbgrader, a script;
        :func:`lab_utils.display.is_headless`): returns at once and one static
        figure is displayed when the monitor stops."""
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not (0.5 <= every <= 600):
            raise ValueError(f"every must be between 0.5 and 600 seconds, got {every!r}")
        if headless if headless is not None else is_headless():
            if self.stop_time is not None:
                self._display_static()
            else:
                self._static_at_stop = True
            return None
        import ipywidgets as widgets
        from IPython.display import display

        image, label = widgets.Image(format="png"), widgets.HTML()
        self._live = {"image": image, "label": label, "every": float(every)}
        display(widgets.VBox([label, image]))
        self._draw_live()
        if self.running and self._render is None:
            self._render = threading.Thread(target=self._render_loop, name="lab_utils.metrics.live", daemon=True)
            self._render.start()
        return None

    def _render_loop(self) -> None:
        while not self._stop.wait(self._live["every"]):
            try:
                self._draw_live()
            except Exception as exc:  # noqa: BLE001 - a thread's traceback would go to stderr; keep it visible instead
                self.notes.append(f"live view stopped: {exc!r}")
                self._live["label"].value = html.escape(f"live view stopped: {exc!r}")
                return

    def _draw_live(self) -> None:
        from lab_utils.plots import png_bytes

        live = self._live
        live["image"].value = png_bytes(self.plot())
        state = "running" if self.running else "stopped"
        live["label"].value = html.escape(f"metrics {state}: {self.sampler.samples} samples, every {self.interval:g} s")

    def _display_static(self) -> None:
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return
        if get_ipython() is not None:
            from lab_utils.plots import png_bytes

            display(Image(png_bytes(self.plot())))

    # -- notebook repr
    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self.stop_time else "not started")
        tasks = ", ".join(self.sampler.task_pids()) if self._thread else "?"
        return f"<Monitor {state}, every {self.interval:g} s, {self.sampler.samples} samples, tasks: {tasks}>"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>" + (
            f"<br><small>{html.escape('; '.join(self.notes))}</small>" if self.notes else ""
        )


def watch(job, *, interval: float = 1.0, sample: bool = True, live: bool = False) -> Monitor | None:
    """Wait for ``job`` (a cluster or an MPI job) to end. With ``sample`` (or ``live``),
    sample it meanwhile and return the stopped :class:`Monitor` (else None). With
    ``live`` the student watches it train: in JupyterLab a figure redrawn in place,
    headless (papermill, nbgrader) one static figure when it ends (:meth:`Monitor.live`).
    The labs ask for it on the runs they look at closely."""
    if not (sample or live):
        job.wait()
        return None
    with Monitor(cluster=job, interval=interval) as mon:
        if live:
            mon.live()
        job.wait()
    return mon
