"""Replies that loop: the share of the bundled model's greedy replies that repeat an 8-gram, by repetition penalty.

The bundled 135M model loops under greedy decoding ("I'm not a chatbot, and I'm not a
chatbot..."). A repetition penalty on the reply's own last 64 tokens (llama.cpp's and Ollama's
default is 1.1) is deterministic. This measures, for each penalty,
on SGD dev user turns (each dialogue's first), answered off the record behind the
customer-service bot's system prompt, 8 at a time: the share of replies in which some 8-gram
of token ids occurs twice, the share the model ended itself (end-of-turn rather than the
length limit), the share the answer cache would keep (ended by the model, mean token entropy
under its gate), and mean distinct tokens per reply. The turns are split in two: the default is
chosen on the first half (the lowest repeated share among the penalties that keep at least
as many answers cacheable as none does, ties to the smaller penalty), and the
second half, not looked at for the choice, reports it.

    python -m bench.repetition [--data ../shared/data] [--quick] [--turns 80] [--penalties 1.0 1.1 1.2 1.3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from typing import Any

import matplotlib

from chatcache import AnswerCacheConfig, ChatEngine, Message, TokenTierConfig, load_chat_model
from chatcache.dialog import load_bot

from .common import BenchRun, bench_arguments, sgd_user_turns

NGRAM = 8
AT_ONCE = 8


def repeats_an_ngram(ids: list[int], n: int = NGRAM) -> bool:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) < len(grams)


Answer = tuple[list[int], str, float]  # token ids, finish reason, mean entropy in bits


def answer_all(engine: ChatEngine, questions: list[str], penalty: float, max_new_tokens: int) -> list[Answer]:
    """Each question answered alone (a fresh conversation), `AT_ONCE` at a time on the scheduler."""
    replies: list[Answer] = [([], "", 0.0)] * len(questions)

    def answer(index: int) -> None:
        stream = engine.complete([Message("user", questions[index])], max_new_tokens=max_new_tokens, repetition_penalty=penalty)
        for _ in stream:
            pass
        reply = stream.reply
        assert reply is not None
        replies[index] = (list(reply.token_ids), reply.stats.finish_reason, reply.stats.mean_entropy_bits)

    for start in range(0, len(questions), AT_ONCE):
        threads = [threading.Thread(target=answer, args=(i,)) for i in range(start, min(start + AT_ONCE, len(questions)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return replies


def summary(replies: list[Answer], max_entropy_bits: float) -> dict[str, Any]:
    count = len(replies)
    return {
        "replies": count,
        "repeated_8gram_share": round(sum(repeats_an_ngram(ids) for ids, _, _ in replies) / count, 3),
        "ended_by_model_share": round(sum(reason == "eos" for _, reason, _ in replies) / count, 3),
        # What the answer cache would keep: ended by the model, mean entropy under its gate.
        "cacheable_share": round(sum(reason == "eos" and entropy <= max_entropy_bits for _, reason, entropy in replies) / count, 3),
        "mean_entropy_bits": round(sum(entropy for _, _, entropy in replies) / count, 3),
        "mean_tokens": round(sum(len(ids) for ids, _, _ in replies) / count, 1),
        "mean_distinct_token_share": round(sum(len(set(ids)) / max(1, len(ids)) for ids, _, _ in replies) / count, 3),
    }


def plot(rows: list[dict[str, Any]], path: str) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for split, style in (("tune", "o-"), ("test", "s--")):
        axis.plot([r["penalty"] for r in rows], [r[split]["repeated_8gram_share"] for r in rows], style, label=f"repeated 8-gram, {split} half")
        axis.plot([r["penalty"] for r in rows], [r[split]["ended_by_model_share"] for r in rows], style, alpha=0.5, label=f"ended by the model, {split} half")
    axis.set_xlabel("repetition penalty (last 64 reply tokens)")
    axis.set_ylabel("share of replies")
    axis.set_ylim(0, 1)
    axis.legend(fontsize=8)
    figure.suptitle("SmolLM2-135M, greedy, SGD dev first user turns")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--turns", type=int, default=None, help="user turns, half to tune and half to test (default 80, quick 16)")
    parser.add_argument("--penalties", type=float, nargs="+", default=None, help="default 1.0 1.1 1.2 1.3 (quick 1.0 1.2)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    turns = args.turns or (16 if args.quick else 80)
    penalties = args.penalties or ([1.0, 1.2] if args.quick else [1.0, 1.1, 1.2, 1.3])
    run = BenchRun("repetition", args, minutes=(10, 2))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    questions = [user_turns[0] for _, user_turns in sgd_user_turns(args.data, turns, min_turns=1)]
    tune, test = questions[: len(questions) // 2], questions[len(questions) // 2 :]
    rows: list[dict[str, Any]] = []
    examples: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        engine = ChatEngine(
            load_chat_model("bundled", device="cpu"), system_prompt=load_bot("customer_service").system_prompt,
            token_tier=TokenTierConfig(spill_dir=None), store=f"sqlite:///{scratch}/s.db",
        )  # fmt: skip
        for penalty in penalties:
            tuned, tested = answer_all(engine, tune, penalty, args.max_new_tokens), answer_all(engine, test, penalty, args.max_new_tokens)
            gate = AnswerCacheConfig().max_entropy_bits
            rows.append({"penalty": penalty, "tune": summary(tuned, gate), "test": summary(tested, gate)})
            examples[str(penalty)] = str(engine.chat_model.tokenizer.decode(tuned[0][0]))
            run.section("by_penalty", rows)
            run.section("first_reply_by_penalty", examples)
        engine.close()
    # The fewest loops on the tune half, among the penalties that keep at least as many answers
    # cacheable as none does (a default that loses cache hits would cost what it saves).
    floor = next((r["tune"]["cacheable_share"] for r in rows if r["penalty"] == 1.0), 0.0)
    allowed = [r for r in rows if r["tune"]["cacheable_share"] >= floor] or rows
    chosen = min(allowed, key=lambda r: (r["tune"]["repeated_8gram_share"], r["penalty"]))
    baseline = next(r for r in rows if r["penalty"] == 1.0) if 1.0 in penalties else None
    path = str(args.out / "repetition.png")
    plot(rows, path)
    run.finish(
        plot=path,
        chosen_on_tune_half=chosen["penalty"],
        test_half_at_chosen=chosen["test"],
        test_half_without_penalty=baseline["test"] if baseline else None,
        questions={"tune": len(tune), "test": len(test)},
    )


if __name__ == "__main__":
    main()
