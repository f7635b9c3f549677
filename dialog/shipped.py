"""The bots that ship in `dialog/bots`: what `--bot NAME` and `load_bot(NAME)` accept besides a file."""

from __future__ import annotations

from .loader import BOTS_DIR


def shipped_bots() -> list[str]:
    """The names of the shipped bot definitions, sorted (e.g. ["customer_service"])."""
    return sorted(file.stem for file in BOTS_DIR.glob("*.yaml"))
