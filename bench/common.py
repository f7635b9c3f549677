"""What the benchmarks share: data paths, the SGD conversations and a long static system prompt."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _sgd_dev_dialogues(data_dir: Path) -> Iterator[dict[str, Any]]:
    with open(data_dir / "sgd" / "dev_dialogues.jsonl") as lines:
        for line in lines:
            yield json.loads(line)


def sgd_user_turns(data_dir: Path, dialogues: int, min_turns: int) -> list[tuple[str, list[str]]]:
    """The user turns of the first `dialogues` SGD dev dialogues with at least `min_turns` of them."""
    picked = (
        (record["dialogue_id"], [t["utterance"] for t in record["turns"] if t["speaker"] == "USER"])
        for record in _sgd_dev_dialogues(data_dir)
    )
    return list(islice(((i, turns) for i, turns in picked if len(turns) >= min_turns), dialogues))


def sgd_exchanges(data_dir: Path, dialogues: int, min_turns: int) -> list[list[tuple[str, str]]]:
    """(user turn, the system's answer) pairs of the first `dialogues` SGD dev dialogues with
    at least `min_turns` of them."""
    exchanges = (
        [
            (user["utterance"], system["utterance"])
            for user, system in zip(record["turns"], record["turns"][1:])
            if user["speaker"] == "USER" and system["speaker"] == "SYSTEM"
        ]
        for record in _sgd_dev_dialogues(data_dir)
    )
    return list(islice((pairs for pairs in exchanges if len(pairs) >= min_turns), dialogues))


def schema_system_prompt(data_dir: Path, tokenizer: Any, target_tokens: int) -> str:
    """A customer-service system prompt built from the SGD schema: static policy first, then services."""
    schema = json.loads((data_dir / "sgd" / "dev_schema.json").read_text())
    parts = [
        "You are the assistant of a travel and lifestyle concierge service. Be brief, polite and precise. "
        "Confirm details before you book anything, never invent prices, and ask for missing information.",
        "Services you can use:",
    ]
    for service in schema:
        parts.append(f"- {service['service_name']}: {service['description']}.")
        for intent in service["intents"]:
            slots = ", ".join(intent["required_slots"]) or "none"
            parts.append(f"  * {intent['name']}: {intent['description']} (needs: {slots}).")
    text = ""
    for part in parts:
        candidate = f"{text}\n{part}" if text else part
        if len(tokenizer.encode(candidate, add_special_tokens=False)) > target_tokens:
            break
        text = candidate
    return text


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
