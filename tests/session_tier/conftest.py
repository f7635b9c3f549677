"""Fixtures for the session tier: a store in a fresh data directory with a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import SessionStore
from tests.session_tier.fake_clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[SessionStore]:
    with SessionStore.open(tmp_path, clock=clock) as opened:
        yield opened
