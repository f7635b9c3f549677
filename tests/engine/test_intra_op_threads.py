"""Torch's intra-op threads belong to the model worker: every other thread runs torch on one.

Two OpenMP pools on the same cores made each parallel operator of the worker wait on the kernel
(see `chatcache.model.intra_op_threads`); these tests pin down who holds the threads, with the
worker and the threads around it really running side by side.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from chatcache.config import GenerationConfig
from chatcache.model.intra_op_threads import model_threads, worker_thread_count
from chatcache.model.scheduler import Scheduler


def _run_in_new_thread(work: Any) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join()
    return result[0]


def test_the_worker_decodes_on_the_threads_and_its_maker_and_later_threads_on_one(tiny_model: Any) -> None:
    from transformers import DynamicCache

    model = tiny_model.model
    seen: list[tuple[str, int]] = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append((threading.current_thread().name, torch.get_num_threads())))

    def make_scheduler_and_decode() -> tuple[int, list[int]]:
        scheduler = Scheduler(model)
        try:
            maker_threads = torch.get_num_threads()
            request = scheduler.submit(DynamicCache(config=model.config), [5, 6, 7], GenerationConfig(max_new_tokens=4), set())
            return maker_threads, [token.token_id for token in request]
        finally:
            scheduler.close()

    try:
        maker_threads, reply = _run_in_new_thread(make_scheduler_and_decode)
    finally:
        hook.remove()
    assert len(reply) == 4
    assert maker_threads == 1
    assert seen and all(entry == ("chatcache-model", worker_thread_count()) for entry in seen)

    def later_thread_count() -> int:
        torch.ones(4) + 1  # its first torch operator initialises its thread count
        return torch.get_num_threads()

    assert _run_in_new_thread(later_thread_count) == 1


def test_a_block_timing_the_raw_model_takes_the_threads_and_gives_them_back() -> None:
    def inside_and_after() -> tuple[int, int]:
        with model_threads():
            inside = torch.get_num_threads()
        return inside, torch.get_num_threads()

    assert _run_in_new_thread(inside_and_after) == (worker_thread_count(), 1)


HAND_BACK_UNDER_THREADS = r"""
import os, threading, time, torch
from chatcache.model.intra_op_threads import release_openmp_pool

def tasks():
    return len(os.listdir("/proc/self/task"))

a, b = torch.randn(200_000), torch.randn(200_000)
m = torch.randn(256, 256)
added, product = a + b, m @ m

def ended_by_hand_back():
    torch.set_num_threads(3)  # a pool of two threads besides this one
    a + b
    release_openmp_pool()  # torch's own lazily made threads are there from now on
    a + b
    pooled = tasks()
    release_openmp_pool()
    deadline = time.monotonic() + 5
    while tasks() > pooled - 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return pooled - tasks()

ended = []
alone = threading.Thread(target=lambda: ended.append(ended_by_hand_back()))
alone.start()
alone.join()

wrong = []
def run():
    torch.set_num_threads(2)  # each thread makes a pool of its own, as the model worker does
    for _ in range(150):
        if not torch.equal(a + b, added) or not torch.allclose(m @ m, product, rtol=1e-4, atol=1e-3):
            wrong.append(1)
        release_openmp_pool()  # while the other threads run their parallel operators

workers = [threading.Thread(target=run) for _ in range(4)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(ended[0], len(wrong))
"""


def test_pools_handed_back_from_many_threads_at_once_end_and_compute_right() -> None:
    """`release_openmp_pool` goes through ctypes into libgomp from several threads while others
    run parallel operators (the worker when it goes idle, loaders and makers as they give their
    threads up). In a process of its own, so that a crash shows as its exit status: a thread's
    pool of two threads ends when handed back; then four threads each run 150 rounds of a
    parallel add and matmul and hand their pools back, and every result is right."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HAND_BACK_UNDER_THREADS], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    pool_threads_ended, wrong = map(int, done.stdout.split())
    assert pool_threads_ended == 2
    assert wrong == 0
