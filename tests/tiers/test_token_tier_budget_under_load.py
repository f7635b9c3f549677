"""The KV budget holds while turns run at once: a turn that would not fit waits for one to end."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from chatcache import TokenTierConfig

SYSTEM = "You are a helpful assistant."
QUESTIONS = [f"Tell me about the train to Berlin number {i}" for i in range(4)]


def test_concurrent_turns_never_hold_more_kv_than_the_budget_and_reply_as_alone(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    free = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    alone = {q: free.chat(f"alone-{i}", q, max_new_tokens=48).text for i, q in enumerate(QUESTIONS)}
    per_turn = (free.kv_stats().resident_bytes - 0) // len(QUESTIONS)  # about one finished session each
    budget = int(per_turn * 1.8)  # room for one running turn and the prefix, not two
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(memory_budget_bytes=budget, spill_dir=None))
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], engine.token_tier.resident_bytes())
            time.sleep(0.0005)

    replies: dict[str, str] = {}

    def ask(index: int, question: str) -> None:
        replies[question] = engine.chat(f"s{index}", question, max_new_tokens=48).text

    sampler = threading.Thread(target=sample)
    sampler.start()
    turns = [threading.Thread(target=ask, args=(i, q)) for i, q in enumerate(QUESTIONS)]
    for turn in turns:
        turn.start()
    for turn in turns:
        turn.join(120)
    done.set()
    sampler.join()
    assert replies == alone
    assert 0 < peak[0] <= budget
