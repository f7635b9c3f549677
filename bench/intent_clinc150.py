"""Measure the intent classifier with the real MiniLM embedder on CLINC150.

Builds one bot from CLINC150's 150 in-scope intents (N train utterances each as examples),
then reports in-scope accuracy on a sample of the validation split and out-of-scope recall
on `oos_val` + `oos_train`. The data lives outside the repo; point at it with --data.

    python -m bench.intent_clinc150 [--data ../shared/data/clinc150]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.common import DEFAULT_DATA
from chatcache.models import load_embedder
from dialog import OUT_OF_SCOPE, BotDefinition, IntentClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA / "clinc150")
    parser.add_argument("--examples", type=int, default=10, help="train utterances per intent")
    parser.add_argument("--val", type=int, default=1500, help="in-scope validation sample size")
    parser.add_argument("--domain", default=None, help="restrict to one CLINC domain, e.g. banking")
    args = parser.parse_args()

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
    oos = [t for t, _ in data["oos_val"] + data["oos_train"]]

    model = load_embedder("bundled", device="cpu")
    cache: dict[str, np.ndarray] = {}

    def embed(texts: list[str]) -> np.ndarray:
        missing = [t for t in texts if t not in cache]
        if missing:
            for t, v in zip(missing, model.encode(missing, normalize_embeddings=True, batch_size=256)):
                cache[t] = v
        return np.stack([cache[t] for t in texts])

    embed([t for t, _ in val] + oos)
    print(f"{len(bot.intents)} intents x {args.examples} examples; {len(val)} in-scope, {len(oos)} OOS")
    print("temp  reject  thr   in-scope acc  OOS recall  in-scope conf>0.95")
    for temperature in (0.03,):
        for reject in (0.45, 0.5, 0.55):
            clf = IntentClassifier(bot, embed, temperature=temperature, reject_score=reject)
            results = [clf.classify(t) for t, _ in val]
            acc = np.mean([r.intent == y for r, (_, y) in zip(results, val)])
            high = np.mean([r.intent == y and r.confidence > 0.95 for r, (_, y) in zip(results, val)])
            recall = np.mean([clf.classify(t).intent == OUT_OF_SCOPE for t in oos])
            print(f"{temperature:<5} {reject:<7} {clf.threshold:<5} {acc:12.3f} {recall:11.3f} {high:12.3f}")


if __name__ == "__main__":
    main()
