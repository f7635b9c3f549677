"""The same guarantees on the real models that ship in PyPI packages (SmolLM2-135M, MiniLM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from chatcache import TokenTierConfig, load_chat_model, load_embedder
from chatcache.model.generation import forward
from chatcache.model.kv import new_cache

from .test_token_tier_correctness import checked_out_whole

pytestmark = pytest.mark.bundled
SYSTEM = "You are a concise assistant for a travel agency."
TURNS = ["Hi! Can you help me plan a trip?", "I want to go to Rome in May.", "What should I pack?"]


def test_bundled_model_loads_once_per_process(bundled_model) -> None:  # type: ignore[no-untyped-def]
    assert bundled_model.tokenizer.chat_template
    assert bundled_model.context_window == 8192
    assert load_chat_model("bundled", device="cpu") is bundled_model


def test_bundled_replies_equal_full_recompute_and_restore_exactly(make_engine, bundled_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cached = make_engine(bundled_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path))
    uncached = make_engine(bundled_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    for turn, text in enumerate(TURNS):
        if turn == 2:
            cached.token_tier.unload("s")  # the last turn comes back from disk
        got = cached.chat("s", text, max_new_tokens=24)
        want = uncached.chat("s", text, max_new_tokens=24)
        assert got.token_ids == want.token_ids
        assert got.text.strip()
    assert got.stats.tier == "disk"
    assert got.stats.reused_tokens > 0.7 * got.stats.prompt_tokens


def test_bundled_logits_at_reused_positions_match_recompute(make_engine, bundled_model) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(bundled_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    engine.chat("s", TURNS[0], max_new_tokens=16)
    engine.chat("s", TURNS[1], max_new_tokens=16)
    ids = engine.token_tier.session_kv("s").ids
    probe = bundled_model.tokenizer.encode("And", add_special_tokens=False)
    reused = forward(bundled_model.model, probe, checked_out_whole(engine.token_tier, "s", ids, probe))
    full = forward(bundled_model.model, ids + probe, new_cache(bundled_model.model.config))
    assert torch.allclose(reused, full, atol=1e-4)


def test_bundled_embedder_embeds_and_is_cached() -> None:
    embedder = load_embedder("bundled", device="cpu")
    assert load_embedder("bundled", device="cpu") is embedder
    vectors = embedder.encode(["book a table", "reserve a table", "what is the weather"], normalize_embeddings=True)
    assert vectors.shape == (3, 384)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


def test_fast_embedding_path_gives_the_same_vectors_as_encode() -> None:
    from chatcache.steering.hcac import sentence_embed

    embedder = load_embedder("bundled", device="cpu")
    texts = ["book a table", "What will the weather be like in Paris tomorrow, and should I take an umbrella?"]
    fast = sentence_embed(embedder)(texts)
    reference = embedder.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert fast.shape == reference.shape
    assert float(abs(fast - reference).max()) < 1e-5


def test_kept_embeddings_equal_fresh_ones_and_are_shared_by_every_engine_on_the_embedder() -> None:
    from chatcache.steering.hcac import KEPT_EMBEDDINGS, sentence_embed

    embedder = load_embedder("bundled", device="cpu")
    texts = ["my card has not arrived", "what rate do you exchange at", "my card has not arrived"]
    first = sentence_embed(embedder)(texts)
    calls: list[list[str]] = []
    original = embedder[0].auto_model.forward

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs.get("input_ids", args[0] if args else None))
        return original(*args, **kwargs)

    embedder[0].auto_model.forward = counting
    try:
        again = sentence_embed(embedder)(texts)  # another engine's Embed on the same embedder
        mixed = sentence_embed(embedder)(["what rate do you exchange at", "a text nobody embedded before"])
    finally:
        del embedder[0].auto_model.forward
    assert np.array_equal(first, again) and len(calls) == 1  # only the new text was computed
    reference = embedder.encode([*texts[:2], "a text nobody embedded before"], normalize_embeddings=True)
    assert float(abs(first[:2] - reference[:2]).max()) < 1e-5 and float(abs(mixed[1] - reference[2]).max()) < 1e-5
    assert np.array_equal(first[0], first[2]) and KEPT_EMBEDDINGS >= 10_000
