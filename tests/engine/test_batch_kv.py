"""The decode batch's buffers: as large as the rows and positions in use, and given back when idle."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from chatcache.model.batch_kv import BLOCK, BatchKV


def _prefilled(chat_model, length: int) -> DynamicCache:  # type: ignore[no-untyped-def]
    cache = DynamicCache(config=chat_model.model.config)
    with torch.no_grad():
        chat_model.model(input_ids=torch.randint(0, 100, (1, length)), cache=cache, use_cache=True)
    return cache


def _shape(batch: BatchKV) -> tuple[int, ...]:
    return tuple(batch.layers[0].keys.shape)  # type: ignore[union-attr]


def test_rows_grow_only_for_rows_and_idle_buffers_are_freed(tiny_model) -> None:  # type: ignore[no-untyped-def]
    config = tiny_model.model.config
    batch = BatchKV(config)
    for length in (10, 300, 700, 1200):  # ever longer contexts, two at a time
        first, second = _prefilled(tiny_model, length), _prefilled(tiny_model, length + 1)
        batch.join(first, room=8)
        batch.join(second, room=8)
        rows, positions = _shape(batch)[0], _shape(batch)[2]
        assert rows == 2, f"two rows in use, {rows} allocated (positions grew to {positions})"
        assert positions == -(-(length + 1 + 8) // BLOCK) * BLOCK
        left, _ = batch.leave(0, config)
        assert torch.equal(left.layers[0].keys, first.layers[0].keys), "a row leaves with its own KV"
        batch.leave(0, config)
        assert batch.layers[0].keys.numel() == 0, "an empty batch holds no buffers"  # type: ignore[union-attr]
    for _ in range(3):
        batch.join(_prefilled(tiny_model, 5), room=4)
    assert _shape(batch)[0] == 4, "a missing row doubles the rows"
