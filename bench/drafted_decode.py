"""Drafted decode steps against plain ones on `bench.model_answered`'s model-written turns (issue 42 section 2).

Each chosen turn (a question after the history its session had) is answered twice on the same
engine, greedily: once with the scheduler drafting (`Scheduler.draft_tokens`, the engine's
switch for drafting, which may change between steps) and once without. Both answers start
from the same KV state: a token-tier entry of their own, so each reuses the shared
system-prompt KV and prefills the same history. The two are alternated, turn by turn (N = 1)
and batch by batch (N = 8), plain first then drafted first, so that a change in the machine's
load hits both.

At N = 1 a turn runs alone; at N = 8 eight turns are submitted at once in threads, and the
scheduler batches their decodes. Decode tokens/s is the reply tokens after each first token,
over the seconds from the first first token to the last reply's end: one turn's decode rate at
N = 1, the batch's aggregate at N = 8.

The peer the issue names, transformers' own prompt-lookup decoding (`generate(...,
prompt_lookup_num_tokens=K)`), runs on the N = 1 turns too (`transformers_prompt_lookup`): a
plain copy of the same weights (no chatcache layer), the same conversation rendered by the
model's chat template, greedy, its plain `generate` against its prompt-lookup one, alternated
the same way.

What it does not do: draft from cached answers. The engine passes the answer cache's nearest
answers only when it has an answer cache, and an engine with one may serve a turn instead of
writing it, or keep the plain reply and serve it to the drafted run. The drafts here are the
prompt's own n-grams (prompt lookup: the system prompt's curated answers and the history).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer

from chatcache import ChatEngine, Message
from chatcache.model.loading import ChatModel

AT_ONCE = (1, 8)  # the N of the draft_speedup_n1 and draft_speedup_n8


@dataclass(frozen=True)
class Turn:
    """A model-written turn to answer again: its question after its session's (question, reply) pairs."""

    history: tuple[tuple[str, str], ...]
    question: str


@dataclass(frozen=True)
class Answer:
    """One greedy answer; `first_token_at` and `ended_at` on `time.perf_counter`."""

    text: str
    generated_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    first_token_at: float
    ended_at: float


@contextmanager
def drafting(chat_model: ChatModel, draft_tokens: int) -> Iterator[None]:
    """Draft up to `draft_tokens` a step (0: not at all) inside the block, then as before."""
    scheduler = chat_model.scheduler
    before = scheduler.draft_tokens
    scheduler.draft_tokens = draft_tokens
    try:
        yield
    finally:
        scheduler.draft_tokens = before


def answer(engine: ChatEngine, turn: Turn, key: str, max_new_tokens: int) -> Answer:
    """The model's greedy answer to `turn` on a token-tier entry of its own (`key`, dropped after)."""
    messages = [Message(role, text) for pair in turn.history for role, text in zip(("user", "assistant"), pair)]
    started = time.perf_counter()
    with engine.complete([*messages, Message("user", turn.question)], kv_key=key, max_new_tokens=max_new_tokens) as stream:
        for _ in stream:
            pass
    ended = time.perf_counter()
    assert stream.reply is not None
    s = stream.reply.stats
    if engine.token_tier is not None:
        engine.token_tier.drop(key)  # memory for the next answers; each starts from the shared prefix anyway
    return Answer(stream.reply.text, s.generated_tokens, s.drafted_tokens, s.accepted_tokens, started + s.ttft_s, ended)


def answer_at_once(engine: ChatEngine, turns: Sequence[Turn], label: str, max_new_tokens: int) -> list[Answer]:
    """`turns` submitted together, one thread each, so that the scheduler batches their decodes."""
    answers: list[Answer | None] = [None] * len(turns)

    def run(index: int) -> None:
        answers[index] = answer(engine, turns[index], f"{label}-{index}", max_new_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(turns))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(a is None for a in answers):
        raise RuntimeError(f"a thread of {label} failed")
    return [a for a in answers if a is not None]


def compare(
    engine: ChatEngine, chat_model: ChatModel, turns: Sequence[Turn], at_once: int, draft_tokens: int, max_new_tokens: int
) -> dict[str, Any]:
    """Plain against drafted decoding on `turns`, `at_once` at a time, alternating which goes first."""
    groups = [list(turns[i : i + at_once]) for i in range(0, len(turns) - at_once + 1, at_once)]
    plain: list[list[Answer]] = []
    drafted: list[list[Answer]] = []
    for number, group in enumerate(groups):
        order = (0, draft_tokens) if number % 2 == 0 else (draft_tokens, 0)
        for limit in order:
            with drafting(chat_model, limit):
                answers = answer_at_once(engine, group, f"draft-n{at_once}-{number}-k{limit}", max_new_tokens)
            (drafted if limit else plain).append(answers)
    plain_rates = [decode_rate([g]) for g in plain]
    drafted_rates = [decode_rate([g]) for g in drafted]
    speedups = [d / p for d, p in zip(drafted_rates, plain_rates) if p > 0]
    flat_plain = [a for g in plain for a in g]
    flat_drafted = [a for g in drafted for a in g]
    drafted_tokens = sum(a.drafted_tokens for a in flat_drafted)
    accepted_tokens = sum(a.accepted_tokens for a in flat_drafted)
    identical = sum(p.text == d.text for p, d in zip(flat_plain, flat_drafted))
    return {
        "at_once": at_once,
        "turns": len(flat_plain),
        "runs": len(groups),  # single turns at N = 1, batches of `at_once` at N = 8
        "plain_decode_tokens_per_s": [round(r, 3) for r in plain_rates],
        "drafted_decode_tokens_per_s": [round(r, 3) for r in drafted_rates],
        # the total rate of each side: reply tokens over decode seconds, summed over the runs
        "speedup": round(decode_rate(drafted) / decode_rate(plain), 3) if decode_rate(plain) else None,
        "speedup_median_run": round(sorted(speedups)[len(speedups) // 2], 3) if speedups else None,
        "runs_slower_by_over_10pct": sum(s < 1 / 1.1 for s in speedups),
        "drafted_tokens": drafted_tokens,
        "accepted_tokens": accepted_tokens,
        "accepted_share": round(accepted_tokens / drafted_tokens, 3) if drafted_tokens else None,
        "identical": identical,
        "identical_share": round(identical / len(flat_plain), 3) if flat_plain else None,
        "differing": differing(groups, flat_plain, flat_drafted),
    }


def differing(groups: Sequence[Sequence[Turn]], plain: Sequence[Answer], drafted: Sequence[Answer]) -> list[dict[str, Any]]:
    """The turns whose drafted reply is not the plain one, with both replies."""
    turns = [t for group in groups for t in group]
    return [
        {"question": t.question, "history_turns": len(t.history), "plain": p.text, "drafted": d.text}
        for t, p, d in zip(turns, plain, drafted)
        if p.text != d.text
    ]


def decode_rate(runs: Sequence[Sequence[Answer]]) -> float:
    """Reply tokens after the first ones over decode seconds, summed over `runs`: a run's decode
    seconds go from its first first token to its last reply's end."""
    tokens = sum(max(0, a.generated_tokens - 1) for run in runs for a in run)
    seconds = sum(max(a.ended_at for a in run) - min(a.first_token_at for a in run) for run in runs)
    return tokens / seconds if seconds > 0 else 0.0


class TokenClock(BaseStreamer):
    """Notes when `generate` pushes its first new tokens (its first push is the prompt) and its last."""

    def __init__(self) -> None:
        self.pushes = 0
        self.first_token_at = 0.0
        self.ended_at = 0.0

    def put(self, value: torch.Tensor) -> None:
        self.pushes += 1
        if self.pushes == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        self.ended_at = time.perf_counter()


def transformers_prompt_lookup(
    model_dir: str | Path, system_prompt: str, turns: Sequence[Turn], lookup_tokens: int, max_new_tokens: int
) -> dict[str, Any]:
    """transformers' greedy `generate` with prompt lookup (`lookup_tokens` a step) against without,
    on `turns` one at a time, alternating which goes first: decode tokens/s (as `decode_rate`)
    and whether the two replies are the same."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train(False)
    runs: dict[int, list[list[Answer]]] = {0: [], lookup_tokens: []}
    for number, turn in enumerate(turns):
        messages = [{"role": "system", "content": system_prompt}]
        messages += [{"role": role, "content": text} for pair in turn.history for role, text in zip(("user", "assistant"), pair)]
        text = tokenizer.apply_chat_template([*messages, {"role": "user", "content": turn.question}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        for lookup in (0, lookup_tokens) if number % 2 == 0 else (lookup_tokens, 0):
            clock = TokenClock()
            extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
            with torch.inference_mode():
                out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, streamer=clock, **extra)
            reply = out[0, ids.shape[1] :]
            reply_text = str(tokenizer.decode(reply, skip_special_tokens=True))
            runs[lookup].append([Answer(reply_text, len(reply), 0, 0, clock.first_token_at, clock.ended_at)])
    plain, looked_up = runs[0], runs[lookup_tokens]
    identical = sum(p[0].text == d[0].text for p, d in zip(plain, looked_up))
    plain_rate, looked_up_rate = decode_rate(plain), decode_rate(looked_up)
    return {
        "model": str(model_dir),
        "lookup_tokens": lookup_tokens,
        "turns": len(plain),
        "plain_decode_tokens_per_s": round(plain_rate, 3),
        "prompt_lookup_decode_tokens_per_s": round(looked_up_rate, 3),
        "speedup": round(looked_up_rate / plain_rate, 3) if plain_rate else None,
        "identical_share": round(identical / len(plain), 3) if plain else None,
    }
