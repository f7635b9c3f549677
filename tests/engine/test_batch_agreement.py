"""Replies under load against the uncached path (`chatcache.evals.batching`): conversations run
together on the scheduler, every turn answered again alone on a fresh cache."""

from __future__ import annotations

import pytest

from chatcache import ChatModel, load_chat_model
from chatcache.evals.batching import NEAR_TIE, _agreement, compare_with_uncached, run_together

SYSTEM = "You are a customer-service assistant for a restaurant booking service. Answer briefly."
CONVERSATIONS = [
    ["Hi, I need a table for tonight.", "Four people, at eight.", "Do you have vegetarian dishes?"],
    ["What time do you open on Sundays?", "And on holidays?", "Thanks a lot."],
    ["Can I change my booking?", "It is under the name Smith.", "Make it nine instead."],
    ["Is there parking nearby?", "How much does it cost?", "Great, see you then."],
    ["Do you take credit cards?", "What about cash?", "Okay."],
    ["I'd like to cancel my reservation.", "For tomorrow at seven.", "No, that's all."],
    ["Are dogs allowed on the terrace?", "Even big ones?", "Perfect."],
    ["Do you have a kids menu?", "Until what age?", "Thank you."],
]


def _own(model):  # type: ignore[no-untyped-def]
    return ChatModel(model.name, model.model, model.tokenizer, model.identity)


@pytest.mark.parametrize("precision", ["exact", "int8"])
def test_tiny_model_replies_together_equal_the_uncached_path(precision, tiny_model_dir, make_engine) -> None:  # type: ignore[no-untyped-def]
    model = _own(load_chat_model(str(tiny_model_dir), device="cpu", precision=precision))
    engine = make_engine(model, system_prompt=SYSTEM)
    sessions = run_together(engine, CONVERSATIONS[:6], max_new_tokens=10)
    assert model.scheduler.peak_running > 1
    report = compare_with_uncached(engine, sessions, max_new_tokens=10)
    assert len(report.turns) == 18
    assert report.equal_fraction == 1.0, report.as_dict()
    model.close()


def test_a_difference_that_is_no_near_tie_is_flagged(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """The check itself can fail: a reply changed at a token the model was sure of is unexplained."""
    from transformers import DynamicCache

    from chatcache.model.generation import forward

    model = tiny_model.model
    prompt = tiny_model.tokenizer.encode("hello there, how are you")
    logits = forward(model, prompt, DynamicCache(config=model.config))
    best, runner_up = (int(i) for i in logits.topk(2).indices)
    agreement = _agreement(model, 0, 0, prompt, [runner_up], [best])
    assert agreement.picked_runner_up and agreement.top2_gap is not None
    assert (agreement.top2_gap < NEAR_TIE) == (float(logits[best] - logits[runner_up]) < NEAR_TIE)
    worst = int(logits.argmin())
    assert not _agreement(model, 0, 0, prompt, [worst], [best]).picked_runner_up


@pytest.mark.bundled
def test_bundled_model_differs_under_load_only_at_near_ties(bundled_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    model = _own(bundled_model)
    engine = make_engine(model, system_prompt=SYSTEM)
    # Six conversations of 24-token replies keep the suite short; bench.batch_agreement runs more.
    sessions = run_together(engine, CONVERSATIONS[:6], max_new_tokens=24)
    assert model.scheduler.peak_running >= 4
    report = compare_with_uncached(engine, sessions, max_new_tokens=24)
    assert len(report.turns) == 18
    assert report.unexplained == [], report.as_dict()
    model.close()
