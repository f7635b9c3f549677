"""Measure drift detection on SGD-style dialogues: `chatcache eval drift --data FILE.jsonl`.

A labelled switch is a user turn whose frames share no service with the previous user turn
(the first user turn never is). A detection at a switch or up to `TOLERANCE` user turns after
it is a true positive, once per switch; every other detection is a false positive. Delay is
counted in user turns from the switch to its detection.

Domain prototypes are built model-free from the schema, not from labelled turns: each
service's description, intent and slot descriptions are embedded, and the services of one domain
("Hotels_1", "Hotels_4" -> "Hotels") are averaged. A held-out split has other services of the
same kinds, and its own schema, so nothing here is fitted to dialogue ids. The labels are used
only for scoring (and, with `--fit`, for fitting), never as a `domain_hint`.

One run scores the learned detector (the shipped model, or `--model FILE`), the hand-built rule
it reads as one of its features, and the seed rule, on all the dialogues and on the learned
model's training and held-out dialogues (`HELD_OUT_DOMAINS`). `--fit OUT` first fits a model
(chatcache/evals/drift_fit.py) and writes it to OUT with what this run measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..steering.drift_model import SHIPPED_MODEL
from ..steering.drift import DriftConfig, DriftDetector, SeedRule, is_low_information, returns_to_dropped

TOLERANCE = 2
HELD_OUT_DOMAINS = frozenset({"Banks", "Homes", "Movies", "RideSharing"})
"""The learned model never sees a dialogue that touches one of these domains: the dialogues it
will meet come from other services, and these report how it does on them."""
Embed = Callable[[list[str]], np.ndarray]


def load_dialogues(path: str | Path, part: str = "all") -> list[dict[str, Any]]:
    """Read a JSON Lines dialogue file; `part` "even"/"odd" keeps every other dialogue."""
    with open(path, encoding="utf-8") as f:
        dialogues = [json.loads(line) for line in f if line.strip()]
    if part == "all":
        return dialogues
    if part not in ("even", "odd"):
        raise ValueError(f"part must be all, even or odd, got {part!r}")
    return dialogues[part == "odd" :: 2]


def domains(dialogue: dict[str, Any]) -> set[str]:
    """The domains of the dialogue's services: the names without the number ("Hotels_4" -> "Hotels")."""
    return {frame["service"].split("_")[0] for turn in dialogue["turns"] for frame in turn["frames"]}


def label_switches(services: Sequence[set[str]]) -> list[int]:
    """Indices of user turns whose services share none with the previous user turn's."""
    return [i for i in range(1, len(services)) if not services[i] & services[i - 1]]


def match_detections(switches: Sequence[int], detections: Sequence[int]) -> list[int]:
    """Delays of the switches caught within `TOLERANCE` turns; each switch counts once."""
    return [detection - switch for switch, detection in matched_pairs(switches, detections)]


def matched_pairs(switches: Sequence[int], detections: Sequence[int]) -> list[tuple[int, int]]:
    """(switch, detection) for each switch caught: by the first detection within `TOLERANCE`
    turns that no earlier switch took."""
    pairs = []
    used: set[int] = set()
    for s in switches:
        hit = next((d for d in detections if s <= d <= s + TOLERANCE and d not in used), None)
        if hit is not None:
            used.add(hit)
            pairs.append((s, hit))
    return pairs


def schema_prototypes(schema_path: str | Path, embed: Embed) -> dict[str, np.ndarray]:
    """Domain name -> unit vector, from the schema's service and intent descriptions."""
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    texts: dict[str, list[str]] = {}
    for service in schema:
        domain = service["service_name"].split("_")[0]
        texts.setdefault(domain, []).append(service["description"])
        texts[domain].extend(intent["description"] for intent in service["intents"])
        texts[domain].extend(slot["description"] for slot in service.get("slots", []))
    prototypes = {}
    for domain, lines in texts.items():
        mean = _unit(embed(lines)).mean(axis=0)
        prototypes[domain] = mean / np.linalg.norm(mean)
    return prototypes


def embed_dialogues(dialogues: Sequence[dict[str, Any]], embed: Embed) -> list[list[np.ndarray]]:
    """Per dialogue, one unit vector per turn; each distinct text is embedded once."""
    texts = list(dict.fromkeys(t["utterance"] for d in dialogues for t in d["turns"]))
    found = dict(zip(texts, _unit(embed(texts)))) if texts else {}
    return [[found[t["utterance"]] for t in d["turns"]] for d in dialogues]


def evaluate_drift(
    data_path: str | Path,
    schema_path: str | Path | None = None,
    embed: Embed | None = None,
    config: DriftConfig | None = None,
    part: str = "all",
) -> dict[str, Any]:
    """Score the detector (learned by default), the hand-built rule and the seed rule on labelled dialogues.

    Args:
        data_path: dialogues as JSON Lines (the SGD slim format).
        schema_path: the services' schema, for domain prototypes; without it the detector
            has no domain evidence from prototypes.
        embed: texts -> embeddings; defaults to the bundled MiniLM on CPU.
        config: the detector's model and thresholds.
        part: "all", or "even"/"odd" dialogues to keep tuning and reporting apart.

    Returns:
        See `score_dialogues`.
    """
    embed = embed or _bundled_embed
    dialogues = load_dialogues(data_path, part)
    prototypes = schema_prototypes(schema_path, embed) if schema_path else None
    return score_dialogues(dialogues, embed_dialogues(dialogues, embed), prototypes, config)


def score_dialogues(
    dialogues: Sequence[dict[str, Any]],
    vectors: Sequence[Sequence[np.ndarray]],
    prototypes: dict[str, np.ndarray] | None,
    config: DriftConfig | None = None,
) -> dict[str, Any]:
    """Score the detectors on dialogues whose turns are embedded (`vectors[n]`, one per turn).

    Returns:
        precision, recall, f1, mean_delay, switches, detections of `config`'s detector (the
        learned model unless `config.model` is None); the same under "rules" (the hand-built
        rule, `model=None`) and "seed_rule"; "splits": both detectors on the learned model's
        training dialogues and on its held-out ones (those touching `HELD_OUT_DOMAINS`);
        "resets_undone": of the true and of the false detections of `config`'s detector, how
        many the next informative user turn would undo as the engine does (`returns_to_dropped`:
        it goes back to the dropped topic). The figures count every detection, undone or not.
    """
    config = config or DriftConfig()
    detector = DriftDetector(config, prototypes)
    rules = DriftDetector(replace(config, model=None), prototypes)
    margin, min_words = detector.config.return_margin, detector.config.open_task.min_content_words
    seed = SeedRule(config)
    undone = {"true": 0, "false": 0, "true_detections": 0, "false_detections": 0}
    tallies: dict[str, list[tuple[int, int, list[int]]]] = {"detector": [], "rules": [], "seed_rule": []}
    for n, dialogue in enumerate(dialogues):
        sid = str(n)
        services: list[set[str]] = []
        found: dict[str, list[int]] = {name: [] for name in tallies}
        assistant, assistant_text = None, None
        user_vectors: list[np.ndarray] = []
        topic_start, pending, reverted = 0, None, set()  # pending: (the reset's turn, where its dropped topic began)
        topics = {judge: judge.new_topic() for judge in (detector, rules)}
        for turn, vector in zip(dialogue["turns"], vectors[n]):
            if turn["speaker"] != "USER":
                assistant, assistant_text = vector, turn["utterance"]
                continue
            i = len(services)
            services.append({frame["service"] for frame in turn["frames"]})
            if pending is not None and not is_low_information(turn["utterance"], min_words):
                reset, dropped_from = pending
                if returns_to_dropped(vector, np.stack(user_vectors[dropped_from:reset]), np.stack(user_vectors[reset:i]), margin):
                    reverted.add(reset)
                pending = None
            user_vectors.append(vector)
            if detector.observe(topics[detector], vector, turn["utterance"], assistant, assistant_text).drift:
                found["detector"].append(i)
                pending, topic_start = (i, topic_start), i
            if rules.observe(topics[rules], vector, turn["utterance"], assistant, assistant_text).drift:
                found["rules"].append(i)
            if seed.observe(sid, vector).drift:
                found["seed_rule"].append(i)
        switches = label_switches(services)
        true_hits = {detection for _, detection in matched_pairs(switches, found["detector"])}
        for detection in found["detector"]:
            kind = "true" if detection in true_hits else "false"
            undone[f"{kind}_detections"] += 1
            undone[kind] += detection in reverted
        for name, hits in found.items():
            tallies[name].append((len(switches), len(hits), match_detections(switches, hits)))
        seed.reset(sid)
    held_out = [bool(domains(d) & HELD_OUT_DOMAINS) for d in dialogues]
    result = _metrics(tallies["detector"])
    result["rules"] = _metrics(tallies["rules"])
    result["seed_rule"] = _metrics(tallies["seed_rule"])
    result["splits"] = {
        split: {name: _metrics(tallies[name], [h == (split == "held_out") for h in held_out]) for name in ("detector", "rules")}
        for split in ("training", "held_out")
    }
    result["resets_undone"] = undone
    return result


def _metrics(tallies: list[tuple[int, int, list[int]]], keep: list[bool] | None = None) -> dict[str, Any]:
    """Precision, recall, F1 and delay over the dialogues' (switches, detections, delays), those `keep` marks."""
    kept = [t for n, t in enumerate(tallies) if keep is None or keep[n]]
    switches, detections = sum(t[0] for t in kept), sum(t[1] for t in kept)
    delays = [d for t in kept for d in t[2]]
    precision = len(delays) / detections if detections else 0.0
    recall = len(delays) / switches if switches else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "mean_delay": round(float(np.mean(delays)), 4) if delays else None,
        "switches": switches,
        "detections": detections,
    }


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    unit: np.ndarray = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return unit


def _bundled_embed(texts: list[str]) -> np.ndarray:
    from ..model.loading import load_embedder

    model = load_embedder("bundled", device="cpu")
    return np.asarray(model.encode(texts, batch_size=128, normalize_embeddings=True), dtype=np.float32)


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval drift`: print the metrics as one JSON object (or a short table); `--fit`
    first fits a learned model on the data and writes it, with what it measured, to a file."""
    parser = argparse.ArgumentParser(prog="chatcache eval drift", description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dialogues, JSON Lines")
    parser.add_argument("--schema", help="services schema JSON, for domain prototypes")
    parser.add_argument("--part", default="all", choices=["all", "even", "odd"])
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL, help="the learned model's file (default: the shipped one)")
    parser.add_argument("--fit", type=Path, metavar="OUT", help="fit a model on --data (held-out domains left out) into OUT, then score it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.fit and (args.schema is None or args.part != "all"):
        parser.error("--fit needs --schema and all the dialogues (the split is by domain)")
    started = time.perf_counter()
    dialogues = load_dialogues(args.data, args.part)
    _progress(f"embedding the turns of {len(dialogues)} dialogues with the bundled MiniLM (most of the run)", started)
    prototypes = schema_prototypes(args.schema, _bundled_embed) if args.schema else None
    vectors = embed_dialogues(dialogues, _bundled_embed)
    _progress(f"embedded the {sum(len(d['turns']) for d in dialogues)} turns of {len(dialogues)} dialogues", started)
    config = DriftConfig(model=args.model)
    if args.fit:
        from .drift_fit import fit_drift_model, provenance  # scikit-learn's fitting is loaded only to fit

        model = fit_drift_model(dialogues, vectors, prototypes, provenance=provenance(args.data, args.schema))
        model.save(args.fit)
        config = DriftConfig(model=args.fit)
    result = score_dialogues(dialogues, vectors, prototypes, config)
    result["run_s"] = round(time.perf_counter() - started, 1)
    _progress("scored", started)
    if args.fit:
        model.provenance["measured"] = result
        model.save(args.fit)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [("detector", result), ("rules", result["rules"]), ("seed_rule", result["seed_rule"])]
    for split, scores in result["splits"].items():
        rows += [(f"{name}, {split}", row) for name, row in scores.items()]
    for name, row in rows:
        print(f"{name:20} P={row['precision']:.3f} R={row['recall']:.3f} F1={row['f1']:.3f} "
              f"delay={row['mean_delay']} switches={row['switches']} detections={row['detections']}")
    return 0


def _progress(message: str, started: float) -> None:
    print(f"[{time.perf_counter() - started:6.1f} s] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
