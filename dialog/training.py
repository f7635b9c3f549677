"""Intent examples and curated answers that a bot file names instead of spelling them out.

A bank bot learns its intents from BANKING77's `train.csv` (a header `text,category`, one
labelled query per row), not from examples written by hand; its knowledge base is a YAML
file of curated answers, one per question intent. Both sit beside the bot or anywhere a path
with `${VARIABLE:-default}` reaches (the data directory differs between machines).
"""

from __future__ import annotations

import csv
import os
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
