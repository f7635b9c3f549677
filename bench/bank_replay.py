"""The bank bot under scripted customers, with every tier on against every tier off.

The design's claim (+270% QPS from the caches) measured on the shipped `bank` bot. Each
scripted customer is one session of a few turns, drawn with a fixed seed:

- questions from BANKING77 (rows of the bot's question intents that are *not* among the
  bot's own examples, so the classifier has not seen them), most of them about a few hot
  intents (Zipf-weighted, as customer questions are), the first turn of the session;
- the same question again in other words (another held-out row of the same intent);
- multi-turn transfers (ask, amount, account, "yes"), balance checks (twice);
- a share of customers that ask for a person at the end.

The same script runs three times, `--at-once` customers at a time in threads, on one model:
(1) the bank bot with every tier on: the answer cache, drift detection, the token tier (the
shared system prompt with the knowledge base, each session's KV across turns); (2) the bank bot
with every tier off: no answer cache, no drift, a token tier that reuses nothing; (3) the model
alone (no bot, tiers off) on the bot's instructions, what a bank without chatcache's dialogue
layer would run, on the first `--model-only-customers` customers only (each of its turns
prefills the 2,700-token instructions from scratch: about a minute a turn here). (1) and (2) both have the dialogue layer, the knowledge base's curated answers
and the demo core-banking backend: those are the bot, not a cache; the tool-result cache stays
on in both (it saves a SQLite read, not model time). Reported for each: turns/s, p50 and p99
latency per turn, the share of turns the model wrote; and per turn whether (1)'s reply is the
same text as (2)'s. A reply a tier served (an answer-cache hit, a reused KV) must equal the
reply without it; a difference is listed.

    python -m bench.bank_replay [--data ../shared/data] [--quick] [--customers 24] [--at-once 4]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

from chatcache import AnswerCacheConfig, ChatEngine, TokenTierConfig, load_chat_model
from chatcache.model.loading import ChatModel
from chatcache.dialog import BotDefinition, load_bot
from chatcache.dialog.training import read_labelled

from .common import BenchRun, bench_arguments

MODEL_TIERS = frozenset({"session", "disk", "prefix", "none"})  # the model wrote the reply
SERVED_BY_A_TIER = (MODEL_TIERS - {"none"}) | {"answer"}  # a reused KV, or the answer cache
HOT_INTENTS = 8  # the questions most customers ask are about this many intents
AMOUNTS = ("20", "45", "120", "250", "80")


@dataclass(frozen=True)
class Customer:
    session_id: str
    turns: tuple[str, ...]


def held_out_questions(bot: BotDefinition, train_csv: Path) -> dict[str, list[str]]:
    """BANKING77 rows of the bot's question intents that the classifier was not trained on."""
    rows = read_labelled(train_csv)
    answered = {intent.name: set(intent.examples) for intent in bot.intents if intent.answer is not None}
    return {name: [t for t in rows.get(name, []) if t not in seen] for name, seen in answered.items() if rows.get(name)}


def script(questions: dict[str, list[str]], customers: int, seed: int) -> list[Customer]:
    """The customers' sessions: a question first, then a mix of repeats, transfers, balances, a person."""
    rng = random.Random(seed)
    intents = sorted(questions)
    rng.shuffle(intents)
    weights = [1.0 / (rank + 1) for rank in range(len(intents))]  # Zipf: a few intents get most questions
    hot = intents[:HOT_INTENTS]
    scripted = []
    for number in range(customers):
        intent = rng.choices(intents, weights)[0]
        turns = [rng.choice(questions[intent])]
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(("repeat", "question", "transfer", "balance"))
            if kind == "repeat":
                turns.append(rng.choice(questions[intent]))
            elif kind == "question":
                turns.append(rng.choice(questions[rng.choice(hot)]))
            elif kind == "transfer":
                account = f"{rng.randrange(10**7, 10**8)}"
                turns += ["I want to send money to someone", rng.choice(AMOUNTS), account, "yes"]
            else:
                turns += ["What's my balance?", "How much money do I have?"]
        if rng.random() < 0.2:
            turns.append("I want to talk to a human")
        scripted.append(Customer(f"customer-{number}", tuple(turns)))
    return scripted


@dataclass
class TurnRecord:
    customer: str
    index: int
    text: str
    reply: str
    tier: str
    latency_s: float


def replay(engine: ChatEngine, customers: list[Customer], at_once: int, max_new_tokens: int) -> tuple[float, list[TurnRecord]]:
    """Every customer's turns in order, `at_once` customers at a time; the wall time and each turn."""
    records: list[TurnRecord] = []
    lock = threading.Lock()
    queue = list(reversed(customers))

    def serve() -> None:
        while True:
            with lock:
                if not queue:
                    return
                customer = queue.pop()
            for index, text in enumerate(customer.turns):
                started = time.perf_counter()
                reply = engine.chat(customer.session_id, text, max_new_tokens=max_new_tokens)
                record = TurnRecord(customer.session_id, index, text, reply.text, reply.stats.tier, time.perf_counter() - started)
                with lock:
                    records.append(record)

    started = time.perf_counter()
    threads = [threading.Thread(target=serve) for _ in range(at_once)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, records


def summary(wall_s: float, records: list[TurnRecord]) -> dict[str, Any]:
    latencies = sorted(r.latency_s for r in records)
    tiers = Counter(record.tier for record in records)
    return {
        "turns": len(records),
        "wall_s": round(wall_s, 1),
        "turns_per_s": round(len(records) / wall_s, 3),
        "latency_p50_ms": round(1000 * statistics.median(latencies), 1),
        "latency_p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
        "model_share": round(sum(r.tier in MODEL_TIERS for r in records) / len(records), 3),
        "served_by": dict(sorted(tiers.items())),
    }


def engine_for(chat_model: ChatModel, bot: BotDefinition, scratch: str, config: str) -> ChatEngine:
    """The bank bot with every tier on or off, or the model alone on the bot's instructions."""
    tiers = config == "tiers_on"
    return ChatEngine(
        chat_model,
        bot="bank" if config != "model_only" else None,
        system_prompt=bot.instructions if config == "model_only" else None,
        store=f"sqlite:///{scratch}/sessions.db",
        answer_cache=AnswerCacheConfig() if tiers else False,
        drift=tiers,
        token_tier=TokenTierConfig(enabled=tiers, spill_dir=None),
    )


def compare(on: Iterable[TurnRecord], off: Iterable[TurnRecord]) -> dict[str, Any]:
    """Turn by turn: do the replies with the tiers equal those without?

    An action's reply is compared apart: the customers share one demo account (the engine's
    user), so its references and balances follow the order in which concurrent turns reached
    the bank, which differs from run to run with or without tiers.
    """
    without = {(r.customer, r.index): r for r in off}
    differing, actions_differing = [], 0
    served = same_served = 0
    for record in on:
        other = without[(record.customer, record.index)]
        by_a_tier = record.tier in SERVED_BY_A_TIER
        served += by_a_tier
        same_served += by_a_tier and record.reply == other.reply
        if record.reply == other.reply:
            continue
        if record.tier == "action" and other.tier == "action":
            actions_differing += 1
            continue
        differing.append({"customer": record.customer, "turn": record.index, "user": record.text, "tier": record.tier,
                          "with_tiers": record.reply, "without": other.reply})  # fmt: skip
    total = len(without)
    return {
        "turns": total,
        "identical_share_outside_actions": round(1 - len(differing) / total, 3),
        "action_replies_differing_by_order": actions_differing,
        "served_by_a_tier": served,
        "identical_among_served_by_a_tier": round(same_served / served, 3) if served else None,
        "differing": differing,
    }


def plot(results: dict[str, dict[str, Any]], path: str) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(9, 3.5))
    rate.bar(names, [results[n]["turns_per_s"] for n in names], color=["#999", "#2a7", "#c63"][: len(names)])
    rate.set_ylabel("turns/s")
    rate.set_yscale("log")
    for i, key in enumerate(("latency_p50_ms", "latency_p99_ms")):
        latency.bar([x + 0.4 * i for x in range(len(names))], [results[n][key] / 1000 for n in names], width=0.4, label=key[8:11])
    latency.set_xticks([x + 0.2 for x in range(len(names))], names)
    latency.set_ylabel("seconds per turn")
    latency.legend()
    figure.suptitle("bank bot, scripted customers (SmolLM2-135M, 2 CPU cores)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--customers", type=int, default=None, help="scripted customers (default 24, quick 8)")
    parser.add_argument("--at-once", type=int, default=4, help="customers served at the same time")
    parser.add_argument("--model-only-customers", type=int, default=None, help="customers the model alone serves (default 4, quick 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    customers_count = args.customers or (8 if args.quick else 24)
    model_only_count = args.model_only_customers or (2 if args.quick else 4)
    run = BenchRun("bank_replay", args, minutes=(8, 5))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bot = load_bot("bank")
    customers = script(held_out_questions(bot, args.data / "banking77" / "train.csv"), customers_count, args.seed)
    run.section("script", {"customers": len(customers), "turns": sum(len(c.turns) for c in customers)})
    chat_model = load_chat_model("bundled", device="cpu")
    results: dict[str, Any] = {}
    records: dict[str, list[TurnRecord]] = {}
    for name in ("tiers_off", "tiers_on", "model_only"):
        # The model alone takes a minute a turn here: it runs on the first customers only, its rate comparable.
        replayed = customers[:model_only_count] if name == "model_only" else customers
        with tempfile.TemporaryDirectory() as scratch:
            os.environ["CHATCACHE_BANK_DB"] = f"sqlite:///{scratch}/bank.db"  # the same fresh demo bank each time
            with engine_for(chat_model, bot, scratch, name) as engine:
                wall_s, records[name] = replay(engine, replayed, args.at_once, args.max_new_tokens)
            results[name] = summary(wall_s, records[name])
            run.section(name, results[name])
    agreement = compare(records["tiers_on"], records["tiers_off"])
    run.section("agreement", agreement)
    path = str(args.out / "bank_replay.png")
    plot(results, path)
    run.finish(
        plot=path,
        speedup_turns_per_s=round(results["tiers_on"]["turns_per_s"] / results["tiers_off"]["turns_per_s"], 2),
        bot_to_model_only_turns_per_s=round(results["tiers_on"]["turns_per_s"] / results["model_only"]["turns_per_s"], 2),
        target={"speedup_turns_per_s": ">= 3.7", "identical_among_served_by_a_tier": "1.0"},
    )


if __name__ == "__main__":
    main()
