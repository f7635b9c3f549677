"""A remote model's prompt cache under chatcache's prompt layout: what share of each request's
prompt tokens a real llama.cpp server serves from its cache, turn by turn.

An engine on a remote model (`ChatEngine(model="http://.../v1")`) sends each turn's messages
whole; the server's prefix cache plays the token tier, and hits only as far as a request starts
with what the previous one sent. SGD conversations (their user turns) run on a plain chatbot
behind a system prompt built from the SGD schema, on llama-cpp-python's server with the bundled
GGUF (`make peers` builds it), in two phases side by side:

- one conversation at a time: what a server with room for every conversation's KV (vLLM's
  prefix caching, llama.cpp with a slot per conversation) reuses;
- interleaved, one turn of each conversation in turn: llama-cpp-python keeps one sequence, so
  each request shares only the system prompt with the previous one (another conversation's).

The server states its reuse only in its log ("prefix-match hit"), one request at a time, so
turns are sent one by one. Prints JSON, writes `<out>/remote.json` as it goes and
`<out>/remote.png`.

    python -m bench.remote [--quick] [--data ../shared/data] [--conversations 8] [--turns 6]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.common import BenchRun, bench_arguments, median, schema_system_prompt, sgd_user_turns
from bench.llama_server import LlamaServer


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.remote", description=__doc__.split("\n\n")[0])
    bench_arguments(parser)
    parser.add_argument("--conversations", type=int, default=None, help="SGD dialogues (default 8, quick 3)")
    parser.add_argument("--turns", type=int, default=None, help="user turns of each (default 6, quick 4)")
    parser.add_argument("--system-tokens", type=int, default=400, help="length of the system prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    args.conversations = args.conversations or (3 if args.quick else 8)
    args.turns = args.turns or (4 if args.quick else 6)
    return args


def run_phase(engine: Any, server: LlamaServer, conversations: list[list[str]], interleaved: bool, max_new_tokens: int) -> dict[str, Any]:
    """Each turn's prompt tokens, what the server's cache reused of them, and its TTFT."""
    order = (
        [(c, t) for t in range(len(conversations[0])) for c in range(len(conversations))]
        if interleaved
        else [(c, t) for c in range(len(conversations)) for t in range(len(conversations[0]))]
    )
    phase = "interleaved" if interleaved else "sequential"
    turns = []
    for conversation, index in order:
        mark = server.mark()
        reply = engine.chat(f"{phase}-{conversation}", conversations[conversation][index], max_new_tokens=max_new_tokens)
        (served,) = server.requests_since(mark)
        prompt = served.prompt_tokens or reply.stats.prompt_tokens + 1  # the server adds a BOS token
        turns.append({"turn": index + 1, "prompt_tokens": prompt, "reused_tokens": served.reused_tokens, "ttft_s": reply.stats.ttft_s})
    return summarize(turns)


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    def share(rows: list[dict[str, Any]]) -> float:
        return round(sum(r["reused_tokens"] for r in rows) / sum(r["prompt_tokens"] for r in rows), 3)

    by_turn = {}
    for index in sorted({r["turn"] for r in turns}):
        rows = [r for r in turns if r["turn"] == index]
        by_turn[index] = {"cached_share": share(rows), "ttft_p50_s": round(median([r["ttft_s"] for r in rows]), 3)}
    later = [r for r in turns if r["turn"] > 1]
    return {
        "turns": len(turns),
        "cached_share": share(turns),
        "cached_share_after_first_turn": share(later),
        "ttft_p50_s": round(median([r["ttft_s"] for r in turns]), 3),
        "ttft_p50_after_first_turn_s": round(median([r["ttft_s"] for r in later]), 3),
        "by_turn": by_turn,
        "each_turn": turns,
    }


def plot(phases: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, result in phases.items():
        turns = sorted(result["by_turn"])
        left.plot(turns, [result["by_turn"][t]["cached_share"] for t in turns], marker="o", label=name)
        right.plot(turns, [result["by_turn"][t]["ttft_p50_s"] * 1000 for t in turns], marker="o", label=name)
    left.set(xlabel="user turn", ylabel="prompt tokens from the server's cache", ylim=(0, 1.05))
    right.set(xlabel="user turn", ylabel="TTFT p50 (ms)")
    for axis in (left, right):
        axis.set_xticks(sorted(next(iter(phases.values()))["by_turn"]))
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    args = parse_options()
    run = BenchRun("remote", args, minutes=(6, 2))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from chatcache import ChatEngine, connect_remote_model

    conversations = [turns[: args.turns] for _, turns in sgd_user_turns(args.data, args.conversations, min_turns=args.turns)]
    with (
        tempfile.TemporaryDirectory(prefix="bench-remote-") as scratch,
        LlamaServer.start(Path(args.out) / "remote-llama-server.log") as server,
    ):
        model = connect_remote_model(server.url, tokenizer="bundled")
        system_prompt = schema_system_prompt(args.data, model.tokenizer, target_tokens=args.system_tokens)
        run.section("setup", {
            "server": "llama-cpp-python's server, the bundled GGUF (SmolLM2-135M-Instruct Q4_1), one sequence, 2 threads",
            "engine": "a plain chatbot: no answer cache, no drift (the prompt layout alone)",
            "system_prompt_tokens": len(model.tokenizer.encode(system_prompt, add_special_tokens=False)),
            "conversations": len(conversations),
            "turns": sum(map(len, conversations)),
        })  # fmt: skip
        engine = ChatEngine(model, system_prompt=system_prompt, store=f"sqlite:///{scratch}/sessions.db")
        phases: dict[str, dict[str, Any]] = {}
        for name, interleaved in (("one conversation at a time", False), ("interleaved", True)):
            phases[name] = run_phase(engine, server, conversations, interleaved, args.max_new_tokens)
            run.section("phases", phases)
        engine.close()
    plot_path = Path(args.out) / "remote.png"
    plot(phases, plot_path, f"chatcache on a llama.cpp server: {len(conversations)} SGD conversations, {args.turns} turns each")
    run.finish(plot=str(plot_path))


if __name__ == "__main__":
    main()
