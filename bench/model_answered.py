"""Where the model answers: every tier against prefix caching alone and against no caching (issue 42).

`bench.bank_replay` measured the caches on the bank bot, whose flows and knowledge base answer
every scripted turn, so no cache had model time to save. Here the model writes every reply
that no cache serves: a customer-service assistant on the bundled SmolLM2-135M-Instruct whose
system prompt is the bank bot's instructions with its curated answers (`BotDefinition.instructions`,
about 2,800 tokens), with no bot behind it (no intents, flows or actions).

The customers (`workload`, fixed by `--seed`) ask BANKING77 questions of the intents the bank
bot has an answer for. The rows are those `bench.answer_cache_evals` holds out of its warm-up
(the 20% test part of its split of `train.csv`, seed 0), less the bot's own examples: neither
the answer cache's tuning nor the bot's classifier saw them. Popularity over intents is Zipf
(`--zipf`); a visit asks one question and then, each time with `MORE_SHARE`, one more: the same
question in other words (another row of the intent), a follow-up that leans on the conversation
(`FOLLOW_UPS`, written for this benchmark), or a new question. A share of visits
(`--returning-share`) are customers coming back to the session of an earlier visit.

The same visits run three times, `--at-once` customers at a time in threads on one model (the
scheduler batches their turns), each engine warmed up off the record first (the shared
system-prompt KV computed, as a serving engine has it after its first request):
(a) every tier on: the answer cache (its defaults), prefetch, the token tier (shared
system-prompt KV and each session's KV); (b) prefix caching only: the token tier alone, what
vLLM, SGLang and llama.cpp give; (c) nothing cached: a token tier that reuses nothing, so every
turn prefills its whole prompt. Drift detection is off in all three: it changes what the model
is shown, not what it costs to compute, and (a)'s replies must answer the same prompts as (b)'s.
Reported for each: turns/s, TTFT and latency p50/p99, the share of turns the model wrote, and
how the model's replies ended (the answer cache keeps only replies the model ended itself with
a mean entropy under its bound). Every turn (a)'s answer cache served is then replayed in (b)'s
engine, one at a time with greedy decoding, on the history (a) had at that turn; the served
reply should be the one the model writes there. A few turns the model wrote in (a) are
replayed too, as a check of the replay itself (batching may break a near-tie differently).
How many turns repeat an earlier turn's whole prompt (`repeated_prompts`) bounds what (a) can
gain over (b) while every served reply is the model's own: only those turns can be.

Section 2 of the issue (drafted decode steps, off by default: `Scheduler.draft_tokens = 0`)
is measured on (b)'s engine once its visits are done (`bench.drafted_decode`): model-written
turns of (b) answered again greedily with drafts (`--draft-tokens` a step at most) and
without, alternated, one at a time (`--draft-turns`) and 8 at once (`--draft-batches` batches
of 8): `draft_speedup_n1` and `draft_speedup_n8` (decode tokens/s drafted over plain),
`draft_identical_share` (drafted replies equal to the plain ones) and `draft_accepted_share`
(drafted tokens the model accepted). The peer, transformers' own prompt-lookup decoding on the
same N = 1 turns against its plain `generate`: `transformers_prompt_lookup_speedup_n1`.

    python -m bench.model_answered [--data ../shared/data] [--quick] [--visits 48] [--at-once 8]
        [--draft-tokens 8] [--draft-turns 16] [--draft-batches 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatcache import (
    AnswerCacheConfig,
    ChatEngine,
    Message,
    TokenTierConfig,
    load_chat_model,
)
from chatcache.dialog import BotDefinition, load_bot
from chatcache.dialog.training import read_labelled
from chatcache.evals.answer_cache import split_questions
from chatcache.model.loading import ChatModel, bundled_chat_dir
from chatcache.model.prompt import PromptRenderer

from . import drafted_decode
from .common import BenchRun, bench_arguments

CONFIGURATIONS = ("all_tiers", "prefix_only", "nothing_cached")
MODEL_TIERS = frozenset({"session", "disk", "prefix", "none"})  # the model wrote the reply
MORE_SHARE = 0.5  # after each question, the chance the customer asks another in the same visit
MAX_QUESTIONS = 4  # a visit's questions at most
KINDS = {"reworded": 0.3, "follow_up": 0.3, "new": 0.4}  # what a visit's next question is
# What customers say after an answer, whatever the question was: their meaning depends on the
# conversation, so the answer cache may serve one only in the same conversation.
FOLLOW_UPS = (
    "How long does that take?",
    "Is there a fee for that?",
    "Can I do that in the app?",
    "What if that doesn't work?",
    "Could you explain that more simply?",
    "Thanks. Is there anything else I should know?",
)


@dataclass(frozen=True)
class Question:
    """One customer turn. `kind`: "new" (a question of its own), "reworded" (the visit's
    previous question in other words), or "follow_up" (one of `FOLLOW_UPS`, about the last answer)."""

    intent: str
    text: str
    kind: str


@dataclass(frozen=True)
class Visit:
    """A customer's questions in one sitting; `returning`: they continue an earlier visit's session."""

    session_id: str
    questions: tuple[Question, ...]
    returning: bool


def question_pool(data: Path, bot: BotDefinition) -> dict[str, list[str]]:
    """The BANKING77 wordings customers ask, by intent: for each intent the bank bot answers, the
    rows `bench.answer_cache_evals` holds out of its warm-up, less the bot's examples (at least
    two wordings an intent, so that a question can be asked again in other words)."""
    with tempfile.TemporaryDirectory() as scratch:
        _, held_out = split_questions(data / "banking77" / "train.csv", scratch)  # that benchmark's split: 20%, seed 0
        by_intent = read_labelled(held_out)
    answered = {intent.name: set(intent.examples) for intent in bot.intents if intent.answer is not None}
    pool = {name: [text for text in by_intent.get(name, []) if text not in seen] for name, seen in sorted(answered.items())}
    return {name: texts for name, texts in pool.items() if len(texts) >= 2}


def workload(
    pool: dict[str, list[str]], visits: int, seed: int, zipf: float = 1.0, returning_share: float = 0.25
) -> list[Visit]:
    """The customers' visits in the order they arrive, the same for the same arguments.

    Intents are ranked in an order the seed shuffles and asked with Zipf weights (rank r has
    weight 1 / r**zipf), a wording of the intent uniformly. Each customer comes back at most once.
    """
    rng = random.Random(seed)
    intents = sorted(pool)
    rng.shuffle(intents)  # which intents are popular comes from the seed, not the alphabet
    weights = [1.0 / (rank + 1) ** zipf for rank in range(len(intents))]

    def ask() -> Question:
        intent = rng.choices(intents, weights)[0]
        return Question(intent, rng.choice(pool[intent]), "new")

    def next_question(previous: Question) -> Question:
        kind = rng.choices(list(KINDS), list(KINDS.values()))[0]
        if kind == "reworded":
            return Question(previous.intent, rng.choice([t for t in pool[previous.intent] if t != previous.text]), kind)
        if kind == "follow_up":
            return Question(previous.intent, rng.choice(FOLLOW_UPS), kind)
        return ask()

    planned: list[Visit] = []
    may_return: list[str] = []  # customers seen once
    for _ in range(visits):
        returning = bool(may_return) and rng.random() < returning_share
        session_id = may_return.pop(rng.randrange(len(may_return))) if returning else f"customer-{len(planned)}"
        if not returning:
            may_return.append(session_id)
        questions = [ask()]
        while len(questions) < MAX_QUESTIONS and rng.random() < MORE_SHARE:
            questions.append(next_question(questions[-1]))
        planned.append(Visit(session_id, tuple(questions), returning))
    return planned


@dataclass(frozen=True)
class TurnRecord:
    """One turn as served; `history`: the session's (question, reply) pairs before it."""

    visit: int
    session_id: str
    question: Question
    history: tuple[tuple[str, str], ...]
    reply: str
    tier: str
    ttft_s: float
    latency_s: float
    finish_reason: str
    entropy_bits: float
    generated_tokens: int


def replay(engine: ChatEngine, visits: list[Visit], at_once: int, max_new_tokens: int) -> tuple[float, list[TurnRecord]]:
    """Every visit's questions in order, `at_once` visits at a time (each thread takes the next
    visit when its own ends); a returning customer's visit starts after their earlier one ended.
    The wall time, and each turn."""
    lock = threading.Lock()
    arrivals = iter(range(len(visits)))
    ended = [threading.Event() for _ in visits]
    last_visit: dict[str, int] = {}  # session -> its latest visit, to wait for
    earlier = []
    for index, visit in enumerate(visits):
        earlier.append(last_visit.get(visit.session_id))
        last_visit[visit.session_id] = index
    histories: dict[str, list[tuple[str, str]]] = {}
    records: list[TurnRecord] = []

    def serve() -> None:
        while True:
            with lock:
                index = next(arrivals, None)
            if index is None:
                return
            visit = visits[index]
            before = earlier[index]
            if before is not None:
                ended[before].wait()
            history = histories.setdefault(visit.session_id, [])
            for question in visit.questions:
                started = time.perf_counter()
                reply = engine.chat(visit.session_id, question.text, max_new_tokens=max_new_tokens)
                latency = time.perf_counter() - started
                s = reply.stats
                record = TurnRecord(index, visit.session_id, question, tuple(history), reply.text, s.tier, s.ttft_s,
                                    latency, s.finish_reason, s.mean_entropy_bits, s.generated_tokens)  # fmt: skip
                history.append((question.text, reply.text))
                with lock:
                    records.append(record)
            ended[index].set()

    started = time.perf_counter()
    threads = [threading.Thread(target=serve) for _ in range(at_once)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, sorted(records, key=lambda r: (r.visit, len(r.history)))


def repeated_prompts(visits: list[Visit]) -> int:
    """How many turns repeat an earlier turn's whole prompt: the same question after the same
    questions in their session (a new customer's first question asked before by another new
    customer, mostly). Only these can be served with the reply the model writes for them,
    token for token; any other turn's prompt is new, and a cached reply to it is another
    prompt's. So with served turns costing nothing, (a) is at most
    `turns / (turns - repeated)` times (b)'s rate while every served reply equals the model's."""
    asked: set[tuple[str, ...]] = set()
    so_far: dict[str, tuple[str, ...]] = {}  # a session's questions, across the customer's visits
    repeated = 0
    for visit in visits:  # in arrival order: a returning customer's visit comes after the earlier one
        for question in visit.questions:
            prompt = so_far.get(visit.session_id, ()) + (question.text,)
            repeated += prompt in asked
            asked.add(prompt)
            so_far[visit.session_id] = prompt
    return repeated


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def summary(wall_s: float, records: list[TurnRecord], max_entropy_bits: float) -> dict[str, Any]:
    """One configuration's figures; how the model's replies ended says how many the answer cache could keep."""
    written = [r for r in records if r.tier in MODEL_TIERS]
    ended = [r for r in written if r.finish_reason == "eos"]
    return {
        "turns": len(records),
        "wall_s": round(wall_s, 1),
        "turns_per_s": round(len(records) / wall_s, 4),
        "ttft_p50_ms": round(1000 * percentile([r.ttft_s for r in records], 50), 1),
        "ttft_p99_ms": round(1000 * percentile([r.ttft_s for r in records], 99), 1),
        "latency_p50_ms": round(1000 * percentile([r.latency_s for r in records], 50), 1),
        "latency_p99_ms": round(1000 * percentile([r.latency_s for r in records], 99), 1),
        "model_share": round(len(written) / len(records), 3),
        "served_by": dict(sorted(Counter(r.tier for r in records).items())),
        "generated_tokens": sum(r.generated_tokens for r in written),
        "model_finish_reasons": dict(sorted(Counter(r.finish_reason for r in written).items())),
        "model_replies_storable": sum(r.entropy_bits <= max_entropy_bits for r in ended),
    }


def engine_for(chat_model: ChatModel, instructions: str, scratch: str, name: str, kv_budget: int) -> ChatEngine:
    """One of `CONFIGURATIONS`, on its own session database, warmed up off the record."""
    every = name == "all_tiers"
    engine = ChatEngine(
        chat_model,
        system_prompt=instructions,
        store=f"sqlite:///{scratch}/{name}.db",
        answer_cache=AnswerCacheConfig() if every else False,
        prefetch=every,
        token_tier=TokenTierConfig(enabled=name != "nothing_cached", memory_budget_bytes=kv_budget, spill_dir=None),
    )
    engine.warm_up()
    return engine


def model_reply(engine: ChatEngine, record: TurnRecord, key: str, max_new_tokens: int) -> str:
    """What the model writes, greedily, for `record`'s question after `record`'s history."""
    messages = [Message(role, text) for pair in record.history for role, text in zip(("user", "assistant"), pair)]
    with engine.complete([*messages, Message("user", record.question.text)], kv_key=key, max_new_tokens=max_new_tokens) as stream:
        for _ in stream:
            pass
    assert stream.reply is not None
    return stream.reply.text


def compare_uncached(engine: ChatEngine, records: list[TurnRecord], checks: int, max_new_tokens: int) -> dict[str, Any]:
    """Replay (a)'s served turns, and `checks` of its model-written ones, on `engine` (prefix caching only)."""
    served = [r for r in records if r.tier == "answer"]
    written = [r for r in records if r.tier in MODEL_TIERS]
    checked = written[:: max(1, len(written) // checks)][:checks] if checks else []
    result: dict[str, Any] = {}
    for label, chosen in (("served", served), ("model_written_check", checked)):
        differing = []
        for number, record in enumerate(chosen):
            own = model_reply(engine, record, f"replay-{label}-{number}", max_new_tokens)
            if own != record.reply:
                differing.append({"session": record.session_id, "question": record.question.text, "kind": record.question.kind,
                                  "history_turns": len(record.history), "with_tiers": record.reply, "model": own})  # fmt: skip
        result[label] = {
            "turns": len(chosen),
            "equal": len(chosen) - len(differing),
            "equal_share": round(1 - len(differing) / len(chosen), 3) if chosen else None,
            "differing": differing,
        }
    return result


def draft_turns(records: list[TurnRecord], count: int) -> list[drafted_decode.Turn]:
    """`count` of the model-written turns, spread over the run (taken again from the start if
    there are fewer), each with the history its session had."""
    written = [drafted_decode.Turn(r.history, r.question.text) for r in records if r.tier in MODEL_TIERS]
    if not written or not count:
        return []
    spread = written[:: max(1, len(written) // count)]
    return [spread[i % len(spread)] for i in range(count)]


def compare_drafted(engine: ChatEngine, chat_model: ChatModel, records: list[TurnRecord], args: argparse.Namespace) -> dict[str, Any]:
    """Decode with drafts against without on (b)'s model-written turns, at N = 1 and N = 8, on (b)'s engine."""
    turns = {1: draft_turns(records, args.draft_turns), 8: draft_turns(records, 8 * args.draft_batches)}
    if turns[1]:  # the first multi-token steps of a process are slow: run some off the record
        with drafted_decode.drafting(chat_model, args.draft_tokens):
            drafted_decode.answer(engine, turns[1][0], "draft-warm-up", 8)
    return {f"n{n}": drafted_decode.compare(engine, chat_model, chosen, n, args.draft_tokens, args.max_new_tokens)
            for n, chosen in turns.items()}  # fmt: skip


def plot(results: dict[str, dict[str, Any]], path: Path, drafts: dict[str, Any] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    figure, axes = plt.subplots(1, 3 if drafts else 2, figsize=(15 if drafts else 10, 3.8))
    rate, latency = axes[0], axes[1]
    rate.bar(names, [results[n]["turns_per_s"] for n in names], color=["#2a7", "#37c", "#999"][: len(names)])
    rate.set_ylabel("turns/s")
    keys = ("ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms", "latency_p99_ms")
    for i, key in enumerate(keys):
        latency.bar([x + 0.2 * i for x in range(len(names))], [results[n][key] / 1000 for n in names], width=0.2, label=key[:-3])
    latency.set_xticks([x + 0.3 for x in range(len(names))], names)
    latency.set_ylabel("seconds")
    latency.set_yscale("log")
    latency.legend(fontsize=8)
    if drafts:  # decode tokens/s of (b)'s model-written turns, plain and drafted, at N = 1 and 8
        sides = list(drafts)
        for i, (side, key) in enumerate((("plain", "plain_decode_tokens_per_s"), ("drafted", "drafted_decode_tokens_per_s"))):
            values = [float(np.mean(drafts[n][key])) if drafts[n][key] else 0.0 for n in sides]
            axes[2].bar([x + 0.4 * i for x in range(len(sides))], values, width=0.4, label=side, color=["#999", "#2a7"][i])
        axes[2].set_xticks([x + 0.2 for x in range(len(sides))], [f"N = {drafts[n]['at_once']}" for n in sides])
        axes[2].set_ylabel("decode tokens/s (mean of runs)")
        axes[2].legend(fontsize=8)
    figure.suptitle("model-written customer service, bank knowledge prompt (SmolLM2-135M, CPU)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def identical_share(drafts: dict[str, Any]) -> float | None:
    """Drafted replies identical to the plain ones, at N = 1 and N = 8 together."""
    turns = sum(d["turns"] for d in drafts.values())
    return round(sum(d["identical"] for d in drafts.values()) / turns, 3) if turns else None


def accepted_share(drafts: dict[str, Any]) -> float | None:
    """Drafted tokens the model accepted, at N = 1 and N = 8 together."""
    drafted = sum(d["drafted_tokens"] for d in drafts.values())
    return round(sum(d["accepted_tokens"] for d in drafts.values()) / drafted, 3) if drafted else None


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--visits", type=int, default=None, help="customer visits (default 48, quick 8)")
    parser.add_argument("--at-once", type=int, default=None, help="visits served at the same time (default 8, quick 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the intents' popularity")
    parser.add_argument("--returning-share", type=float, default=0.25, help="share of visits that continue an earlier customer's session")
    parser.add_argument("--checks", type=int, default=None, help="model-written turns replayed to check the replay (default 4, quick 2)")
    parser.add_argument("--kv-budget-gib", type=float, default=2.0, help="the token tier's memory budget, the same in every configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-tokens", type=int, default=8, help="drafted tokens a row is fed at most per step, when drafting")
    parser.add_argument("--draft-turns", type=int, default=None, help="model-written turns answered plain and drafted one at a time (default 16, quick 4)")
    parser.add_argument("--draft-batches", type=int, default=None, help="batches of 8 such turns answered plain and drafted at once (default 2, quick 1)")
    args = parser.parse_args()
    args.visits = args.visits or (8 if args.quick else 48)
    args.at_once = args.at_once or (4 if args.quick else 8)
    args.checks = args.checks if args.checks is not None else (2 if args.quick else 4)
    args.draft_turns = args.draft_turns if args.draft_turns is not None else (4 if args.quick else 16)
    args.draft_batches = args.draft_batches if args.draft_batches is not None else (1 if args.quick else 2)
    run = BenchRun("model_answered", args, minutes=(35, 5))  # estimated from a quick run under load (11.4 min there), not yet timed quiet
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bot = load_bot("bank")
    pool = question_pool(args.data, bot)
    visits = workload(pool, args.visits, args.seed, args.zipf, args.returning_share)
    questions = [q for visit in visits for q in visit.questions]
    chat_model = load_chat_model("bundled", device="cpu")
    run.section("workload", {
        "model": "bundled (SmolLM2-135M-Instruct, float32, CPU)",
        "system_prompt_tokens": len(PromptRenderer(chat_model.tokenizer).system_ids(bot.instructions)),
        "intents": len(pool),
        "wordings": sum(len(texts) for texts in pool.values()),
        "visits": len(visits),
        "returning_visits": sum(v.returning for v in visits),
        "turns": len(questions),
        "kinds": dict(sorted(Counter(q.kind for q in questions).items())),
        "distinct_intents_asked": len({q.intent for q in questions}),
        "most_asked_intents": Counter(q.intent for q in questions if q.kind != "follow_up").most_common(5),
        "repeated_prompts": (repeated := repeated_prompts(visits)),
        "all_tiers_vs_prefix_only_ceiling": ratio(len(questions), len(questions) - repeated),  # with served replies all the model's own
    })  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    records: dict[str, list[TurnRecord]] = {}
    entropy_bound = AnswerCacheConfig().max_entropy_bits
    kv_budget = int(args.kv_budget_gib * (1 << 30))
    with tempfile.TemporaryDirectory() as scratch:
        for name in CONFIGURATIONS:
            engine = engine_for(chat_model, bot.instructions, scratch, name, kv_budget)
            with engine:
                wall_s, records[name] = replay(engine, visits, args.at_once, args.max_new_tokens)
                results[name] = summary(wall_s, records[name], entropy_bound)
                if engine.answer_cache is not None:
                    results[name]["answer_cache"] = {k: v for k, v in asdict(engine.answer_cache.snapshot()).items() if v}
                run.section("configurations", results)
                if name == "prefix_only":  # (b)'s engine writes the model's own reply for (a)'s served turns
                    agreement = compare_uncached(engine, records["all_tiers"], args.checks, args.max_new_tokens)
                    run.section("served_against_model", agreement)
                    drafts = compare_drafted(engine, chat_model, records[name], args)
                    run.section("drafted_against_plain", drafts)
                    # The peer on the same N = 1 turns: transformers' own prompt-lookup decoding.
                    peer = drafted_decode.transformers_prompt_lookup(
                        bundled_chat_dir(), bot.instructions, draft_turns(records[name], args.draft_turns), args.draft_tokens, args.max_new_tokens
                    )
                    run.section("transformers_prompt_lookup", peer)
            del engine
            gc.collect()  # the engine's KV (up to the budget) goes before the next one fills its own
    run.section("turns", {name: [asdict(r) | {"history": len(r.history)} for r in turns] for name, turns in records.items()})
    plot_path = Path(args.out) / "model_answered.png"
    plot(results, plot_path, drafts)
    rate = {name: results[name]["turns_per_s"] for name in CONFIGURATIONS}
    run.finish(
        plot=str(plot_path),
        targets={"all_tiers_vs_none": ">= 3.7", "all_tiers_vs_prefix_only": ">= 2", "served_equal_share": ">= 0.99",
                 "draft_speedup_n1": ">= 2", "draft_speedup_n8": ">= 1.3", "draft_identical_share": "1.0"},
        all_tiers_vs_none=ratio(rate["all_tiers"], rate["nothing_cached"]),
        all_tiers_vs_prefix_only=ratio(rate["all_tiers"], rate["prefix_only"]),
        served_equal_share=agreement["served"]["equal_share"],
        draft_speedup_n1=drafts["n1"]["speedup"],
        draft_speedup_n8=drafts["n8"]["speedup"],
        draft_identical_share=identical_share(drafts),
        draft_accepted_share=accepted_share(drafts),
        transformers_prompt_lookup_speedup_n1=peer["speedup"],
        complete=True,  # every key is measured; served_equal_share is null only when no turn was served
    )


if __name__ == "__main__":
    main()
