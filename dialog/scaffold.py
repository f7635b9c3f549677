"""`chatcache init NAME`: a new bot's files, from the template in `dialog/template`.

The template is a small working bot (answers from its knowledge base, a flow that asks for a
slot and calls a cached action, a hand-off, a fallback) with its conversation tests, so that `chatcache
test-bot` passes on it from the first minute and each part shows how it is written.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

TEMPLATE = Path(__file__).parent / "template"
NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
FILES = {
    "bot.yaml.tmpl": "{name}.yaml",
    "actions.py.tmpl": "actions.py",
    "knowledge.yaml.tmpl": "knowledge.yaml",
    "stories.yaml.tmpl": "stories.yaml",
    "README.md.tmpl": "README.md",
}


class ScaffoldError(ValueError):
    """A name or a place a new bot cannot get."""


def scaffold(name: str, parent: Path) -> list[Path]:
    """Write bot `name`'s files into `parent/name` (a new or empty directory); returns them.

    Raises:
        ScaffoldError: the name is not lower-case letters, digits, '_' and '-' (starting with a
            letter), or the directory exists and is not empty (nothing is overwritten).
    """
    if not NAME.fullmatch(name):
        raise ScaffoldError(f"bot name {name!r}: use lower-case letters, digits, '_' and '-', starting with a letter")
    directory = parent / name
    if directory.exists() and any(directory.iterdir()):
        raise ScaffoldError(f"{directory} exists and is not empty: nothing was written")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for source, target in FILES.items():
        text = string.Template((TEMPLATE / source).read_text(encoding="utf-8")).substitute(name=name)
        path = directory / target.format(name=name)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
