"""What the benchmarks share: their run (options, duration, partial results), data paths, the
SGD conversations and a long static system prompt."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def bench_arguments(parser: argparse.ArgumentParser, data: Path = DEFAULT_DATA) -> None:
    """The options every benchmark takes: where the data is, where results go, quick mode."""
    parser.add_argument("--data", type=Path, default=data, help=f"data directory (default: {data})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where <name>.json is written as sections finish")
    parser.add_argument("--quick", action="store_true", help="smaller samples: a first look, not the figures of record")


class BenchRun:
    """One benchmark run: says up front how long it takes and writes `<out>/<name>.json` after
    every section, so a run that is stopped halfway leaves what it measured.

    Args:
        name: the benchmark, also the file name.
        args: parsed `bench_arguments` (and the benchmark's own options, recorded with the results).
        minutes: expected minutes of a (full, quick) run on the 2-core machine of record.
    """

    def __init__(self, name: str, args: argparse.Namespace, minutes: tuple[float, float]) -> None:
        self.started = time.perf_counter()
        self.path = Path(args.out) / f"{name}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        options = {k: str(v) if isinstance(v, Path) else v for k, v in sorted(vars(args).items())}
        self.report: dict[str, Any] = {"benchmark": name, "complete": False, "options": options}
        expected = minutes[1] if args.quick else minutes[0]
        print(
            f"bench.{name}: {'quick' if args.quick else 'full'} run, about {expected:g} min on 2 CPU cores "
            f"(full {minutes[0]:g} min, --quick {minutes[1]:g} min); results so far in {self.path}",
            file=sys.stderr,
            flush=True,
        )
        self._save()

    def section(self, key: str, value: Any) -> None:
        """Record one finished section (again, as it grows) and write the file."""
        self.report[key] = value
        self._save()
        print(f"bench.{self.report['benchmark']}: {key} done at {self._elapsed():.0f} s", file=sys.stderr, flush=True)

    def finish(self, complete: bool = True, **values: Any) -> dict[str, Any]:
        """Add `values` at the end, in their order, then `complete`; write the results and print
        them on stdout as JSON on one line, so that the last line of the output is the result and
        its last keys are the ones a reader checks.

        Args:
            complete: False for a run that ended but whose benchmark does not yet measure every
                figure it is meant to (the missing ones are null and the results say why).
        """
        del self.report["complete"]  # it moves to the very end
        self.report["elapsed_s"] = round(self._elapsed(), 1)
        self.report.update(values)
        self.report["complete"] = complete
        self._save()
        print(json.dumps(self.report), flush=True)
        return self.report

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _save(self) -> None:
        # Write then rename: a reader (or a run killed mid-write) never sees half a file.
        partial = self.path.with_name(self.path.name + ".tmp")
        partial.write_text(json.dumps(self.report, indent=2) + "\n")
        os.replace(partial, self.path)


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
