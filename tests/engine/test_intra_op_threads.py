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
