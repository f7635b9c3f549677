"""The scheduler: conversations decoded together give the replies they give alone.

Real threads send turns at once; the reference is each conversation run alone on an engine of
its own with the token tier off (the uncached path), one turn at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from chatcache import ChatEngine, ChatModel, TokenTierConfig

SYSTEM = "You are a test bot. Answer briefly."
CONVERSATIONS = [
    ["Hello there", "Book a table for two", "At eight, please"],
    ["What is the weather like in Paris tomorrow?", "Will it rain?", "Thanks"],
    ["Tell me a joke about cats.", "Another one", "The quick brown fox jumps over the lazy dog."],
    ["Please transfer 200 dollars from my savings account to checking.", "Yes", "Done?"],
    ["The train to Berlin leaves at 9:45 from platform 3.", "Which platform?", "When?"],
    ["I would like to book a table", "Italian", "Tonight at seven for four people please"],
]


@pytest.fixture
def own_model(tiny_model) -> Iterator[ChatModel]:  # type: ignore[no-untyped-def]
    """The tiny model's weights behind a worker of this test's own, so its batch figures are this test's."""
    model = ChatModel(tiny_model.name, tiny_model.model, tiny_model.tokenizer, tiny_model.identity)
    yield model
    model.close()


def _alone(tiny_model, make_engine, turns: list[str], **generation: object) -> list[list[int]]:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    return [engine.chat("alone", text, **generation).token_ids for text in turns]  # type: ignore[arg-type]


def _together(
    engines: ChatEngine | list[ChatEngine], conversations: list[list[str]], generation: list[dict]  # type: ignore[type-arg]
) -> list[list[list[int]]]:
    """Each conversation in its own thread, all started at once; conversation i on engine i mod len(engines)."""
    engines = engines if isinstance(engines, list) else [engines]
    replies: list[list[list[int]]] = [[] for _ in conversations]
    start = threading.Barrier(len(conversations))
    errors: list[BaseException] = []

    def converse(index: int) -> None:
        try:
            start.wait()
            for text in conversations[index]:
                engine = engines[index % len(engines)]
                replies[index].append(engine.chat(f"s{index}", text, **generation[index]).token_ids)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(len(conversations))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    return replies


def test_conversations_decoded_together_reply_as_they_do_alone(tiny_model, own_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(own_model, system_prompt=SYSTEM)
    generation = [{"max_new_tokens": 6 + 3 * (i % 3)} for i in range(len(CONVERSATIONS))]  # replies end apart
    together = _together(engine, CONVERSATIONS, generation)
    assert own_model.scheduler.peak_running > 1  # the turns did share decode steps
    for turns, settings, replies in zip(CONVERSATIONS, generation, together):
        assert replies == _alone(tiny_model, make_engine, turns, **settings)


def test_each_request_keeps_its_own_settings_in_a_shared_batch(tiny_model, own_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(own_model, system_prompt=SYSTEM)
    generation = [
        {"max_new_tokens": 8},
        {"max_new_tokens": 8, "temperature": 0.9, "top_p": 0.9, "seed": 7},
        {"max_new_tokens": 3},
        {"max_new_tokens": 8, "temperature": 1.2, "seed": 11},
    ]
    conversations = [turns[:2] for turns in CONVERSATIONS[:4]]
    together = _together(engine, conversations, generation)
    assert own_model.scheduler.peak_running > 1
    for turns, settings, replies in zip(conversations, generation, together):
        assert replies == _alone(tiny_model, make_engine, turns, **settings)
        assert all(len(reply) <= settings["max_new_tokens"] for reply in replies)


def test_a_stream_stopped_early_in_a_batch_leaves_its_kv_right(tiny_model, make_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The reader leaves after the first piece while other turns decode beside it: the KV it keeps
    serves the next turn exactly as the uncached path computes it from the same record."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/chat.db"
    engine = make_engine(tiny_model, system_prompt=SYSTEM, store=url)
    others = threading.Thread(target=lambda: _together(engine, [t[:1] for t in CONVERSATIONS[1:4]], [{"max_new_tokens": 12}] * 3))
    others.start()
    stream = engine.stream("stopped", CONVERSATIONS[0][0], max_new_tokens=12)
    next(iter(stream))
    stream.close()
    others.join(timeout=300)
    with sqlite3.connect(tmp_path / "chat.db") as source, sqlite3.connect(tmp_path / "copy.db") as target:
        source.backup(target)
    uncached = make_engine(tiny_model, system_prompt=SYSTEM, store=f"sqlite:///{tmp_path}/copy.db", token_tier=TokenTierConfig(enabled=False))
    follow_up = engine.chat("stopped", CONVERSATIONS[0][1], max_new_tokens=6)
    assert follow_up.stats.reused_tokens > 0  # the stopped turn's KV was kept and reused
    assert follow_up.token_ids == uncached.chat("stopped", CONVERSATIONS[0][1], max_new_tokens=6).token_ids


def test_engines_on_one_model_share_its_worker(tiny_model, own_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """Two bots on the same loaded model: their turns are decoded in the same batch, and each
    still replies as it does alone (its own system prompt, its own sessions)."""
    other_system = "You are another bot. Be terse."
    engines = [make_engine(own_model, system_prompt=SYSTEM), make_engine(own_model, system_prompt=other_system)]
    conversations = [turns[:2] for turns in CONVERSATIONS[:4]]
    together = _together(engines, conversations, [{"max_new_tokens": 8}] * len(conversations))
    assert own_model.scheduler.peak_running > 1
    engines[0].close()  # one engine closing leaves the model's worker to the other
    assert engines[1].chat("after", "Hello there", max_new_tokens=4).token_ids
    for index, (turns, replies) in enumerate(zip(conversations, together)):
        system = (SYSTEM, other_system)[index % 2]
        alone = make_engine(tiny_model, system_prompt=system, token_tier=TokenTierConfig(enabled=False))
        assert replies == [alone.chat("alone", text, max_new_tokens=8).token_ids for text in turns]


def test_prompts_prefilled_in_chunks_across_steps_reply_as_alone(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """A small chunk splits long prompts over several steps, beside running decodes; every reply
    still equals one decoded alone on a fresh cache."""
    from transformers import DynamicCache

    from chatcache.config import GenerationConfig
    from chatcache.model.generation import generate_tokens
    from chatcache.model.scheduler import Scheduler

    model = tiny_model.model
    prompts = [list(range(5, 5 + length)) for length in (23, 3, 16, 2, 9)]
    params = GenerationConfig(max_new_tokens=8)
    alone = [
        [t.token_id for t in generate_tokens(model, DynamicCache(config=model.config), p, params, set())] for p in prompts
    ]
    scheduler = Scheduler(model, prefill_chunk=7)
    try:
        requests = [scheduler.submit(DynamicCache(config=model.config), p, params, set()) for p in prompts]
        together = [[t.token_id for t in request] for request in requests]
    finally:
        scheduler.close()
    assert together == alone
    assert scheduler.peak_running > 1
