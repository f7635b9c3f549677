"""Torch's intra-op threads go to the model worker alone.

torch on Linux runs its parallel operators on OpenMP (libgomp), which keeps a pool of threads
for each thread that has run one. Once the pools hold more threads than there are cores,
libgomp stops spinning between parallel regions and wakes its threads through the kernel for
every one of them. So the model worker's operators got slower merely because the thread that
loaded the model had a pool as well, idle or not. Measured on this project's 2-core machine:
an elementwise add of 200,000 floats took 17 us from the loading thread and 62 us from a
second one; `torch._int_mm` of one row by a 1536x576 weight, 15 us and 88 us; one int8 decode
step of the bundled model in the scheduler's worker at 200 tokens of context, 72 ms before this
module and 33 ms after it.

So a thread holds a pool only while it runs the model. The loader and the thread that starts
the model's worker give theirs up: they go down to one intra-op thread and hand the pool back
to libgomp (`omp_pause_resource`). Threads that first run torch after that (a server's request
threads computing embeddings, say) start from torch's process-wide count, now one, and never
make a pool. The worker runs on the process's count as first seen and hands its pool back
whenever it goes idle, so two models used in turn never hold two pools. The cost: torch work
outside the model worker runs single-threaded. In chatcache that is the small embedding
model, whose sentence-sized products gain little from a second thread; a script timing the
raw model beside the engine takes the threads for that block (`model_threads`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_OMP_PAUSE_SOFT = 1  # omp_pause_soft in omp.h: the pool's threads end, nothing else is kept
_worker_threads: int | None = None
_lock = threading.Lock()


def worker_thread_count() -> int:
    """The intra-op thread count a model worker runs with: the process's, as first seen."""
    global _worker_threads
    with _lock:
        if _worker_threads is None:
            _worker_threads = torch.get_num_threads()
        return _worker_threads


def take_intra_op_threads() -> None:
    """Run this thread's torch operators on the model worker's thread count.

    `torch.set_num_threads` also sets the count that threads which have not run torch yet
    start from, so whoever takes the threads gives them up again (`give_up_intra_op_threads`)
    or has another thread do it.
    """
    count = worker_thread_count()
    torch.get_num_threads()  # torch sets a thread's count from the process-wide one on first use: first use now
    torch.set_num_threads(count)


def give_up_intra_op_threads() -> None:
    """Run this thread's torch operators on one thread, make one the count threads that have
    not run torch yet start from, and hand this thread's OpenMP pool back."""
    worker_thread_count()  # seen before it is lowered
    torch.set_num_threads(1)
    release_openmp_pool()


def _libgomp() -> ctypes.CDLL | None:
    try:
        openmp = ctypes.CDLL("libgomp.so.1")  # the copy torch loaded: one per soname in a process
        openmp.omp_pause_resource  # noqa: B018 - OpenMP 5.0's; older libgomp lacks it
    except (OSError, AttributeError):  # another OpenMP runtime, or none (macOS): nothing to hand back
        return None
    return openmp


_openmp = _libgomp()  # looked up once: the worker hands its pool back every time it goes idle


def release_openmp_pool() -> None:
    """End the threads of this thread's OpenMP pool (libgomp makes a new one when next needed)."""
    if _openmp is not None:
        _openmp.omp_pause_resource(_OMP_PAUSE_SOFT, _openmp.omp_get_initial_device())


@contextmanager
def model_threads() -> Iterator[None]:
    """Run a block's torch operators on the model worker's thread count, as a benchmark timing
    the raw model beside the engine must, and give the threads up after it."""
    take_intra_op_threads()
    try:
        yield
    finally:
        give_up_intra_op_threads()
