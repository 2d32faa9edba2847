"""One Horovod rank of bench_allreduce.py: time ``hvd.allreduce`` (op=Sum) of one float32 tensor.

    horovodrun -np 2 --gloo python bench/hvd_allreduce_task.py --nbytes 67108864 --repeats 10

Every rank makes ``--warmup`` untimed all-reduces (Horovod's first cycles allocate
and negotiate), then ``--repeats`` timed ones, each after a tiny all-reduce that
lines the ranks up (a barrier). A timed all-reduce ends when a slice of its output
is read with ``.numpy()``: that forces completion without copying 64 MB out.
Rank 0 reports the slowest rank's time of each repeat and their median
(the convention of ``lab_utils.training.allreduce.ring_check``'s ``busbw``).
"""

import argparse
import statistics
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from lab_utils import report

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--nbytes", type=int, default=64 * 1024**2, help="message size in bytes (float32)")
p.add_argument("--repeats", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
args = p.parse_args()
if args.nbytes < 4 or args.repeats < 1 or args.warmup < 0:
    p.error(f"need --nbytes >= 4, --repeats >= 1, --warmup >= 0; got {args.nbytes}, {args.repeats}, {args.warmup}")

hvd.init()
x = tf.ones([args.nbytes // 4], dtype=tf.float32)
zero = tf.constant(0.0)


def allreduce() -> None:
    hvd.allreduce(x, op=hvd.Sum, name="bench_big")[-1:].numpy()


for _ in range(args.warmup):
    allreduce()
times = []
for _ in range(args.repeats):
    hvd.allreduce(zero, op=hvd.Sum, name="bench_barrier").numpy()
    start = time.perf_counter()
    allreduce()
    times.append(time.perf_counter() - start)
# every rank's times: [size, repeats]; a repeat lasts as long as its slowest rank
every = hvd.allgather(tf.constant([times], dtype=tf.float64), name="bench_times").numpy()
slowest = every.max(axis=0).tolist()
if hvd.rank() == 0:
    report.result(
        seconds=statistics.median(slowest),
        times=slowest,
        nbytes=int(x.shape[0]) * 4,
        size=hvd.size(),
        controller="mpi" if hvd.mpi_enabled() else "gloo",
        repeats=args.repeats,
        warmup=args.warmup,
    )
