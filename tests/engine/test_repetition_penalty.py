"""The repetition penalty: the reply's own recent tokens lose logit, deterministically, batched or alone."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from chatcache import ConfigError
from chatcache.config import GenerationConfig
from chatcache.model.generation import generate_tokens, pick


def test_a_recent_token_loses_to_the_runner_up_and_negative_logits_sink_further() -> None:
    logits = torch.tensor([2.0, 1.9, -1.0, 0.5])
    before = logits.clone()
    penalised = GenerationConfig(repetition_penalty=1.2)
    assert pick(logits, GenerationConfig(), None, recent=[0]) == 0  # no penalty: the best one
    assert pick(logits, penalised, None, recent=[0]) == 1  # 2.0 / 1.2 < 1.9
    assert pick(logits, penalised, None, recent=[]) == 0
    assert pick(torch.tensor([-1.0, -1.1]), penalised, None, recent=[0]) == 1  # -1.2 < -1.1
    assert torch.equal(logits, before)  # the caller's logits are left as they were


@pytest.mark.parametrize("penalty", [0.9, float("nan"), True])
def test_a_penalty_that_would_reward_repeating_is_refused(penalty: float) -> None:
    with pytest.raises(ConfigError, match="repetition_penalty"):
        GenerationConfig(repetition_penalty=penalty)


def test_penalised_replies_together_equal_the_same_replies_alone(tiny_model) -> None:  # type: ignore[no-untyped-def]
    from chatcache.model.scheduler import Scheduler

    model = tiny_model.model
    prompts = [list(range(5, 5 + length)) for length in (12, 3, 8, 5)]
    params = GenerationConfig(max_new_tokens=24, repetition_penalty=1.5)
    alone = [[t.token_id for t in generate_tokens(model, DynamicCache(config=model.config), p, params, set())] for p in prompts]
    plain = [[t.token_id for t in generate_tokens(model, DynamicCache(config=model.config), p, GenerationConfig(max_new_tokens=24), set())] for p in prompts]
    assert alone != plain  # the penalty changed something
    scheduler = Scheduler(model)
    try:
        requests = [scheduler.submit(DynamicCache(config=model.config), p, params, set()) for p in prompts]
        together = [[t.token_id for t in request] for request in requests]
    finally:
        scheduler.close()
    assert together == alone


def test_a_penalised_turn_is_never_served_an_answer_the_cache_kept(tiny_model, make_engine, toy_embed) -> None:  # type: ignore[no-untyped-def]
    """Kept answers were decoded plain greedy; a penalised turn would have said something else."""
    from chatcache import TokenTierConfig

    engine = make_engine(tiny_model, system_prompt="Be brief.", token_tier=TokenTierConfig(enabled=False), answer_cache=True, embedder=toy_embed)
    question = "What are your opening hours?"
    engine.sessions.create("a")
    scope = engine.turns.answer_scope("a", question)
    engine.answer_cache.store(question, "Nine to five.", scope.scope, entropy_bits=0.1, latency_ms=100, embedding=None)
    served = engine.chat("a", question, max_new_tokens=8)
    assert served.stats.answer_cache_hit and served.text == "Nine to five."
    penalised = engine.chat("b", question, max_new_tokens=8, repetition_penalty=1.3)
    assert not penalised.stats.answer_cache_hit and penalised.stats.generated_tokens > 0
