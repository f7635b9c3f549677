"""Measure drift detection on SGD-style dialogues: `chatcache eval drift --data FILE.jsonl`.

A labelled switch is a user turn whose frames share no service with the previous user turn
(the first user turn never is). A detection at a switch or up to `TOLERANCE` user turns after
it is a true positive, once per switch; every other detection is a false positive. Delay is
counted in user turns from the switch to its detection.

Domain prototypes are built model-free from the schema, not from labelled turns: each
service's description, intent and slot descriptions are embedded, and the services of one domain
("Hotels_1", "Hotels_4" -> "Hotels") are averaged. A held-out split has other services of the
same kinds, and its own schema, so nothing here is fitted to dialogue ids. The labels are used
only for scoring, never as a `domain_hint`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..steering.drift import DriftConfig, DriftDetector, SeedRule, is_low_information, returns_to_dropped

TOLERANCE = 2
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


def evaluate_drift(
    data_path: str | Path,
    schema_path: str | Path | None = None,
    embed: Embed | None = None,
    config: DriftConfig | None = None,
    part: str = "all",
) -> dict[str, Any]:
    """Score the combined detector and the seed rule on labelled dialogues.

    Args:
        data_path: dialogues as JSON Lines (the SGD slim format).
        schema_path: the services' schema, for domain prototypes; without it the detector
            has no domain evidence and stays silent unless given hints.
        embed: texts -> embeddings; defaults to the bundled MiniLM on CPU.
        config: detector thresholds.
        part: "all", or "even"/"odd" dialogues to keep tuning and reporting apart.

    Returns:
        precision, recall, f1, mean_delay, switches, detections, and the same under "seed_rule";
        "resets_undone": of the true and of the false detections, how many the next informative
        user turn would undo as the engine does (`returns_to_dropped`: it goes back to the
        dropped topic). The detector's own figures count every detection, undone or not.
    """
    embed = embed or _bundled_embed
    dialogues = load_dialogues(data_path, part)
    texts = [t["utterance"] for d in dialogues for t in d["turns"]]
    vectors = iter(_unit(embed(texts)) if texts else [])
    prototypes = schema_prototypes(schema_path, embed) if schema_path else None
    detector = DriftDetector(config, prototypes)
    margin, min_words = detector.config.return_margin, detector.config.open_task.min_content_words
    seed = SeedRule(config)
    undone = {"true": 0, "false": 0, "true_detections": 0, "false_detections": 0}
    switches_seen = 0
    detections = {"combined": 0, "seed_rule": 0}
    delays: dict[str, list[int]] = {"combined": [], "seed_rule": []}
    for n, dialogue in enumerate(dialogues):
        sid = str(n)
        services: list[set[str]] = []
        found: list[int] = []
        seed_found: list[int] = []
        assistant, assistant_text = None, None
        user_vectors: list[np.ndarray] = []
        topic_start, pending, reverted = 0, None, set()  # pending: (the reset's turn, where its dropped topic began)
        for turn in dialogue["turns"]:
            vector = next(vectors)
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
            if detector.observe(sid, vector, turn["utterance"], assistant, assistant_text).drift:
                found.append(i)
                pending, topic_start = (i, topic_start), i
            if seed.observe(sid, vector).drift:
                seed_found.append(i)
        switches = label_switches(services)
        switches_seen += len(switches)
        true_hits = {detection for _, detection in matched_pairs(switches, found)}
        for detection in found:
            kind = "true" if detection in true_hits else "false"
            undone[f"{kind}_detections"] += 1
            undone[kind] += detection in reverted
        for key, hits in (("combined", found), ("seed_rule", seed_found)):
            detections[key] += len(hits)
            delays[key].extend(match_detections(switches, hits))
        detector.reset(sid)
        seed.reset(sid)
    result = _metrics(switches_seen, detections["combined"], delays["combined"])
    result["seed_rule"] = _metrics(switches_seen, detections["seed_rule"], delays["seed_rule"])
    result["resets_undone"] = undone
    return result


def _metrics(switches: int, detections: int, delays: list[int]) -> dict[str, Any]:
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
    """`chatcache eval drift`: print the metrics as one JSON object (or a short table)."""
    parser = argparse.ArgumentParser(prog="chatcache eval drift", description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dialogues, JSON Lines")
    parser.add_argument("--schema", help="services schema JSON, for domain prototypes")
    parser.add_argument("--part", default="all", choices=["all", "even", "odd"])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = evaluate_drift(args.data, args.schema, part=args.part)
    if args.json:
        print(json.dumps(result))
    else:
        for name, row in (("combined", result), ("seed_rule", result["seed_rule"])):
            print(f"{name:10} P={row['precision']:.3f} R={row['recall']:.3f} F1={row['f1']:.3f} "
                  f"delay={row['mean_delay']} switches={row['switches']} detections={row['detections']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
