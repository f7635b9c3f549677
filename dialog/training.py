"""Intent examples and curated answers that a bot file names instead of spelling them out.

A bank bot learns its intents from BANKING77's `train.csv` (a header `text,category`, one
labelled query per row), not from examples written by hand; its knowledge base is a YAML
file of curated answers, one per question intent. Both sit beside the bot or anywhere a path
with `${VARIABLE:-default}` reaches (the data directory differs between machines).
"""

from __future__ import annotations

import csv
import os
import random
import re
from collections import defaultdict
from pathlib import Path

_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def expand_path(raw: str, relative_to: Path) -> Path:
    """`raw` with `${NAME}` / `${NAME:-default}` replaced from the environment, relative to a directory.

    Raises:
        ValueError: a `${NAME}` without a default is not set.
    """

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise ValueError(f"{raw!r} needs the environment variable {name}, which is not set")
        return default

    return (relative_to / Path(_VARIABLE.sub(value, raw)).expanduser()).resolve()


def read_labelled(path: Path) -> dict[str, list[str]]:
    """The texts of a `text,category` CSV by label, in file order (duplicates dropped).

    Raises:
        ValueError: the header is not `text,category` or a row is short.
    """
    by_label: dict[str, list[str]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    with path.open(newline="", encoding="utf-8") as file:
        rows = csv.reader(file)
        header = next(rows, None)
        if header != ["text", "category"]:
            raise ValueError(f"{path}: the first row must be the header 'text,category', got {header}")
        for number, row in enumerate(rows, start=2):
            if len(row) != 2 or not row[0].strip() or not row[1].strip():
                raise ValueError(f"{path} row {number}: expected a text and a category, got {row}")
            text, label = row[0].strip(), row[1].strip()
            if (text, label) not in seen:
                seen.add((text, label))
                by_label[label].append(text)
    return dict(by_label)


def stratified_split(by_label: dict[str, list[str]], share: float, seed: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each label's texts split into (kept, held out), both in the texts' order.

    Stratified: every label holds out `share` of its texts (rounded, at least one, and never
    all of them, so that every label keeps one; a label with a single text holds none out).
    Deterministic: which texts are held out depends only on the seed and the label, not on the
    other labels or the Python version (`random.Random` seeded with a string is stable). The
    evaluations hold test rows out this way, and training holds out its calibration examples.

    Raises:
        ValueError: `share` is not strictly between 0 and 1.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"the held-out share must be between 0 and 1, got {share}")
    kept: dict[str, list[str]] = {}
    held: dict[str, list[str]] = {}
    for label in sorted(by_label):
        texts = by_label[label]
        count = min(max(round(share * len(texts)), 1), len(texts) - 1)
        chosen = set(random.Random(f"{seed}/{label}").sample(range(len(texts)), count))
        kept[label] = [text for i, text in enumerate(texts) if i not in chosen]
        held[label] = [text for i, text in enumerate(texts) if i in chosen]
    return kept, held
