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


def test_a_turn_let_in_holds_its_memory_from_admission_to_its_run(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Admission and checkout are apart in time: the memory a turn was let in on is held for it,
    so a turn admitted just after sees it taken, and a refused turn gives its hold back."""
    free = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    free.chat("probe", QUESTIONS[0], max_new_tokens=48)
    budget = int(free.kv_stats().resident_bytes * 1.8)  # room for one running turn and the prefix, not two
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(memory_budget_bytes=budget, spill_dir=None))
    engine.chat("warm", QUESTIONS[3], max_new_tokens=4)  # the prefix is computed and counted
    seen: dict[str, bool] = {}
    second_admitted = threading.Event()
    replies: list[str] = []

    def admit_second(prefill_tokens: int, held: bool, restore_s: float) -> None:
        seen["b"] = held
        second_admitted.set()

    def admit_first(prefill_tokens: int, held: bool, restore_s: float) -> None:
        seen["a"] = held
        # Let in, not yet running: a second turn is decided on now, in another thread.
        thread = threading.Thread(target=lambda: replies.append(engine.chat("b", QUESTIONS[1], max_new_tokens=48, admit=admit_second).text))
        thread.start()
        threads.append(thread)
        assert second_admitted.wait(60)

    threads: list[threading.Thread] = []
    engine.chat("a", QUESTIONS[0], max_new_tokens=48, admit=admit_first)
    threads[0].join(60)
    assert seen == {"a": True, "b": False} and len(replies) == 1  # it waited for the first, then ran

    def refuse(prefill_tokens: int, held: bool, restore_s: float) -> None:
        seen["c"] = held
        raise RuntimeError("429")

    try:
        "".join(engine.stream("c", QUESTIONS[2], max_new_tokens=48, admit=refuse))
    except RuntimeError:
        pass
    assert seen["c"] is True and engine.token_tier.reserve("d", 10)  # the refused turn's hold was given back
    engine.token_tier.release("d")
