"""A clock for the session tier's tests that only moves when a test says so."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

START = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)


class FakeClock:
    """A clock that only moves when a test says so, so expiry times are exact."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now
