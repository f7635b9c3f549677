"""Measure the intent classifier with the real MiniLM embedder on CLINC150.

Builds one bot from CLINC150's 150 in-scope intents (N train utterances each as examples),
then reports in-scope accuracy on a sample of the validation split and out-of-scope recall
on `oos_val` + `oos_train`. The data lives outside the repo; point at it with --data.

    python -m bench.intent_clinc150 [--data ../shared/data/clinc150] [--quick]

About 2 minutes on 2 CPU cores (embedding 1,500 validation and 1,350 OOS utterances); --quick
(300 of each) about a minute. Results are written to bench/out/intent_clinc150.json after each
setting.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict

import numpy as np

from bench.common import DEFAULT_DATA, BenchRun, bench_arguments
from chatcache.model.loading import load_embedder
from chatcache.dialog import OUT_OF_SCOPE, BotDefinition, IntentClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser, data=DEFAULT_DATA / "clinc150")
    parser.add_argument("--examples", type=int, default=10, help="train utterances per intent")
    parser.add_argument("--val", type=int, default=None, help="in-scope validation sample size (default 1500, quick 300)")
    parser.add_argument("--domain", default=None, help="restrict to one CLINC domain, e.g. banking")
    args = parser.parse_args()
    args.val = args.val or (300 if args.quick else 1500)
    run = BenchRun("intent_clinc150", args, minutes=(2, 1))

    data = json.loads((args.data / "data_full_train_val.json").read_text())
    domains = json.loads((args.data / "domains.json").read_text())
    keep = set(domains[args.domain]) if args.domain else None
    rng = random.Random(0)
    by_intent: dict[str, list[str]] = defaultdict(list)
    for text, label in data["train"]:
        if keep is None or label in keep:
            by_intent[label].append(text)
    bot = BotDefinition(
        system_prompt="CLINC150 evaluation bot",
        intents=[{"name": k, "examples": rng.sample(v, args.examples)} for k, v in sorted(by_intent.items())],
    )
    val = [(t, y) for t, y in data["val"] if y in by_intent]
    val = rng.sample(val, min(args.val, len(val)))
    oos = [t for t, _ in data["oos_val"] + data["oos_train"]][: 300 if args.quick else None]

    model = load_embedder("bundled", device="cpu")
    cache: dict[str, np.ndarray] = {}

    def embed(texts: list[str]) -> np.ndarray:
        missing = [t for t in texts if t not in cache]
        if missing:
            for t, v in zip(missing, model.encode(missing, normalize_embeddings=True, batch_size=256)):
                cache[t] = v
        return np.stack([cache[t] for t in texts])

    embed([t for t, _ in val] + oos)
    run.section("sample", {"intents": len(bot.intents), "examples_per_intent": args.examples, "in_scope": len(val), "oos": len(oos)})
    settings = []
    for temperature in (0.03,):
        for reject in (0.45, 0.5, 0.55):
            clf = IntentClassifier(bot, embed, temperature=temperature, reject_score=reject)
            results = [clf.classify(t) for t, _ in val]
            settings.append(
                {
                    "temperature": temperature,
                    "reject_score": reject,
                    "threshold": clf.threshold,
                    "in_scope_accuracy": float(np.mean([r.intent == y for r, (_, y) in zip(results, val)])),
                    "oos_recall": float(np.mean([clf.classify(t).intent == OUT_OF_SCOPE for t in oos])),
                    "in_scope_correct_and_confident": float(
                        np.mean([r.intent == y and r.confidence > 0.95 for r, (_, y) in zip(results, val)])
                    ),
                }
            )
            run.section("settings", settings)
    run.finish()

if __name__ == "__main__":
    main()
