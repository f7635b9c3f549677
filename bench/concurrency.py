"""Many conversations at once on one model: the scheduler against the same turns one at a time.

SGD dev conversations behind a ~1,000-token system prompt (`--system-tokens`), each a closed loop (it sends its
next user turn when its reply ends), N of them at once in N threads on one `ChatEngine`, on
the bundled model. Side by side in one run: (a) chatcache with its scheduler at each N,
(b) the same turns one at a time (one thread, today's behaviour before the scheduler). For
each: aggregate generated tokens/s, turns/s, TTFT p50/p99, time per output token p50, and the
token tier's resident KV against its budget. A PNG plots throughput and TTFT against N.

(c) The limit: the raw batched forward of the same turn shapes with no engine around it
(`raw_forward_limit`), after each N. (d) The peers a user would pick instead, each in its own
virtualenv (`make peers`; `bench/peers.py`), on the same weights and turns, right after each N:
vLLM's CPU build (fp32, prefix caching) on the converted safetensors, and llama.cpp
(llama-cpp-python, one conversation's turn at a time) on the bundled Q4_1 GGUF. A peer that is
not installed is named in the JSON with the reason, and the rest runs.

`--compiled-decode` runs chatcache with its decode step compiled (`load_chat_model(...,
compiled_decode=True)`; the buckets compile before the first turn), so that `vs_vllm_at_8`, beside
the table, compares it with vLLM-CPU in the same run: tokens/s and TTFT p50 at 8 conversations.

    python -m bench.concurrency [--data ../shared/data] [--quick] [--max-new-tokens 64] [--turns 8] [--compiled-decode]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformers import DynamicCache

from chatcache import ChatEngine, Reply, TokenTierConfig, load_chat_model
from chatcache.model.intra_op_threads import model_threads

from .common import BenchRun, bench_arguments, schema_system_prompt, sgd_user_turns
from .peers import PeerError, start_peers


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else 0.0


PEER_LABELS = {"vllm": "vLLM-CPU (fp32, prefix caching)", "llamacpp": "llama.cpp (Q4_1 GGUF, one at a time)"}
Shape = tuple[int, int, int]  # one turn: tokens reused from the KV, tokens prefilled, tokens generated


def converse(
    engine: ChatEngine, conversations: list[list[str]], prefix: str, max_new_tokens: int, threads: bool
) -> tuple[dict[str, Any], list[list[Shape]]]:
    """Run every conversation to its end, all at once (threads) or one after another; their
    figures, and each round's turn shapes (round t: every conversation's turn t) for the limit."""
    replies: list[Reply] = []
    rounds: list[list[Shape]] = [[] for _ in range(max(len(turns) for turns in conversations))]
    lock = threading.Lock()

    def run(index: int, turns: list[str]) -> None:
        for turn, text in enumerate(turns):
            reply = engine.chat(f"{prefix}-{index}", text, max_new_tokens=max_new_tokens)
            stats = reply.stats
            with lock:
                replies.append(reply)
                rounds[turn].append((stats.reused_tokens, stats.prefilled_tokens, stats.generated_tokens))

    done = threading.Event()
    peak_kv = [0]

    def sample_kv() -> None:  # the budget holds at every moment, not only at the end
        while not done.wait(0.2):
            peak_kv[0] = max(peak_kv[0], engine.kv_stats().resident_bytes)

    sampler = threading.Thread(target=sample_kv, daemon=True)
    sampler.start()
    started = time.perf_counter()
    if threads:
        workers = [threading.Thread(target=run, args=(i, turns)) for i, turns in enumerate(conversations)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    else:
        for index, turns in enumerate(conversations):
            run(index, turns)
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    tokens = sum(r.stats.generated_tokens for r in replies)
    per_token = [1 / r.stats.decode_tokens_per_s for r in replies if r.stats.decode_tokens_per_s > 0]
    return {
        "conversations": len(conversations),
        "turns": len(replies),
        "generated_tokens": tokens,
        "wall_s": round(elapsed, 2),
        "tokens_per_s": round(tokens / elapsed, 2),
        "turns_per_s": round(len(replies) / elapsed, 3),
        "ttft_p50_ms": round(percentile([r.stats.ttft_s * 1000 for r in replies], 50), 1),
        "ttft_p99_ms": round(percentile([r.stats.ttft_s * 1000 for r in replies], 99), 1),
        "time_per_output_token_p50_ms": round(percentile(per_token, 50) * 1000, 1),
        "kv_resident_bytes": engine.kv_stats().resident_bytes,
        "kv_peak_resident_bytes": max(peak_kv[0], engine.kv_stats().resident_bytes),
        "longest_context_tokens": max(r.stats.reused_tokens + r.stats.prefilled_tokens + r.stats.generated_tokens for r in replies),
    }, rounds


@model_threads()  # timed in this thread: on the threads the engine's worker has
def raw_forward_limit(model: Any, rounds: list[list[Shape]]) -> dict[str, Any]:
    """The same work on the bare model: what an engine with no overhead at all could reach.

    Each round batches every conversation's turn in lockstep: its context is prefilled untimed,
    then timed are one batched prefill of the new tokens and the decode steps, rows leaving the
    batch as their reply ends (as a perfect scheduler would). Token ids are random: only the
    shapes matter for speed.
    """
    timed, tokens = 0.0, 0
    with torch.no_grad():
        for shapes in rounds:
            rows = len(shapes)
            context, new = max(s[0] for s in shapes), max(s[1] for s in shapes)
            longest = max(s[2] for s in shapes)
            mask = torch.zeros(rows, context + new + longest, dtype=torch.long)
            for row, (reused, prefilled, _) in enumerate(shapes):  # left-padded context, then left-padded new tokens
                mask[row, context - reused : context] = 1
                mask[row, context + new - prefilled : context + new] = 1
            mask[:, context + new :] = 1
            cache = DynamicCache(config=model.config)
            ids = torch.randint(100, 1000, (rows, context + new + longest))
            if context:
                model(input_ids=ids[:, :context], attention_mask=mask[:, :context], past_key_values=cache, logits_to_keep=1)
            started = time.perf_counter()
            model(input_ids=ids[:, context : context + new], attention_mask=mask[:, : context + new], past_key_values=cache, logits_to_keep=1)
            alive = torch.arange(rows)
            for step in range(1, longest):  # the first token came from the prefill
                still = torch.tensor([int(r) for r in alive if shapes[int(r)][2] > step], dtype=torch.long)
                if len(still) < len(alive):
                    cache.batch_select_indices(torch.searchsorted(alive, still))
                    alive = still
                end = context + new + step
                model(input_ids=ids[alive, end - 1 : end], attention_mask=mask[alive, :end], past_key_values=cache, logits_to_keep=1)
            timed += time.perf_counter() - started
            tokens += sum(s[2] for s in shapes)
    return {"generated_tokens": tokens, "timed_s": round(timed, 2), "tokens_per_s": round(tokens / timed, 2)}


def plot(
    rows: list[dict[str, Any]],
    limits: list[dict[str, Any]],
    by_peer: dict[str, list[dict[str, Any]]],
    alone: dict[str, Any],
    path: Path,
    system_tokens: int,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [r["conversations"] for r in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(counts, [r["tokens_per_s"] for r in rows], "o-", label="chatcache scheduler")
    left.plot([r["conversations"] for r in limits], [r["tokens_per_s"] for r in limits], "k:", label="raw batched forward (limit)")
    for name, results in by_peer.items():
        left.plot([r["conversations"] for r in results], [r["tokens_per_s"] for r in results], "^--", label=PEER_LABELS[name])
        right.plot([r["conversations"] for r in results], [r["ttft_p50_ms"] for r in results], "^--", label=f"{PEER_LABELS[name]} p50")
    left.axhline(alone["tokens_per_s"], color="grey", linestyle="--", label="one at a time")
    left.set_xlabel("conversations at once")
    left.set_ylabel("generated tokens/s, all conversations")
    left.legend()
    right.plot(counts, [r["ttft_p50_ms"] for r in rows], "o-", label="chatcache TTFT p50")
    right.plot(counts, [r["ttft_p99_ms"] for r in rows], "s--", label="chatcache TTFT p99")
    right.set_xlabel("conversations at once")
    right.set_ylabel("time to first token (ms)")
    right.legend()
    figure.suptitle(f"SmolLM2-135M on CPU, {system_tokens}-token system prompt, closed loop")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--turns", type=int, default=None, help="user turns per conversation (default 8, quick 2)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="reply length (default 64, quick 32)")
    parser.add_argument("--counts", type=int, nargs="+", help="conversations at once (default 1 2 4 8 16, quick 1 4 8)")
    parser.add_argument("--system-tokens", type=int, default=1000, help="system prompt length in tokens (default 1000)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip vLLM-CPU and llama.cpp (`make peers`)")
    parser.add_argument("--compiled-decode", action="store_true", help="chatcache's decode step compiled by inductor (issue 42 section 3)")
    args = parser.parse_args()
    args.turns = args.turns or (2 if args.quick else 8)
    args.max_new_tokens = args.max_new_tokens or (32 if args.quick else 64)
    counts = args.counts or ([1, 4, 8] if args.quick else [1, 2, 4, 8, 16])
    if 8 not in counts or 1 not in counts:
        parser.error("--counts must include 1 and 8 (the targets compare them)")
    run = BenchRun("concurrency", args, minutes=(76, 8))  # with the peers (vLLM takes 2 to 4 minutes to start); the run of 2026-12-01 18:05
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    chat_model = load_chat_model("bundled", device="cpu", compiled_decode=args.compiled_decode)
    system_prompt = schema_system_prompt(args.data, chat_model.tokenizer, target_tokens=args.system_tokens)
    dialogues = [turns[: args.turns] for _, turns in sgd_user_turns(args.data, max(counts), min_turns=args.turns)]
    with tempfile.TemporaryDirectory() as scratch:
        config = TokenTierConfig(spill_dir=None)
        engine = ChatEngine(chat_model, system_prompt=system_prompt, token_tier=config, store=f"sqlite:///{scratch}/s.db")
        run.section("setup", {
            "model": "bundled (SmolLM2-135M-Instruct, float32, CPU)",
            "compiled_decode": args.compiled_decode,
            "torch_threads": torch.get_num_threads(),
            "system_prompt_tokens": len(engine.system_ids),
            "kv_budget_bytes": config.memory_budget_bytes,
        })  # fmt: skip
        engine.chat("warm-up", "Hello", max_new_tokens=4)
        peers, missing = start_peers(chat_model.tokenizer, Path(args.out)) if args.peers else ({}, {"all": "--no-peers"})
        run.section("peers_missing", missing)
        rows, limits = [], []
        by_peer: dict[str, list[dict[str, Any]]] = {name: [] for name in peers}
        try:
            for count in counts:  # interleaved: chatcache, the limit, then each peer, at every N
                row, rounds = converse(engine, dialogues[:count], f"n{count}", args.max_new_tokens, threads=True)
                rows.append({**row, "peak_batch": chat_model.scheduler.peak_running})
                run.section("scheduler", rows)
                limits.append({"conversations": count, **raw_forward_limit(chat_model.model, rounds)})
                limits[-1]["scheduler_to_limit"] = round(row["tokens_per_s"] / limits[-1]["tokens_per_s"], 3)
                run.section("raw_forward_limit", limits)
                for name, peer in list(peers.items()):
                    try:
                        by_peer[name].append(peer.run(system_prompt, dialogues[:count], max_new_tokens=args.max_new_tokens))
                    except PeerError as error:  # recorded; chatcache and the other peer go on
                        missing[name] = f"failed at N={count}: {error}"
                        peers.pop(name).close()
                        run.section("peers_missing", missing)
                    run.section("peers", by_peer)
        finally:
            for peer in peers.values():
                peer.close()
        alone, _ = converse(engine, dialogues[:8], "alone", args.max_new_tokens, threads=False)  # the 8 the target compares
        run.section("one_at_a_time", alone)
        engine.close()
    by_count = {r["conversations"]: r for r in rows}
    vllm_at_8 = next((r for r in by_peer.get("vllm", []) if r["conversations"] == 8), None)
    plot_path = Path(args.out) / "concurrency.png"
    plot(rows, limits, by_peer, alone, plot_path, system_tokens=len(engine.system_ids))
    run.finish(
        plot=str(plot_path),
        kv_peak_to_budget=round(max(r["kv_peak_resident_bytes"] for r in rows) / config.memory_budget_bytes, 3),
        longest_context_tokens=max(r["longest_context_tokens"] for r in rows),
        speedup_at_8=round(by_count[8]["tokens_per_s"] / alone["tokens_per_s"], 2),
        ttft_p50_ratio_8_to_1=round(by_count[8]["ttft_p50_ms"] / by_count[1]["ttft_p50_ms"], 2),
        scheduler_to_limit_at_8=next(r["scheduler_to_limit"] for r in limits if r["conversations"] == 8),
        **{
            f"scheduler_to_{name}_at_8": round(by_count[8]["tokens_per_s"] / next(r["tokens_per_s"] for r in results if r["conversations"] == 8), 3)
            for name, results in by_peer.items()
        },
        vs_vllm_at_8=None if vllm_at_8 is None else {
            "compiled_decode": args.compiled_decode,
            "tokens_per_s": [by_count[8]["tokens_per_s"], vllm_at_8["tokens_per_s"]],
            "tokens_per_s_ratio": round(by_count[8]["tokens_per_s"] / vllm_at_8["tokens_per_s"], 3),
            "ttft_p50_ms": [by_count[8]["ttft_p50_ms"], vllm_at_8["ttft_p50_ms"]],
        },
        targets={
            "speedup_at_8": ">= 3 (>= 4 under 600 tokens)",
            "ttft_p50_ratio_8_to_1": "<= 3",
            "scheduler_to_limit_at_8": ">= 0.85",
            "scheduler_to_vllm_at_8": ">= 0.7",
            "vs_vllm_at_8": "tokens_per_s_ratio >= 1 with --compiled-decode, chatcache's TTFT p50 below vLLM's (issue 42)",
            "kv_peak_to_budget": "<= 1",
        },
    )


if __name__ == "__main__":
    main()
