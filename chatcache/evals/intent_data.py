"""Labelled queries for `chatcache eval intents`, from the two layouts it reads.

- A CSV with the header `text,category` (BANKING77's `train.csv`), read by `dialog.training`.
- CLINC150's JSON: a dict of lists of `[text, label]` pairs (`train`, `val`, `oos_train`,
  `oos_val`), with `domains.json` beside it mapping each domain to its intents. The label
  "oos" marks a query that fits none of the 150 intents.

The layout is told from the file's content (a JSON file starts with `{`), not its name.
Out-of-scope rows carry the label the classifier gives them, `dialog.OUT_OF_SCOPE` (a CSV may
use it too), so a prediction is right exactly when it equals its row's label. The nearest-example
classifier learns intents only, and "none of these" is its fallback; a trained model also learns
"none of these" from CLINC's `oos_train` (`out_of_scope_training_texts`), never from `oos_val`.

This module only reads and splits; it embeds and classifies nothing.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from chatcache.dialog import OUT_OF_SCOPE
from chatcache.dialog.training import read_labelled

Row = tuple[str, str]
"""One labelled query: (text, label); the label is OUT_OF_SCOPE for a query no intent fits."""

CLINC_OOS = "oos"
"""CLINC150's label for an out-of-scope query."""


class IntentDataError(ValueError):
    """A data file that cannot be used; the message names the file and the field at fault."""


def is_clinc(path: Path) -> bool:
    """Whether a labelled file is CLINC150's JSON rather than a CSV (a JSON object starts with `{`).

    Raises:
        IntentDataError: the file cannot be read as text.
    """
    try:
        with path.open(encoding="utf-8") as file:
            start = file.read(64).lstrip()
    except OSError as exc:
        raise IntentDataError(f"{path}: cannot read it: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise IntentDataError(f"{path}: not UTF-8 text") from exc
    return start.startswith("{")


def training_texts(path: Path) -> dict[str, list[str]]:
    """The in-scope texts of a labelled file by label, in file order.

    A CSV gives all its rows; a CLINC150 JSON its `train` list (never `oos_train`).

    Raises:
        IntentDataError: the file is missing, malformed, or has no rows.
    """
    rows = _clinc_part(path, _read_json(path), "train") if is_clinc(path) else _csv_rows(path)
    by_label: dict[str, list[str]] = defaultdict(list)
    for text, label in rows:
        if label != OUT_OF_SCOPE:
            by_label[label].append(text)
    if not by_label:
        raise IntentDataError(f"{path}: no in-scope rows to learn intents from")
    return dict(by_label)


def out_of_scope_training_texts(path: Path) -> list[str]:
    """The out-of-scope queries a trained model may learn "none of these" from: a CLINC150
    JSON's `oos_train`, a CSV's rows labelled out_of_scope (none in BANKING77's).

    Raises:
        IntentDataError: the file is missing or malformed.
    """
    rows = _clinc_part(path, _read_json(path), "oos_train") if is_clinc(path) else _csv_rows(path)
    return [text for text, label in rows if label == OUT_OF_SCOPE]


def evaluation_rows(path: Path) -> list[Row]:
    """The rows of a labelled file to evaluate on: a CSV's rows, a CLINC150 JSON's `val` and `oos_val`.

    Raises:
        IntentDataError: the file is missing, malformed, or has no rows.
    """
    if not is_clinc(path):
        return _csv_rows(path)
    data = _read_json(path)
    return _clinc_part(path, data, "val") + _clinc_part(path, data, "oos_val")


def out_of_scope_rows(path: Path, in_scope_domains: set[str]) -> list[Row]:
    """Queries of a CLINC150 JSON that are out of scope for a bot covering `in_scope_domains`.

    These are CLINC's own out-of-scope queries (`oos_val`, `oos_train`) and its `val` queries
    of every other domain (a bank bot knows nothing of weather or recipes). Only `val` is
    used, so the rows do not overlap CLINC's training part if someone trains on it.

    Args:
        path: CLINC150's `data_full_train_val.json`, with `domains.json` beside it.
        in_scope_domains: domains whose intents the bot covers, e.g. {"banking", "credit_cards"}.

    Raises:
        IntentDataError: a file is missing or malformed, or a domain is not in `domains.json`.
    """
    if not is_clinc(path):
        raise IntentDataError(f"{path}: expected CLINC150's JSON (a dict of lists of [text, label]), got another format")
    domains_file = path.parent / "domains.json"
    domains = _read_json(domains_file)
    if not all(isinstance(intents, list) for intents in domains.values()):
        raise IntentDataError(f"{domains_file}: expected a dict of domain -> list of intents")
    unknown = sorted(in_scope_domains - set(domains))
    if unknown:
        raise IntentDataError(f"{domains_file}: no domain {', '.join(unknown)} (it has {', '.join(sorted(domains))})")
    covered = {intent for name in in_scope_domains for intent in domains[name]}
    data = _read_json(path)
    other = [text for text, label in _clinc_part(path, data, "val") if label != OUT_OF_SCOPE and label not in covered]
    oos = [text for part in ("oos_val", "oos_train") for text, _ in _clinc_part(path, data, part)]
    return [(text, OUT_OF_SCOPE) for text in oos + other]


def held_out_split(by_label: dict[str, list[str]], share: float, seed: int) -> tuple[dict[str, list[str]], list[Row]]:
    """Split each label's texts into training texts and held-out test rows.

    Stratified: every label keeps `share` of its texts for testing (rounded, at least one, and
    never all of them, so that every intent still has an example). Deterministic: which texts
    are held out depends only on the seed and the label, not on the other labels or the
    Python version (`random.Random` seeded with a string is stable).

    Returns:
        The training texts by label (in file order, so "the first N" means what it means for a
        bot's `examples_file`) and the held-out rows.

    Raises:
        ValueError: `share` is not strictly between 0 and 1.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"the held-out share must be between 0 and 1, got {share}")
    train: dict[str, list[str]] = {}
    test: list[Row] = []
    for label in sorted(by_label):
        texts = by_label[label]
        count = min(max(round(share * len(texts)), 1), len(texts) - 1)
        held = set(random.Random(f"{seed}/{label}").sample(range(len(texts)), count))
        train[label] = [text for i, text in enumerate(texts) if i not in held]
        test += [(texts[i], label) for i in sorted(held)]
    return train, test


def _csv_rows(path: Path) -> list[Row]:
    try:
        by_label = read_labelled(path)
    except ValueError as exc:  # a bad header or short row, already naming the file and row
        raise IntentDataError(f"{exc} (expected a `text,category` CSV or CLINC150's JSON)") from exc
    if not by_label:
        raise IntentDataError(f"{path}: no rows after the header")
    return [(text, label) for label, texts in by_label.items() for text in texts]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise IntentDataError(f"{path}: cannot read it: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise IntentDataError(f"{path} line {exc.lineno}: not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise IntentDataError(f"{path}: expected a JSON object at the top, got {type(data).__name__}")
    return data


def _clinc_part(path: Path, data: dict[str, Any], part: str) -> list[Row]:
    """One list of a CLINC150 file as rows, its "oos" label turned into OUT_OF_SCOPE."""
    if part not in data:
        raise IntentDataError(f"{path}: no field '{part}' (CLINC150's JSON has train, val, oos_train and oos_val)")
    items = data[part]
    if not isinstance(items, list):
        raise IntentDataError(f"{path}: field '{part}' must be a list of [text, label], got {type(items).__name__}")
    rows = []
    for index, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) and x.strip() for x in item)):
            raise IntentDataError(f"{path}: field '{part}' item {index}: expected [text, label], got {item!r}")
        text, label = item[0].strip(), item[1].strip()
        rows.append((text, OUT_OF_SCOPE if label == CLINC_OOS else label))
    return rows
