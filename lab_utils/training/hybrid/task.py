"""Lab 6's task side of "the Parallax idea": sparse variables through a parameter server,
dense variables through all-reduce. One MPI rank; ``mpirun`` starts every rank
(:func:`lab_utils.training.hybrid.run_hybrid` does it for the notebook)::

    mpirun -np 3 python -m lab_utils.training.hybrid.task --mode hybrid --steps 10

**The model.** A small recommendation model: will user ``u`` click item ``i``? One
embedding table holds a vector of ``--dim`` floats for every user and every item
(``--users + --items`` rows: 100,000 x 32 floats, 12.8 MB by default); the two vectors of
an example, side by side, go through a dense MLP (``2 dim -> hidden -> hidden -> 1``,
1.1 M parameters, 4.5 MB with ``--hidden 1024``) that gives the click's logit.

**The data**, generated here and deterministic (:func:`make_world`, :func:`batch`): users
and items are drawn from Zipf-like distributions (a few are very popular, most are rare,
as on a real site), and the click from a hidden ground truth (a bias per item and a
dot product of hidden user and item vectors), so the loss falls as the model learns.
Worker ``w`` draws its batch of step ``t`` from the seed ``(seed, w, t)``: the same in
every mode, so the three modes train the same model on the same examples.

**Why the two kinds of variables differ.** A batch of 256 examples touches a few hundred
of the table's 100,000 rows: its gradient is *sparse* (TensorFlow's ``IndexedSlices``,
rows and their ids). Every dense weight gets a gradient at every step. Made dense for an
all-reduce, the table's gradient is 12.8 MB of mostly zeros; sent as rows, about 50 kB.
Parallax (Kim et al., EuroSys 2019) therefore sends each kind its own way. ``--mode``:

- ``ps``: rank 0 is a parameter server holding everything (Lab 3's synchronous PS):
  a worker sends the ids its batch needs, gets those rows and all the dense weights,
  computes, and pushes the rows' gradients (ids and one summed row per id) and the dense
  gradients; the PS averages the workers' gradients and applies them (SGD). The PS's
  one link carries every worker's dense weights and gradients, each step;
- ``allreduce``: every rank is a worker holding a full copy; the table's gradient is made
  dense (Horovod's ``sparse_as_dense=True``) and everything is averaged by
  ``hvd.allreduce`` (a ring: each rank sends and receives ``2(N-1)/N`` times the model);
- ``hybrid``: rank 0 is the PS for the embedding table only (rows pulled and pushed with
  mpi4py point-to-point messages); the dense gradients go through ``hvd.allreduce``
  among the workers only: Horovod runs on a sub-communicator without the PS
  (``hvd.init(comm=COMM_WORLD.Split(...))``).

All three are synchronous SGD on the average of the workers' gradients: they compute
the same updates, up to the order of float additions.

Each worker reports a ``step`` event per timed step (``loss``, ``seconds``, and in ``ps``
and ``hybrid`` mode the step's parts for the run's timeline: ``pull``, ``forward/backward``,
``allreduce``, ``apply``, ``push``) and one ``result``: ``step_s`` (median after
``--warmup`` untimed steps), ``examples_per_s``, ``loss_start`` (step 0, before any
update) and ``loss_end`` (mean of the last steps), and the bytes it sent and received per
step by category, ``sparse`` (ids and rows) and ``dense`` (:func:`message_bytes`: exact
message sizes for the point-to-point messages, the ring's ``2(N-1)/N`` for Horovod's
all-reduce).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lab_utils import report
from lab_utils.training.hybrid.settings import MODES, Settings, check_args, dense_shapes, make_parser, parse_args

__all__ = [
    "MODES",
    "Settings",
    "make_parser",
    "parse_args",
    "check_args",
    "dense_shapes",
    "World",
    "make_world",
    "batch",
    "init_params",
    "ring_bytes",
    "message_bytes",
    "serve",
    "work",
    "main",
]

#: Message tags: the pull (ids, then rows and dense weights back) and the push.
TAG_PULL, TAG_ROWS, TAG_DENSE, TAG_PUSH_IDS, TAG_PUSH_ROWS, TAG_PUSH_DENSE = range(1, 7)
#: Bytes of one id (int32) and one float (float32) on the wire.
ID_BYTES = FLOAT_BYTES = 4
#: How many of the last steps' losses ``loss_end`` averages (one batch's loss is noisy).
LOSS_END_STEPS = 3


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class World:
    """The hidden ground truth the synthetic clicks come from (never seen by the model)."""

    user_cdf: np.ndarray  # Zipf-like popularity of the users, cumulative
    item_cdf: np.ndarray
    user_vectors: np.ndarray  # hidden taste of each user
    item_vectors: np.ndarray
    item_bias: np.ndarray  # how clickable each item is
    bias: float  # sets the overall click rate (about 1 in 4)


def _zipf_cdf(n: int, exponent: float) -> np.ndarray:
    """Cumulative probabilities of ids ``0..n-1`` with ``P(k)`` proportional to ``1/(k+1)^exponent``."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def make_world(settings: Settings, latent: int = 8) -> World:
    """The ground truth of ``settings.seed``: the same on every rank, without any message."""
    rng = np.random.default_rng([settings.seed, 0])
    scale = 1.5 / np.sqrt(latent)
    return World(
        user_cdf=_zipf_cdf(settings.users, 1.05),
        item_cdf=_zipf_cdf(settings.items, 1.05),
        user_vectors=rng.normal(0, scale, (settings.users, latent)),
        item_vectors=rng.normal(0, scale, (settings.items, latent)),
        item_bias=rng.normal(0, 1.0, settings.items),
        bias=-1.5,
    )


def batch(world: World, settings: Settings, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``worker``'s examples at step ``step``: ``ids`` (batch x 2, int32: the user's
    row and the item's row of the table, items after the users) and ``labels`` (float32
    clicks, 1 or 0). Deterministic: seed ``(settings.seed, worker, step)``."""
    rng = np.random.default_rng([settings.seed, 1, worker, step])
    n = settings.batch_size
    users = np.minimum(np.searchsorted(world.user_cdf, rng.random(n), side="right"), settings.users - 1)
    items = np.minimum(np.searchsorted(world.item_cdf, rng.random(n), side="right"), settings.items - 1)
    logit = world.bias + world.item_bias[items] + np.sum(world.user_vectors[users] * world.item_vectors[items], 1)
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    ids = np.stack([users, settings.users + items], axis=1).astype(np.int32)
    return ids, labels


def init_params(settings: Settings) -> tuple[np.ndarray, list[np.ndarray]]:
    """The starting ``table`` (rows x dim) and MLP weights, from ``settings.seed``: every
    rank computes the same ones, so no broadcast is needed (nor counted)."""
    rng = np.random.default_rng([settings.seed, 2])
    table = rng.normal(0, 0.1, (settings.table_rows, settings.dim)).astype(np.float32)
    dense = []
    for shape in dense_shapes(settings.dim, settings.hidden):
        if len(shape) == 1:
            dense.append(np.zeros(shape, np.float32))
        else:  # Glorot uniform
            limit = np.sqrt(6.0 / (shape[0] + shape[1]))
            dense.append(rng.uniform(-limit, limit, shape).astype(np.float32))
    return table, dense


# ----------------------------------------------------------------------------- bytes


def ring_bytes(nbytes: float, ranks: int) -> float:
    """Bytes each rank sends (and as many it receives) in a ring all-reduce of ``nbytes``:
    ``2 (N-1)/N x nbytes`` (a reduce-scatter, then an all-gather, of N-1 chunks each)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks!r}")
    return 2 * (ranks - 1) / ranks * nbytes


def message_bytes(
    mode: str, workers: int, unique_rows: int, dim: int, dense_params: int, table_rows: int
) -> dict[str, float]:
    """What one worker sends and receives in one step, by category, in bytes.

    ``unique_rows``: the distinct table rows its batch touches. ``ps`` and ``hybrid``
    pull (send the ids, get the rows) and push (the ids again and one summed gradient
    row per id): the *sparse* bytes. ``ps`` also pulls the dense weights and pushes
    their gradients; ``hybrid`` all-reduces the dense gradients over the workers' ring;
    ``allreduce`` all-reduces the whole model, the table's gradient made dense.
    Returns ``sparse_sent``, ``sparse_received``, ``dense_sent``, ``dense_received``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rows = unique_rows * dim * FLOAT_BYTES
    dense = dense_params * FLOAT_BYTES
    if mode == "allreduce":
        ring = ring_bytes(dense + table_rows * dim * FLOAT_BYTES, workers)
        return {"sparse_sent": 0.0, "sparse_received": 0.0, "dense_sent": ring, "dense_received": ring}
    out = {"sparse_sent": 2.0 * unique_rows * ID_BYTES + rows, "sparse_received": float(rows)}
    ring = ring_bytes(dense, workers)
    out["dense_sent"] = float(dense) if mode == "ps" else ring
    out["dense_received"] = float(dense) if mode == "ps" else ring
    return out


# ----------------------------------------------------------------------------- parameter server


def serve(settings: Settings, comm, workers: int) -> dict:
    """Rank 0 in ``ps`` and ``hybrid`` mode: hold the table (and in ``ps`` mode the dense
    weights); every step, answer every worker's pull, wait for every worker's push,
    apply the average (synchronous SGD). NumPy only: the PS never imports TensorFlow."""
    from mpi4py import MPI

    with_dense = settings.mode == "ps"
    table, dense = init_params(settings)
    flat = np.concatenate([w.ravel() for w in dense]) if with_dense else np.empty(0, np.float32)
    most = 2 * settings.batch_size  # at most two rows per example
    ids_in = [np.empty(most, np.int32) for _ in range(workers)]
    rows_in = [np.empty((most, settings.dim), np.float32) for _ in range(workers)]
    dense_in = [np.empty_like(flat) for _ in range(workers)]
    sent = received = 0
    for _ in range(settings.warmup + settings.steps):
        # Pull: every worker's ids, then its rows (and the dense weights) back, all at once.
        status = [MPI.Status() for _ in range(workers)]
        MPI.Request.Waitall([comm.Irecv(ids_in[w], source=w + 1, tag=TAG_PULL) for w in range(workers)], status)
        wanted = [ids_in[w][: s.Get_count(MPI.INT32_T)].copy() for w, s in enumerate(status)]
        rows_out = [table[ids] for ids in wanted]
        requests = [comm.Isend(rows_out[w], dest=w + 1, tag=TAG_ROWS) for w in range(workers)]
        if with_dense:
            requests += [comm.Isend(flat, dest=w + 1, tag=TAG_DENSE) for w in range(workers)]
        MPI.Request.Waitall(requests)
        # Push: ids and summed rows (and dense gradients) from every worker.
        requests = [comm.Irecv(ids_in[w], source=w + 1, tag=TAG_PUSH_IDS) for w in range(workers)]
        requests += [comm.Irecv(rows_in[w], source=w + 1, tag=TAG_PUSH_ROWS) for w in range(workers)]
        if with_dense:
            requests += [comm.Irecv(dense_in[w], source=w + 1, tag=TAG_PUSH_DENSE) for w in range(workers)]
        status = [MPI.Status() for _ in requests]
        MPI.Request.Waitall(requests, status)
        # Apply the average of the workers' gradients: each worker's ids are distinct.
        for w, s in enumerate(status[:workers]):
            k = s.Get_count(MPI.INT32_T)
            table[ids_in[w][:k]] -= (settings.embedding_learning_rate / workers) * rows_in[w][:k]
            received += 2 * k * ID_BYTES + rows_in[w][:k].nbytes
        if with_dense:
            flat -= (settings.learning_rate / workers) * np.sum(dense_in, axis=0)
        sent += sum(r.nbytes for r in rows_out) + workers * flat.nbytes
        received += workers * flat.nbytes
    steps = settings.warmup + settings.steps
    return report.result(
        role="ps",
        rank=0,
        mode=settings.mode,
        workers=workers,
        sent_per_step=sent / steps,
        received_per_step=received / steps,
    )


# ----------------------------------------------------------------------------- workers


class _MLP:
    """The dense part, TensorFlow variables: ``loss(vectors, labels)`` is the batch's mean
    sigmoid cross-entropy given each example's user and item vectors."""

    def __init__(self, tf, weights: list[np.ndarray]):
        self.tf = tf
        self.vars = [tf.Variable(w) for w in weights]

    def loss(self, vectors, labels):
        tf = self.tf
        w1, b1, w2, b2, w3, b3 = self.vars
        h = tf.nn.relu(vectors @ w1 + b1)
        h = tf.nn.relu(h @ w2 + b2)
        logits = tf.squeeze(h @ w3 + b3, axis=1)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))

    def assign_flat(self, flat: np.ndarray) -> None:
        """Set every weight from one flat vector (what the PS sends in ``ps`` mode)."""
        start = 0
        for v in self.vars:
            n = int(np.prod(v.shape))
            v.assign(flat[start : start + n].reshape(v.shape))
            start += n

    def apply(self, grads, rate: float) -> None:
        for v, g in zip(self.vars, grads, strict=True):
            v.assign_sub(rate * g)


#: ``step(ids, labels, span) -> loss``: one worker's training step in one mode; it times its
#: parts with ``span(name, category)`` (:func:`lab_utils.report.span`, or :func:`_untimed`).
StepFn = Callable[[np.ndarray, np.ndarray, Callable[[str, str], Any]], float]


def _untimed(name: str, cat: str, **_on) -> contextlib.nullcontext:
    """:func:`lab_utils.report.span`'s stand-in in an unreported (warm-up) step."""
    return contextlib.nullcontext()


def _ps_worker_step(settings: Settings, comm, tf, mlp: _MLP, hvd) -> StepFn:
    """``ps`` / ``hybrid``: pull the batch's rows (and in ``ps`` mode the dense weights),
    compute, push the rows' gradients (and the dense ones); ``hybrid`` all-reduces the
    dense gradients with Horovod while its push travels, and applies them itself. Its parts:
    ``pull`` (which waits for the PS to have every worker's ids), ``forward/backward``, then
    ``push`` (``ps``), or ``allreduce``, ``apply`` and what is left of the ``push`` (``hybrid``)."""
    from mpi4py import MPI

    flat = np.empty(sum(int(np.prod(v.shape)) for v in mlp.vars), np.float32)
    others = report.peers(range(1, comm.Get_size())) or None  # the other workers (rank 0 serves)

    def step(ids: np.ndarray, labels: np.ndarray, span=report.span) -> float:
        wanted, where = np.unique(ids, return_inverse=True)
        wanted = wanted.astype(np.int32)
        with span("pull", "comm", on=others):  # the PS answers once every worker has asked
            comm.Send(wanted, dest=0, tag=TAG_PULL)
            rows = np.empty((len(wanted), settings.dim), np.float32)
            comm.Recv(rows, source=0, tag=TAG_ROWS)
            if hvd is None:
                comm.Recv(flat, source=0, tag=TAG_DENSE)
                mlp.assign_flat(flat)
        with span("forward/backward", "compute"):
            rows = tf.constant(rows)
            with tf.GradientTape() as tape:
                tape.watch(rows)
                vectors = tf.reshape(tf.gather(rows, where.reshape(ids.shape)), (len(ids), 2 * settings.dim))
                loss = mlp.loss(vectors, labels)
            row_grads, *grads = tape.gradient(loss, [rows, *mlp.vars])
            # tf.gather's gradient is IndexedSlices (one row per example); summed per distinct row:
            row_grads = tf.convert_to_tensor(row_grads).numpy()
        push = [comm.Isend(wanted, dest=0, tag=TAG_PUSH_IDS), comm.Isend(row_grads, dest=0, tag=TAG_PUSH_ROWS)]
        if hvd is None:
            with span("push", "comm"):
                grads = np.concatenate([g.numpy().ravel() for g in grads])
                push.append(comm.Isend(grads, dest=0, tag=TAG_PUSH_DENSE))
                MPI.Request.Waitall(push)
        else:
            with span("allreduce", "comm", on=others):  # while the push travels
                grads = hvd.grouped_allreduce(grads, op=hvd.Average)
            with span("apply", "compute"):
                mlp.apply(grads, settings.learning_rate)
            with span("push", "comm"):  # what is left of it
                MPI.Request.Waitall(push)
        return float(loss)

    return step


def _allreduce_worker_step(settings: Settings, tf, mlp: _MLP, table: np.ndarray, hvd) -> StepFn:
    """``allreduce``: a full copy of the table on every worker; Horovod averages every
    gradient, the table's made dense (``sparse_as_dense=True``): 12.8 MB, mostly zeros.
    One part: the all-reduce runs inside ``tape.gradient``, with the backward pass (Horovod's
    own timeline splits them), so the step is one span ``on`` the other workers: on the
    timeline, its wait for the last of them to begin its own."""
    table = tf.Variable(table)
    others = report.peers() or None

    def step(ids: np.ndarray, labels: np.ndarray, span=report.span) -> float:
        with span("forward/backward, all-reduce, update", "compute", on=others):
            with tf.GradientTape() as tape:
                vectors = tf.reshape(tf.gather(table, ids), (len(ids), 2 * settings.dim))
                loss = mlp.loss(vectors, labels)
            tape = hvd.DistributedGradientTape(tape, sparse_as_dense=True, op=hvd.Average)
            table_grad, *grads = tape.gradient(loss, [table, *mlp.vars])
            table.assign_sub(settings.embedding_learning_rate * table_grad)
            mlp.apply(grads, settings.learning_rate)
        return float(loss)

    return step


def work(settings: Settings, comm, worker: int, workers: int) -> dict:
    """One worker's run: its batches, the mode's step, timings, losses and bytes."""
    from lab_utils.models import import_tensorflow

    tf = import_tensorflow()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per worker, as on its own host
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd = None
    if settings.mode != "ps":
        import horovod.tensorflow as hvd

        # hybrid: Horovod's world is the workers only (the PS took no part in this split's color).
        hvd.init(comm=comm.Split(1, worker) if settings.mode == "hybrid" else None)
    table, dense = init_params(settings)
    mlp = _MLP(tf, dense)
    if settings.mode == "allreduce":
        step_fn = _allreduce_worker_step(settings, tf, mlp, table, hvd)
    else:
        step_fn = _ps_worker_step(settings, comm, tf, mlp, hvd)
    world = make_world(settings)
    times, losses, uniques = [], [], []
    totals = dict.fromkeys(("sparse_sent", "sparse_received", "dense_sent", "dense_received"), 0.0)
    for t in range(settings.warmup + settings.steps):
        t0 = time.time()  # the step's bar on the timeline: drawing the batch is its "other"
        if t >= settings.warmup:
            report.straggle()  # LABS_STRAGGLER: this worker made slow, every timed step
        ids, labels = batch(world, settings, worker, t)
        started = time.perf_counter()
        losses.append(step_fn(ids, labels, report.span if t >= settings.warmup else _untimed))
        elapsed = time.perf_counter() - started
        uniques.append(len(np.unique(ids)))
        sizes = message_bytes(
            settings.mode, workers, uniques[-1], settings.dim, settings.dense_params, settings.table_rows
        )
        for key, value in sizes.items():
            totals[key] += value
        if t >= settings.warmup:
            times.append(elapsed)
            done = t - settings.warmup + 1
            report.step(done - 1, done * settings.batch_size, started=t0, loss=losses[-1], seconds=elapsed)
    n = settings.warmup + settings.steps
    return report.result(
        role="worker",
        rank=comm.Get_rank(),
        worker=worker,
        workers=workers,
        mode=settings.mode,
        step_s=statistics.median(times),
        examples_per_s=settings.batch_size / statistics.median(times),
        batch_size=settings.batch_size,
        loss_start=losses[0],
        loss_end=statistics.mean(losses[-LOSS_END_STEPS:]),
        unique_rows=statistics.mean(uniques),
        table_bytes=settings.table_rows * settings.dim * FLOAT_BYTES,
        dense_bytes=settings.dense_params * FLOAT_BYTES,
        **{f"{key}_per_step": value / n for key, value in totals.items()},
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Rank 0 serves (``ps``, ``hybrid``), every other rank trains."""
    settings = parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    has_ps = settings.mode != "allreduce"
    if has_ps and size < 2:
        make_parser().error(f"--mode {settings.mode} needs a PS and at least one worker: np >= 2, got {size}")
    workers = size - 1 if has_ps else size
    try:
        if has_ps and rank == 0:
            if settings.mode == "hybrid":
                comm.Split(MPI.UNDEFINED, 0)  # collective: the workers' communicator, without the PS
            serve(settings, comm, workers)
        else:
            work(settings, comm, rank - 1 if has_ps else rank, workers)
    except BaseException:  # noqa: B036 - any failure: the other ranks would wait for this one forever
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)  # ends every rank (what ``python -m mpi4py`` does for an uncaught exception)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
