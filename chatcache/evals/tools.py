"""Tool routing: `chatcache eval tools --data DIALOGUES.jsonl --schema SCHEMA.json --json`.

SGD's services are tool sets: each intent has a name and a description (`FindRestaurants`:
"Find a restaurant of a particular cuisine in a city"), and each dialogue marks the user turn
where an intent is first asked for. With one service's intents bound as tools:

  * a call is due on the turn that first states an intent (`INFORM_INTENT`), and it must be of
    that intent: `recall` counts those routed to a call, `right_tool` those whose closest tool
    is the intent;
  * no call is due on a thank-you or goodbye turn of the same dialogue, nor on another domain's
    first request (a restaurant question with the alarm tools bound): `false_call_rate`.

Dialogues with an even index tune the threshold (the one with the best balanced accuracy,
the mean of recall and 1 - false_call_rate); odd ones check it. Printed for every threshold
tried, so a user can pick another.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..model.tools import Tool
from ..steering.tool_router import tool_text
from .answer_cache import _bundled_embed

THRESHOLDS = [round(0.2 + 0.025 * step, 3) for step in range(13)]  # 0.2 .. 0.5
CLOSING_ACTS = {"THANK_YOU", "GOODBYE"}


@dataclass(frozen=True)
class RoutingCase:
    dialogue: int
    question: str
    tools: tuple[Tool, ...]
    due: str | None  # the intent a call is due for; None where no call is


def service_tools(schema: list[dict[str, Any]]) -> dict[str, tuple[Tool, ...]]:
    """Each service's intents as tools, their slots as string arguments."""
    tools = {}
    for service in schema:
        slot_text = {slot["name"]: slot["description"] for slot in service["slots"]}
        tools[service["service_name"]] = tuple(
            Tool(
                intent["name"],
                intent["description"],
                {
                    "type": "object",
                    "properties": {
                        name: {"type": "string", "description": slot_text.get(name, "")}
                        for name in [*intent["required_slots"], *intent["optional_slots"]]
                    },
                    "required": list(intent["required_slots"]),
                },
            )
            for intent in service["intents"]
        )
    return tools


def routing_cases(dialogues_path: str | Path, schema_path: str | Path, seed: int = 0) -> list[RoutingCase]:
    tools = service_tools(json.loads(Path(schema_path).read_text()))
    dialogues = [json.loads(line) for line in Path(dialogues_path).read_text().splitlines() if line.strip()]
    firsts: list[tuple[int, str, str]] = []  # (dialogue, service, question) of each stated intent
    cases = []
    for index, dialogue in enumerate(dialogues):
        for turn in dialogue["turns"]:
            if turn["speaker"] != "USER":
                continue
            for frame in turn["frames"]:
                acts = {act for act, _ in frame["acts"]}
                service = frame["service"]
                if service not in tools:
                    continue
                if "INFORM_INTENT" in acts:
                    cases.append(RoutingCase(index, turn["utterance"], tools[service], frame["active_intent"]))
                    firsts.append((index, service, turn["utterance"]))
                elif acts and acts <= CLOSING_ACTS:
                    cases.append(RoutingCase(index, turn["utterance"], tools[service], None))
    rng = random.Random(seed)
    for index, service, question in firsts:
        domain = service.split("_")[0]
        others = sorted(name for name in tools if name.split("_")[0] != domain)
        cases.append(RoutingCase(index, question, tools[rng.choice(others)], None))
    return cases


def _scores(cases: Sequence[RoutingCase], embed: Any) -> list[list[float]]:
    texts = sorted({c.question for c in cases} | {tool_text(t) for c in cases for t in c.tools})
    vectors = dict(zip(texts, np.asarray(embed(texts))))
    return [[float(vectors[tool_text(t)] @ vectors[c.question]) for t in c.tools] for c in cases]


def _measure(cases: Sequence[RoutingCase], scores: Sequence[list[float]], threshold: float) -> dict[str, float]:
    due = [(c, s) for c, s in zip(cases, scores) if c.due is not None]
    not_due = [s for c, s in zip(cases, scores) if c.due is None]
    called = [(c, s) for c, s in due if max(s) >= threshold]
    right = sum(1 for c, s in called if c.tools[int(np.argmax(s))].name == c.due)
    recall = len(called) / len(due) if due else 0.0
    false_calls = sum(1 for s in not_due if max(s) >= threshold) / len(not_due) if not_due else 0.0
    return {
        "threshold": threshold,
        "recall": round(recall, 4),
        "right_tool": round(right / len(due), 4) if due else 0.0,
        "false_call_rate": round(false_calls, 4),
        "balanced_accuracy": round((recall + 1 - false_calls) / 2, 4),
        "calls_due": len(due),
        "calls_not_due": len(not_due),
    }


def evaluate_routing(dialogues_path: str | Path, schema_path: str | Path, embed: Any = None) -> dict[str, Any]:
    cases = routing_cases(dialogues_path, schema_path)
    scores = _scores(cases, embed or _bundled_embed)
    halves = {
        name: ([c for c in cases if c.dialogue % 2 == parity], [s for c, s in zip(cases, scores) if c.dialogue % 2 == parity])
        for name, parity in (("tune", 0), ("check", 1))
    }
    tuned = [_measure(*halves["tune"], threshold) for threshold in THRESHOLDS]
    best = max(tuned, key=lambda row: row["balanced_accuracy"])
    return {
        "threshold": best["threshold"],
        "tune": best,
        "check": _measure(*halves["check"], best["threshold"]),
        "by_threshold": tuned,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval tools --data DIALOGUES.jsonl --schema SCHEMA.json [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval tools", description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="SGD dialogues, one JSON object per line")
    parser.add_argument("--schema", required=True, help="the SGD schema of their services")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = evaluate_routing(args.data, args.schema)
    if args.json:
        print(json.dumps(result))
        return 0
    for row in result["by_threshold"]:
        print(" ".join(f"{key}={value}" for key, value in row.items()))
    print(f"chosen threshold {result['threshold']}: check half {result['check']}")
    return 0
