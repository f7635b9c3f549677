"""A reply is the same under load as alone: greedy replies decoded 8 at a time against the uncached path.

SGD dev conversations behind the ~1,000-token system prompt of `bench.concurrency`, `--at-once`
of them at a time on one engine (the scheduler batches their decodes, each turn reuses its
session's KV). Every turn's prompt is then answered once more alone on a fresh cache, nothing
reused (`chatcache.evals.batching`). Reported: the fraction of turns whose replies are equal, and
for each turn that differs the reference's top-2 logit gap at the first differing token and
whether the batched token was the runner-up. Target: >= 99% equal, every difference a near-tie
(gap < 1e-4).

    python -m bench.batch_agreement [--data ../shared/data] [--quick] [--conversations 32] [--turns 8] [--precision exact]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace

import torch

from chatcache import ChatEngine, TokenTierConfig, load_chat_model
from chatcache.evals.batching import NEAR_TIE, AgreementReport, compare_with_uncached, run_together

from .common import BenchRun, bench_arguments, schema_system_prompt, sgd_user_turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--conversations", type=int, default=None, help="SGD dev conversations (default 32, quick 8)")
    parser.add_argument("--turns", type=int, default=None, help="user turns per conversation (default 8, quick 2)")
    parser.add_argument("--at-once", type=int, default=8, help="conversations decoded together")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--precision", choices=("exact", "int8"), default="exact", help="the model's (default exact)")
    args = parser.parse_args()
    args.conversations = args.conversations or (8 if args.quick else 32)
    args.turns = args.turns or (2 if args.quick else 8)
    run = BenchRun("batch_agreement", args, minutes=(40, 4))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    chat_model = load_chat_model("bundled", device="cpu", precision=args.precision)
    system_prompt = schema_system_prompt(args.data, chat_model.tokenizer, target_tokens=1000)
    dialogues = [turns[: args.turns] for _, turns in sgd_user_turns(args.data, args.conversations, min_turns=args.turns)]
    run.section("setup", {
        "model": "bundled (SmolLM2-135M-Instruct, float32 weights, CPU)",
        "precision": chat_model.precision,
        "torch_threads": torch.get_num_threads(),
    })  # fmt: skip
    turns = []
    with tempfile.TemporaryDirectory() as scratch:
        engine = ChatEngine(chat_model, system_prompt=system_prompt, token_tier=TokenTierConfig(spill_dir=None), store=f"sqlite:///{scratch}/s.db")
        for first in range(0, len(dialogues), args.at_once):
            group = dialogues[first : first + args.at_once]
            sessions = run_together(engine, group, args.max_new_tokens, prefix=f"group{first}")
            for agreement in compare_with_uncached(engine, sessions, args.max_new_tokens).turns:
                turns.append(replace(agreement, conversation=agreement.conversation + first))
            run.section("agreement", AgreementReport(turns).as_dict())
        engine.close()
    report = AgreementReport(turns)
    run.finish(
        equal_fraction=round(report.equal_fraction, 4),
        unexplained=len(report.unexplained),
        targets={"equal_fraction": ">= 0.99", "differences": f"every one a near-tie (top-2 gap < {NEAR_TIE:g})"},
    )


if __name__ == "__main__":
    main()
