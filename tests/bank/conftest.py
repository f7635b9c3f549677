"""Fixtures for the demo bank: a backend on its own SQLite file, and a clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from chatcache.apps.bank import CoreBanking


class FakeClock:
    """Naive UTC time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 5, 9, 0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += timedelta(minutes=minutes)


@pytest.fixture
def bank_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/bank.sqlite"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def bank(bank_url: str, clock: FakeClock) -> Iterator[CoreBanking]:
    backend = CoreBanking(bank_url, clock=clock)
    yield backend
    backend.close()
