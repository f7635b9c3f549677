"""Token-tier benchmark: TTFT per turn of chatcache against a naive bot and the physical limit.

Side by side in one run, on the bundled model, behind a ~1,000-token static system prompt,
over the user turns of SGD dev dialogues:
  (a) chatcache: the engine as users run it;
  (b) naive: every turn prefills the whole history (`model.generate` on the full prompt);
  (c) limit: only the new tokens prefilled on an already-built cache, with no engine around it.
Then: a new session's first turn, restoring a spilled 2,000-token session against recomputing
it (float and int8 files), KV memory against its budget, and decode speed against the raw model.

    python -m bench.token_tier [--data ../shared/data] [--dialogues 3] [--out bench/out] [--quick]

About 12 minutes on 2 CPU cores; --quick (4 turns of one dialogue, 8-token replies, figures over
turns with >= 1,000 tokens of history, a 1,000-token restore timed once, a smaller memory run)
about 1.5 minutes. Results are written to bench/out/token_tier.json as
each section finishes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from chatcache import ChatEngine, TokenTierConfig, load_chat_model
from chatcache.config import GenerationConfig
from chatcache.model.generation import forward, generate_tokens, prefill
from chatcache.model.intra_op_threads import model_threads
from chatcache.model.kv import clone, crop_to, from_tensors, kv_bytes_per_token, new_cache, to_tensors
from chatcache.tiers.kv_spill import SpillStore

from .common import BenchRun, bench_arguments, median, schema_system_prompt, sgd_user_turns, timed

LONG_HISTORY = 1500


@model_threads()  # timed in this thread: on the threads the engine's worker has
def naive_ttft(model: Any, prompt: list[int]) -> float:
    """What a plain transformers bot pays for its first token: the whole prompt, every turn."""
    input_ids = torch.tensor([prompt])
    seconds, _ = timed(lambda: model.generate(input_ids, max_new_tokens=1, do_sample=False))
    return seconds


@model_threads()  # timed in this thread: on the threads the engine's worker has
def limit_ttft(model: Any, prompt: list[int], cached: Any, reused: int) -> float:
    """Prefill of only the uncached tokens on a cache built beforehand: no engine can beat it."""
    cache = clone(cached, model.config)
    crop_to(cache, reused)
    seconds, _ = timed(lambda: int(torch.argmax(forward(model, prompt[reused:], cache))))
    return seconds


def conversations(
    engine: ChatEngine, dialogues: list[tuple[str, list[str]]], max_new_tokens: int, max_turns: int | None, run: BenchRun
) -> list[dict[str, Any]]:
    model = engine.chat_model.model
    rows: list[dict[str, Any]] = []
    for dialogue_id, turns in dialogues:
        for turn, text in enumerate(turns[:max_turns]):
            reply = engine.chat(dialogue_id, text, max_new_tokens=max_new_tokens)
            stats = reply.stats
            entry = engine.token_tier._sessions[dialogue_id]
            prompt = entry.ids[: stats.prompt_tokens]
            rows.append(
                {
                    "dialogue": dialogue_id,
                    "turn": turn + 1,
                    "prompt_tokens": stats.prompt_tokens,
                    "reused_tokens": stats.reused_tokens,
                    "tier": stats.tier,
                    "ttft_chatcache_s": stats.ttft_s,
                    "ttft_naive_s": naive_ttft(model, prompt),
                    "ttft_limit_s": limit_ttft(model, prompt, entry.cache, stats.reused_tokens),
                    "decode_tokens_per_s": stats.decode_tokens_per_s,
                    "generated_tokens": stats.generated_tokens,
                }
            )
            run.section("turns", rows)
    return rows


@model_threads()  # timed in this thread: on the threads the engine's worker has
def restore_vs_recompute(engine: ChatEngine, tokens: int, workdir: Path, repeats: int = 3) -> dict[str, Any]:
    """Time bringing back a spilled `tokens`-long session against computing its KV again."""
    model = engine.chat_model.model
    ids = (engine.token_tier._sessions[next(iter(engine.token_tier._sessions))].ids * 4)[:tokens]
    caches = [new_cache(model.config) for _ in range(repeats)]
    recompute_s = median([timed(lambda: prefill(model, ids, cache))[0] for cache in caches])
    cache = caches[-1]  # the last timed recompute is the reference KV
    probe = ids[-1:]
    exact_logits = forward(model, probe, clone(cache, model.config))
    result: dict[str, Any] = {"tokens": tokens, "recompute_s": recompute_s}
    identity = (engine.chat_model.identity, engine.renderer.template_hash)
    layers = to_tensors(cache)
    for label, int8 in (("float", False), ("int8", True)):
        store = SpillStore(workdir / label, *identity, int8=int8, budget_bytes=1 << 34, keys=engine.token_tier.config.spill_keys)
        store.save("s", ids, layers)
        size = store.path("s").stat().st_size
        restore_s = median([timed(lambda: store.load("s", model.device))[0] for _ in range(repeats)])
        spilled = store.load("s", model.device)
        assert spilled is not None
        logits = forward(model, probe, from_tensors(model.config, spilled.layers))
        result[label] = {
            "file_bytes": size,
            "restore_s": restore_s,
            "speedup_vs_recompute": recompute_s / restore_s,
            "max_abs_kv_error": max(
                float((a - b).abs().max()) for pair, back in zip(layers, spilled.layers) for a, b in zip(pair, back)
            ),
            "max_abs_logit_error": float((logits - exact_logits).abs().max()),
            "same_next_token": int(torch.argmax(logits)) == int(torch.argmax(exact_logits)),
        }
    result["int8_size_saving"] = result["float"]["file_bytes"] / result["int8"]["file_bytes"]
    return result


def budget_run(
    model: Any, system_prompt: str, dialogues: list[tuple[str, list[str]]], spill: Path, turns: int, max_new_tokens: int
) -> dict[str, Any]:
    """Several sessions interleaved under a budget that holds about two of them."""
    budget = kv_bytes_per_token(model.model.config, model.model.dtype) * 2 * 1400
    engine = ChatEngine(
        model,
        system_prompt=system_prompt,
        token_tier=TokenTierConfig(memory_budget_bytes=budget, spill_dir=spill),
        store=f"sqlite:///{spill.parent}/budget.db",
    )
    peak = 0
    tiers: dict[str, int] = {}
    for turn in range(turns):
        for dialogue_id, said in dialogues:
            reply = engine.chat(dialogue_id, said[turn], max_new_tokens=max_new_tokens)
            peak = max(peak, engine.kv_stats().resident_bytes)
            tiers[reply.stats.tier] = tiers.get(reply.stats.tier, 0) + 1
    stats = engine.kv_stats()
    return {
        "budget_bytes": budget,
        "peak_resident_bytes": peak,
        "never_above_budget": peak <= budget,
        "turns_by_tier": tiers,
        "evictions": stats.evictions,
        "spills": stats.spills,
        "restores": stats.restores,
    }


@model_threads()  # timed in this thread: on the threads the engine's worker has
def decode_speeds(model: Any, prompt: list[int], tokens: int = 33, runs: int = 2, warm_up: bool = True) -> dict[str, float]:
    """Decode tokens/s on one prompt: chatcache's loop against plain `model.generate`, interleaved."""
    input_ids = torch.tensor([prompt])
    params = GenerationConfig(max_new_tokens=tokens)

    def ours() -> float:
        cache, stamps = new_cache(model.config), []
        for _ in generate_tokens(model, cache, prompt, params, set()):
            stamps.append(time.perf_counter())
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    def raw() -> float:
        first = timed(lambda: model.generate(input_ids, max_new_tokens=1, do_sample=False))[0]
        total = timed(lambda: model.generate(input_ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False))[0]
        return (tokens - 1) / max(total - first, 1e-9)

    if warm_up:
        ours(), raw()
    speeds = [(ours(), raw()) for _ in range(runs)]
    return {"chatcache_loop": median([o for o, _ in speeds]), "raw_model_generate": median([r for _, r in speeds])}


def summarize(rows: list[dict[str, Any]], long_history: int = LONG_HISTORY) -> dict[str, Any]:
    long = [r for r in rows if r["prompt_tokens"] >= long_history and r["tier"] == "session"]
    firsts = [r for r in rows[1:] if r["turn"] == 1]
    return {
        "turns": len(rows),
        "long_history_tokens": long_history,
        "long_history_turns": len(long),
        "naive_over_chatcache_median": median([r["ttft_naive_s"] / r["ttft_chatcache_s"] for r in long]),
        "chatcache_over_limit_median": median([r["ttft_chatcache_s"] / r["ttft_limit_s"] for r in long]),
        "ttft_chatcache_median_s": median([r["ttft_chatcache_s"] for r in long]),
        "ttft_naive_median_s": median([r["ttft_naive_s"] for r in long]),
        "ttft_limit_median_s": median([r["ttft_limit_s"] for r in long]),
        "new_session_first_turn_naive_over_chatcache": median(
            [r["ttft_naive_s"] / r["ttft_chatcache_s"] for r in firsts]
        ),
        "reused_share_long_turns": median([r["reused_tokens"] / r["prompt_tokens"] for r in long]),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 5))
    xs = list(range(1, len(rows) + 1))
    for key, label in (("ttft_naive_s", "naive (whole history)"), ("ttft_chatcache_s", "chatcache"), ("ttft_limit_s", "limit (new tokens only)")):
        axis.plot(xs, [r[key] * 1000 for r in rows], marker="o", markersize=3, label=label)
    starts = [i + 1 for i, r in enumerate(rows) if r["turn"] == 1]
    for start in starts:
        axis.axvline(start, color="grey", linewidth=0.5, linestyle=":")
    axis.set_yscale("log")
    axis.set_xlabel("turn (dotted line: a new conversation)")
    axis.set_ylabel("time to first token (ms, log)")
    axis.set_title("TTFT per turn, SmolLM2-135M on CPU, ~1,000-token system prompt")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--dialogues", type=int, default=None, help="SGD dialogues to converse (default 3, quick 1)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="reply length (default 48, quick 8)")
    args = parser.parse_args()
    args.dialogues = args.dialogues or (1 if args.quick else 3)
    args.max_new_tokens = args.max_new_tokens or (8 if args.quick else 48)
    run = BenchRun("token_tier", args, minutes=(12, 1.5))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)

    chat_model = load_chat_model("bundled", device="cpu")
    system_prompt = schema_system_prompt(args.data, chat_model.tokenizer, target_tokens=1000)
    dialogues = sgd_user_turns(args.data, args.dialogues, min_turns=12)
    with tempfile.TemporaryDirectory() as scratch:
        # A scratch session database: conversations must start empty, whatever ran before.
        engine = ChatEngine(
            chat_model,
            system_prompt=system_prompt,
            token_tier=TokenTierConfig(spill_dir=Path(scratch) / "kv"),
            store=f"sqlite:///{scratch}/sessions.db",
        )
        setup = {
            "model": "bundled (SmolLM2-135M-Instruct, float32, CPU)",
            "device": str(chat_model.device),
            "torch_threads": torch.get_num_threads(),
            "system_prompt_tokens": len(engine.system_ids),
            "kv_bytes_per_token": engine.token_tier.bytes_per_token,
        }
        run.section("setup", setup)
        rows = conversations(engine, dialogues, args.max_new_tokens, 4 if args.quick else None, run)
        # A quick run's six turns do not reach LONG_HISTORY tokens: its figures are over 1,000.
        run.section("summary", summarize(rows, 1000 if args.quick else LONG_HISTORY))
        restore_tokens, repeats = (1000, 1) if args.quick else (2000, 3)
        restore = restore_vs_recompute(engine, restore_tokens, Path(scratch) / "restore", repeats)
        run.section(f"restore_{restore_tokens}_tokens", restore)
        budget_dialogues = sgd_user_turns(args.data, 3 if args.quick else 4, 6)
        turns, tokens = (2, 8) if args.quick else (6, 16)
        budget = budget_run(chat_model, system_prompt, budget_dialogues, Path(scratch) / "budget", turns, tokens)
        run.section("memory_budget", budget)
    longest = max(rows, key=lambda r: r["prompt_tokens"])
    prompt = engine.token_tier._sessions[longest["dialogue"]].ids[: longest["prompt_tokens"]]
    # A quick run's model is warm from its turns already.
    speeds = decode_speeds(chat_model.model, prompt, *((9, 1, False) if args.quick else (33, 2, True)))
    run.section(
        "decode_tokens_per_s",
        {
            "prompt_tokens": len(prompt),
            **speeds,
            "chatcache_turns_median": median([r["decode_tokens_per_s"] for r in rows if r["generated_tokens"] >= 8]),
        },
    )
    plot(rows, args.out / "token_tier_ttft.png")
    run.section("plot", str(args.out / "token_tier_ttft.png"))
    run.finish()


if __name__ == "__main__":
    main()
