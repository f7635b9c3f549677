"""Tune the answer cache's entropy gate: are uncertain answers the unstable ones?

For GPTCache pairs (a question and its rewording), the bundled model answers both, greedily,
as a context-free first turn. An answer is *stable* when its rewording's answer says the same
thing (MiniLM cosine of the two answers >= 0.8). For each entropy threshold, the report gives
the share of answers it admits and how many of those are stable: a good gate keeps coverage
while admitting few unstable answers. The chosen default is recorded in bench/README.md.

    python -m bench.entropy_threshold [--data ../shared/data] [--pairs 40] [--quick]

About 5 minutes on 2 CPU cores (80 model answers of up to 64 tokens); --quick (10 pairs) about
1.5 minutes. Answers are written to bench/out/entropy_threshold.json as they come.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np

from chatcache import ChatEngine, TokenTierConfig, load_chat_model
from chatcache.steering.hcac import sentence_embed
from chatcache.model.loading import load_embedder

from .common import BenchRun, bench_arguments

SYSTEM = "You are a helpful assistant. Answer in one or two sentences."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--pairs", type=int, default=None, help="GPTCache pairs answered (default 40, quick 10)")
    args = parser.parse_args()
    args.pairs = args.pairs or (10 if args.quick else 40)
    run = BenchRun("entropy_threshold", args, minutes=(5, 1.5))
    pairs = json.loads((args.data / "gptcache_mock" / "mock_pairs_dev.json").read_text())[: args.pairs]
    embed = sentence_embed(load_embedder("bundled", device="cpu"))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        engine = ChatEngine(
            load_chat_model("bundled", device="cpu"),
            system_prompt=SYSTEM,
            store=f"sqlite:///{scratch}/entropy.db",
            token_tier=TokenTierConfig(spill_dir=None),
        )
        for index, pair in enumerate(pairs):
            first = engine.chat(f"a{index}", pair["origin"], max_new_tokens=64)
            second = engine.chat(f"b{index}", pair["similar"], max_new_tokens=64)
            if first.stats.finish_reason != "eos":
                continue
            vectors = embed([first.text, second.text])
            rows.append({"entropy_bits": first.stats.mean_entropy_bits, "agreement": float(vectors[0] @ vectors[1])})
            run.section("rows", rows)
        engine.close()
    entropies = np.array([r["entropy_bits"] for r in rows])
    stable = np.array([r["agreement"] >= 0.8 for r in rows])
    grid = []
    for threshold in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.2):
        admitted = entropies <= threshold
        grid.append(
            {
                "threshold_bits": threshold,
                "admitted_share": float(admitted.mean()),
                "stable_share_of_admitted": float(stable[admitted].mean()) if admitted.any() else None,
            }
        )
    run.finish(
        answers=len(rows),
        stable_share_overall=float(stable.mean()),
        entropy_bits_quartiles=[float(q) for q in np.percentile(entropies, [25, 50, 75])],
        stable_mean_entropy=float(entropies[stable].mean()) if stable.any() else None,
        unstable_mean_entropy=float(entropies[~stable].mean()) if (~stable).any() else None,
        grid=grid,
    )

if __name__ == "__main__":
    main()
