"""Speculative decoding on free drafts: a greedy reply drafted from cached answers or its own
prompt is token for token the reply plain decoding writes, and keeps only the accepted KV.

The reference is `generate_tokens` on a fresh cache (the uncached path, one token per forward);
the drafted replies run on a scheduler of the test's own. Drafts are right (the reference reply
itself, as a cached answer), partly right, wrong, or looked up in the prompt.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
import torch
from transformers import DynamicCache

from chatcache.config import GenerationConfig
from chatcache.model.drafts import DraftSource
from chatcache.model.generation import forward, generate_tokens
from chatcache.model.kv import to_tensors
from chatcache.model.scheduler import Request, Scheduler

TEXTS = [
    "the cat sat on the mat and the cat sat on the hat",
    "Book a table for two at eight, a table for two please",
    "What is the weather like in Paris tomorrow? Will it rain in Paris?",
    "Please transfer 200 dollars from my savings account to checking.",
]


@pytest.fixture
def scheduler(tiny_model) -> Iterator[Scheduler]:  # type: ignore[no-untyped-def]
    worker = Scheduler(tiny_model.model, draft_tokens=4)
    yield worker
    worker.close()


def _prompt(tiny_model, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tiny_model.tokenizer.encode(text))


def _plain(model, prompt: list[int], params: GenerationConfig, eos: frozenset[int] = frozenset()) -> list[int]:  # type: ignore[no-untyped-def]
    return [t.token_id for t in generate_tokens(model, DynamicCache(config=model.config), prompt, params, set(eos))]


def _run(scheduler: Scheduler, prompt: list[int], params: GenerationConfig, answers: list[list[int]] | None, eos: frozenset[int] = frozenset()) -> tuple[list[int], Request]:
    """The reply drafted from `prompt` and `answers`; not drafted where `answers` is None."""
    cache = DynamicCache(config=scheduler.model.config)
    drafts = DraftSource(prompt, answers) if answers is not None else None
    request = scheduler.submit(cache, prompt, params, set(eos), drafts=drafts)
    return [t.token_id for t in request], request


def _assert_kv_is_recomputed(model, request: Request, ids: list[int]) -> None:  # type: ignore[no-untyped-def]
    """The cache handed back holds exactly `ids`, as a fresh prefill of them computes it."""
    cache = request.cancel()
    assert cache.get_seq_length() == len(ids)
    fresh = DynamicCache(config=model.config)
    forward(model, ids, fresh)
    for (keys, values), (fresh_keys, fresh_values) in zip(to_tensors(cache), to_tensors(fresh)):
        torch.testing.assert_close(keys, fresh_keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(values, fresh_values, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("draft", ["right", "partly right", "wrong", "prompt only"])
def test_a_drafted_reply_is_the_plain_reply(tiny_model, scheduler, draft) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model.model
    params = GenerationConfig(max_new_tokens=24)
    drafted_tokens = 0
    for text in TEXTS:
        prompt = _prompt(tiny_model, text)
        plain = _plain(model, prompt, params)
        wrong = [random.Random(len(text)).randrange(10, 300) for _ in range(24)]
        answers = {"right": [plain], "partly right": [plain[:6] + wrong[:8] + plain[14:]], "wrong": [wrong], "prompt only": []}[draft]
        drafted, request = _run(scheduler, prompt, params, answers)
        assert drafted == plain
        assert request.accepted <= request.drafted
        drafted_tokens += request.drafted
        if draft == "right":
            assert request.accepted >= len(plain) // 2  # most of the reply came several tokens a step
        # Rejected drafts left no KV: the prompt and every reply token but the last, as computed plainly.
        _assert_kv_is_recomputed(model, request, prompt + plain[:-1])
    # The prompt's n-grams (and the reply's own) drafted tokens even without an answer; the
    # random tiny model never copies them, so their acceptance is shown on the bundled model.
    assert drafted_tokens > 0


def test_an_end_of_reply_token_inside_an_accepted_run_ends_the_reply_there(tiny_model, scheduler) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model.model
    params = GenerationConfig(max_new_tokens=24)
    prompt = _prompt(tiny_model, TEXTS[1])
    plain = _plain(model, prompt, params)
    end = next(i for i in range(3, len(plain)) if plain[i] not in plain[:i])  # the reply's first such token ends it
    eos = frozenset({plain[end]})
    ended = _plain(model, prompt, params, eos)
    assert ended == plain[: end + 1]
    drafted, request = _run(scheduler, prompt, params, [plain], eos)
    assert drafted == ended
    assert request.accepted > 0
    _assert_kv_is_recomputed(model, request, prompt + ended[:-1])


def test_requests_drafting_beside_plain_ones_in_real_threads_reply_as_alone(tiny_model, scheduler) -> None:  # type: ignore[no-untyped-def]
    """Greedy rows with drafts of every kind and sampled rows without share decode steps (of
    other lengths); each reply equals the one it gets alone."""
    model = tiny_model.model
    cases: list[tuple[list[int], GenerationConfig, str]] = []
    for index, text in enumerate(TEXTS * 2):
        sampled = index % 4 == 3
        params = GenerationConfig(max_new_tokens=10 + 3 * index, temperature=0.9 if sampled else 0.0, seed=index)
        cases.append((_prompt(tiny_model, text), params, ("right", "partly right", "wrong", "none")[index % 4]))
    alone = [_plain(model, prompt, params) for prompt, params, _ in cases]
    replies: list[list[int]] = [[] for _ in cases]
    requests: list[Request | None] = [None] * len(cases)
    start = threading.Barrier(len(cases))
    errors: list[BaseException] = []

    def reply(index: int) -> None:
        prompt, params, draft = cases[index]
        answers = {"right": [alone[index]], "partly right": [alone[index][:4] + [7, 8, 9] + alone[index][7:]], "wrong": [[7, 8, 9] * 5], "none": None}[draft]
        try:
            start.wait()
            replies[index], requests[index] = _run(scheduler, prompt, params, answers)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=reply, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert scheduler.peak_running > 1
    assert replies == alone
    for (prompt, params, _), request, plain in zip(cases, requests, alone):
        assert request is not None
        if params.temperature > 0:
            assert request.drafted == 0  # a reply without drafts feeds none
        _assert_kv_is_recomputed(model, request, prompt + plain[:-1])
    assert sum(r.accepted for r in requests if r is not None) > 0


def test_a_reply_cancelled_mid_draft_hands_back_the_kv_of_what_it_fed(tiny_model, scheduler) -> None:  # type: ignore[no-untyped-def]
    """The reader stops after the first token while accepted runs are coming: the cache covers
    the prompt and every token the worker picked but the last, computed as plain decoding does."""
    model = tiny_model.model
    params = GenerationConfig(max_new_tokens=300)  # long enough that the worker cannot finish before the cancel
    prompt = _prompt(tiny_model, TEXTS[2])
    plain = _plain(model, prompt, params)
    request = scheduler.submit(DynamicCache(config=model.config), prompt, params, set(), drafts=DraftSource(prompt, [plain]))
    first = next(iter(request))
    cache = request.cancel()
    picked = [first.token_id]
    while (item := request.tokens.get()) is not None:  # what the worker picked before it saw the cancel
        assert not isinstance(item, BaseException)
        picked.append(item.token_id)
    assert picked == plain[: len(picked)]
    assert len(picked) < len(plain)  # it stopped early
    assert cache.get_seq_length() == len(prompt) + len(picked) - 1
    _assert_kv_is_recomputed(model, request, prompt + picked[:-1])


def test_a_turn_reports_its_drafted_and_accepted_tokens_and_replies_as_without_drafts(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """Through the engine: greedy turns draft from their prompt (the stats say how much) and reply
    as the same engine does with drafting off; a seeded sampled turn, which may draft too,
    replies the same each time it is asked."""
    from chatcache import ChatModel

    conversation = ["the cat sat on the mat and the cat sat on the hat", "the cat sat on the mat?", "and the hat?"]
    replies: dict[int, list[list[int]]] = {}
    for draft_tokens in (0, 4):
        model = ChatModel(tiny_model.name, tiny_model.model, tiny_model.tokenizer, tiny_model.identity)
        model.scheduler.draft_tokens = draft_tokens
        engine = make_engine(model, system_prompt="You are a test bot. The cat sat on the mat.")
        turns = [engine.chat("s", text, max_new_tokens=16) for text in conversation]
        replies[draft_tokens] = [turn.token_ids for turn in turns]
        for turn in turns:
            assert 0 <= turn.stats.accepted_tokens <= turn.stats.drafted_tokens
        assert (sum(turn.stats.drafted_tokens for turn in turns) > 0) == (draft_tokens > 0)
        sampled = [engine.chat(session, conversation[0], max_new_tokens=8, temperature=0.8, seed=1) for session in ("t", "u")]
        assert sampled[0].token_ids == sampled[1].token_ids
        model.close()
    assert replies[4] == replies[0]
