"""Three replicas behind the router: session affinity against none.

`chatcache cluster` on this machine (PostgreSQL, HAProxy, `--replicas` replicas of
`chatcache serve` on the bundled model, one torch thread each), the same SGD dev conversations
behind a ~1,000-token system prompt, `--at-once` closed-loop clients streaming one new message
per turn to `/v1/chat/completions` with `X-Session-Id`. Side by side in one run, each on a
fresh cluster:

1. affinity: HAProxy hashes the session id consistently (the cluster's default), so every
   turn of a conversation lands on the replica that holds its KV;
2. no affinity, the replicas sharing one data directory: each turn lands on a replica picked
   at random, which reuses what it has of the session (its own KV from an earlier turn,
   cropped, or a file another replica spilled) and prefills the rest;
3. no affinity, each replica with its own data directory: no spill file is shared.

The issue names round-robin as the baseline; HAProxy's `roundrobin` was measured first and is
not used: closed-loop clients as many as the replicas (or a multiple) send their turns in
the rotation's own order, so round-robin kept 4 of 6 conversations on one replica, pinning
them by accident. A random pick spreads turns as round-robin does under arrivals in no order.
Each turn goes on a new connection (`Connection: close`): on a kept-alive one the router
stays with the replica it chose first.

For each: the share of turns after a conversation's first whose prompt reused the session's
own KV (tier "session": in the replica's memory, or "disk": a spill file restored), the share
of prompt tokens served from KV, client TTFT p50/p99, generated tokens/s, and which replica
served each turn. Targets (issue 14): with affinity, >= 90% of those turns reuse their
session's KV; its TTFT p50 at least 3x lower than (3)'s.

    python -m bench.replicas [--data ../shared/data] [--quick] [--conversations 12] [--at-once 6] [--turns 8]
        [--max-new-tokens 64] [--replicas 3]

About 10 minutes on the 2-core machine (`--quick`: 6 conversations of 3 turns, 5 min).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer

from chatcache import cluster
from chatcache.model.loading import bundled_chat_dir

from .common import BenchRun, bench_arguments, schema_system_prompt, sgd_user_turns
from .peer_protocol import percentile
from .serve_load import Served, post_streaming

REUSED_OWN_KV = ("session", "disk")
PHASES: tuple[tuple[str, str, cluster.Balance, bool], ...] = (
    ("affinity", "session affinity (consistent hash of the session id)", "session", False),
    ("no_affinity_shared", "no affinity (random), one shared data directory", "random", False),
    ("no_affinity_own", "no affinity (random), each replica its own data directory", "random", True),
)


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_arguments(parser)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=None, help="SGD dev conversations (default 12, quick 6)")
    parser.add_argument("--at-once", type=int, default=None, help="clients at once (default 6, quick 3)")
    parser.add_argument("--turns", type=int, default=None, help="user turns per conversation (default 8, quick 3)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--system-tokens", type=int, default=1000)
    args = parser.parse_args()
    args.conversations = args.conversations or (6 if args.quick else 12)
    args.at_once = args.at_once or (3 if args.quick else 6)
    args.turns = args.turns or (3 if args.quick else 8)
    return args


def run_phase(url: str, conversations: list[list[str]], at_once: int, max_new_tokens: int) -> dict[str, Any]:
    """Every conversation through the router, `at_once` clients each taking the next conversation."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    turns: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    queue = list(enumerate(conversations))

    def client() -> None:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0)) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    index, texts = queue.pop(0)
                for turn, text in enumerate(texts):
                    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_new_tokens, "stream": True}
                    try:
                        # A new connection per turn, so the router chooses per turn (it keeps a
                        # kept-alive connection on the replica it chose first).
                        headers = {"X-Session-Id": f"replicas-{index}", "Connection": "close"}
                        outcome = post_streaming(http, "/v1/chat/completions", headers, body)
                    except Exception as error:  # noqa: BLE001 - recorded; the conversation goes on
                        with lock:
                            errors.append(f"conversation {index} turn {turn}: {type(error).__name__}: {error}")
                        continue
                    if isinstance(outcome, Served):
                        with lock:
                            turns.append({"conversation": index, "turn": turn, **outcome.__dict__})

    started = time.perf_counter()
    clients = [threading.Thread(target=client) for _ in range(at_once)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    wall_s = time.perf_counter() - started
    return {"turns": turns, "errors": errors, "wall_s": wall_s}


def figures(result: dict[str, Any]) -> dict[str, Any]:
    turns = result["turns"]
    later = [t for t in turns if t["turn"] > 0 and t["tier"] != "answer"]
    ttft = [t["ttft_s"] for t in turns]
    prompt_tokens = sum(t["reused_tokens"] + t["prefilled_tokens"] for t in later)
    replicas_of: dict[int, set[str]] = {}
    for t in turns:
        replicas_of.setdefault(t["conversation"], set()).add(str(t["replica"]))
    return {
        "turns": len(turns),
        "errors": result["errors"][:10],
        "later_turns": len(later),
        "later_turns_reusing_own_kv": round(sum(t["tier"] in REUSED_OWN_KV for t in later) / max(1, len(later)), 3),
        "later_prompt_tokens_from_kv": round(sum(t["reused_tokens"] for t in later) / max(1, prompt_tokens), 3),
        "tiers": dict(Counter(str(t["tier"]) for t in turns)),
        "ttft_p50_ms": round(percentile([s * 1000 for s in ttft], 50), 1),
        "ttft_p99_ms": round(percentile([s * 1000 for s in ttft], 99), 1),
        "tokens_per_s": round(sum(t["generated_tokens"] for t in turns) / result["wall_s"], 2),
        "wall_s": round(result["wall_s"], 1),
        "conversations_on_more_than_one_replica": sum(len(names) > 1 for names in replicas_of.values()),
        "turns_by_replica": dict(Counter(str(t["replica"]) for t in turns)),
    }


def plot(rows: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(rows)
    left.bar(names, [rows[n]["later_turns_reusing_own_kv"] for n in names], color=["C0", "C1", "C2"][: len(names)])
    left.axhline(0.9, color="red", linestyle="--", label="target 0.9 (affinity)")
    left.set_ylabel("later turns reusing their session's KV")
    left.set_ylim(0, 1)
    left.legend(fontsize=8)
    right.bar([f"{n}\np50" for n in names], [rows[n]["ttft_p50_ms"] for n in names], color="C0")
    right.bar([f"{n}\np99" for n in names], [rows[n]["ttft_p99_ms"] for n in names], color="C3")
    right.set_ylabel("client TTFT (ms)")
    right.tick_params(axis="x", labelsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    args = parse_options()
    run = BenchRun("replicas", args, minutes=(10, 5))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    weights = bundled_chat_dir()  # converted from the GGUF once, here, before any replica starts
    tokenizer = AutoTokenizer.from_pretrained(weights)
    system_prompt = schema_system_prompt(args.data, tokenizer, target_tokens=args.system_tokens)
    conversations = [turns[: args.turns] for _, turns in sgd_user_turns(args.data, args.conversations, min_turns=args.turns)]
    run.section("setup", {
        "model": "bundled (SmolLM2-135M-Instruct, float32, CPU), one torch thread per replica",
        "replicas": args.replicas,
        "system_prompt_tokens": len(tokenizer.encode(system_prompt, add_special_tokens=False)),
        "conversations": len(conversations),
        "turns": sum(map(len, conversations)),
    })  # fmt: skip
    options = ["--model", str(weights), "--system", system_prompt]
    rows: dict[str, dict[str, Any]] = {}
    for key, label, balance, own_data_dirs in PHASES:
        with tempfile.TemporaryDirectory(prefix="bench-replicas-") as scratch:
            environment = {"CHATCACHE_DATA_DIR": scratch, "OMP_NUM_THREADS": "1"}
            previous = {name: os.environ.get(name) for name in environment}
            os.environ.update(environment)
            try:
                state = cluster.up(args.replicas, cluster.free_port(), serve_options=options, balance=balance, own_data_dirs=own_data_dirs)
                try:
                    result = run_phase(state.router.url, conversations, args.at_once, args.max_new_tokens)
                finally:
                    cluster.stop(state)
            finally:
                for name, value in previous.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
        rows[key] = {"label": label, **figures(result)}
        run.section(key, rows[key])
    plot_path = Path(args.out) / "replicas.png"
    plot(rows, plot_path, f"{args.replicas} replicas of the bundled model behind HAProxy, {len(conversations)} SGD conversations")
    affinity, own = rows["affinity"], rows["no_affinity_own"]
    run.finish(
        plot=str(plot_path),
        affinity_reuse=affinity["later_turns_reusing_own_kv"],
        ttft_p50_no_affinity_own_to_affinity=round(own["ttft_p50_ms"] / max(affinity["ttft_p50_ms"], 1e-9), 2),
        targets={"affinity_reuse": ">= 0.90", "ttft_p50_no_affinity_own_to_affinity": ">= 3"},
    )


if __name__ == "__main__":
    main()
