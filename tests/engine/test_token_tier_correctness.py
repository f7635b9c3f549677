"""The token tier must never change what the model says: every turn is compared with a full recompute."""

from __future__ import annotations

import threading

import pytest
import torch

from chatcache import TokenTierConfig
from chatcache.model.generation import forward
from chatcache.model.kv import new_cache

SYSTEM = "You are a test bot that answers questions about bookings."
TURNS = ["Hello there", "Book a table for two", "What about the weather in Paris?", "ok", "Transfer 200 dollars"]


def engines(make_engine, model, **tier):  # type: ignore[no-untyped-def]
    cached = make_engine(model, system_prompt=SYSTEM, token_tier=TokenTierConfig(**tier))
    uncached = make_engine(model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    return cached, uncached


def checked_out_whole(tier, session: str, ids: list[int], probe: list[int]):  # type: ignore[no-untyped-def]
    """The session's KV for `ids` (what it holds), as a turn whose prompt goes on with `probe`
    checks it out: all of it, cropped to nothing. The checkout is cancelled: the KV is the caller's."""
    checkout = tier.checkout(session, ids + probe, [], reserve_tokens=len(ids) + len(probe))
    tier.release(session)
    assert checkout.tier == "session" and checkout.reused == len(ids)
    return checkout.cache


def test_multi_turn_replies_equal_full_recompute(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    cached, uncached = engines(make_engine, tiny_model)
    for turn, text in enumerate(TURNS):
        got = cached.chat("s", text, max_new_tokens=24)
        want = uncached.chat("s", text, max_new_tokens=24)
        assert got.token_ids == want.token_ids
        assert want.stats.reused_tokens == 0
        assert got.stats.prompt_tokens == want.stats.prompt_tokens
        # The first turn reuses the shared system prompt, later ones the whole conversation so far.
        assert got.stats.tier == ("prefix" if turn == 0 else "session")
        assert got.stats.reused_tokens + got.stats.prefilled_tokens == got.stats.prompt_tokens
    assert got.stats.reused_tokens > got.stats.prompt_tokens // 2


def test_logits_at_reused_position_match_recompute(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine, _ = engines(make_engine, tiny_model)
    engine.chat("s", "Hello there", max_new_tokens=12)
    engine.chat("s", "Book a table", max_new_tokens=12)
    ids = engine.token_tier.session_kv("s").ids
    probe = [ids[-1]]
    cache = checked_out_whole(engine.token_tier, "s", ids, probe)
    reused = forward(tiny_model.model, probe, cache)
    full = forward(tiny_model.model, ids + probe, new_cache(tiny_model.model.config))
    assert torch.allclose(reused, full, atol=1e-4)


def test_exact_full_hit_leaves_one_token_to_prefill(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine, _ = engines(make_engine, tiny_model)
    engine.chat("s", "Hello there", max_new_tokens=8)
    tier = engine.token_tier
    ids = tier.session_kv("s").ids
    checkout = tier.checkout("s", ids, [], reserve_tokens=len(ids))
    assert checkout.reused == len(ids) - 1
    assert checkout.cache.get_seq_length() == len(ids) - 1
    logits = forward(tiny_model.model, ids[-1:], checkout.cache)
    full = forward(tiny_model.model, ids, new_cache(tiny_model.model.config))
    assert torch.allclose(logits, full, atol=1e-4)


def test_shared_prefix_is_never_changed_by_sessions(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine, uncached = engines(make_engine, tiny_model)
    tier, prefix = engine.token_tier, engine.system_ids
    first = engine.chat("a", "Hello there", max_new_tokens=10)
    assert tier.stats().prefixes == 1

    def prefix_copy(session: str) -> list[torch.Tensor]:
        """The shared prefix's KV as a new session is handed it: a copy of the whole of it."""
        checkout = tier.checkout(session, [*prefix, 42], prefix, reserve_tokens=len(prefix) + 1)
        tier.release(session)
        assert checkout.tier == "prefix" and checkout.cache.get_seq_length() == len(prefix)
        return [layer.keys for layer in checkout.cache.layers]

    keys_before = prefix_copy("probe-before")
    second = engine.chat("b", "Hello there", max_new_tokens=10)
    engine.chat("a", "Book a table", max_new_tokens=10)
    assert second.stats.tier == "prefix"
    assert second.stats.reused_tokens == len(engine.system_ids)
    assert second.token_ids == first.token_ids == uncached.chat("x", "Hello there", max_new_tokens=10).token_ids
    assert tier.stats().prefixes == 1  # the same one, no longer and no other
    for keys, before in zip(prefix_copy("probe-after"), keys_before, strict=True):
        assert torch.equal(keys, before)


def test_sessions_in_parallel_threads_match_sequential(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine, uncached = engines(make_engine, tiny_model)
    results: dict[str, list[list[int]]] = {}

    def converse(session: str) -> None:
        results[session] = [engine.chat(session, text, max_new_tokens=10).token_ids for text in TURNS[:3]]

    threads = [threading.Thread(target=converse, args=(f"s{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    want = [uncached.chat("ref", text, max_new_tokens=10).token_ids for text in TURNS[:3]]
    assert all(results[f"s{i}"] == want for i in range(4))


def test_turns_of_one_session_are_serialized(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine, _ = engines(make_engine, tiny_model)
    threads = [threading.Thread(target=engine.chat, args=("s", f"message {i}"), kwargs={"max_new_tokens": 8}) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    roles = [m.role for m in engine.sessions.history("s")]
    assert roles == ["user", "assistant"] * 4
    ids = engine.token_tier.session_kv("s").ids
    assert checked_out_whole(engine.token_tier, "s", ids, [42]).get_seq_length() == len(ids)


@pytest.mark.parametrize("max_new_tokens", [1, 5])
def test_short_replies_keep_the_cache_consistent(make_engine, tiny_model, max_new_tokens: int) -> None:  # type: ignore[no-untyped-def]
    cached, uncached = engines(make_engine, tiny_model)
    for text in TURNS[:3]:
        assert (
            cached.chat("s", text, max_new_tokens=max_new_tokens).token_ids
            == uncached.chat("s", text, max_new_tokens=max_new_tokens).token_ids
        )
