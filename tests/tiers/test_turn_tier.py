"""The turn tier forgets on time, on drift, and within its bound."""

from __future__ import annotations

import sys
import threading

import pytest

from chatcache.errors import ConfigError
from chatcache.tiers.turn_tier import TurnEntries, TurnTierConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    entries = TurnEntries(TurnTierConfig(ttl_s=300), clock=clock)
    entries.put("intent", "transfer")
    clock.now += 299
    assert entries.get("intent") == "transfer"
    clock.now += 2
    assert entries.get("intent") is None
    assert entries.items() == {}


def test_purge_removes_only_expired_entries() -> None:
    clock = Clock()
    entries = TurnEntries(TurnTierConfig(ttl_s=10), clock=clock)
    entries.put("old", 1)
    clock.now += 5
    entries.put("new", 2)
    clock.now += 6
    assert entries.purge_expired() == 1
    assert len(entries) == 1 and entries.get("new") == 2


def test_clear_drops_every_entry() -> None:
    entries = TurnEntries(TurnTierConfig())
    entries.put("slot:amount", "200")
    entries.put("intent", "transfer")
    assert entries.clear() == 2
    assert len(entries) == 0 and entries.items() == {}


def test_the_bound_drops_the_oldest_entry() -> None:
    entries = TurnEntries(TurnTierConfig(max_entries_per_session=2))
    for key in ("k1", "k2", "k3"):
        entries.put(key, key)
    assert set(entries.items()) == {"k2", "k3"}
    entries.put("k2", "again")  # rewritten: now the newest
    entries.put("k4", 4)
    assert entries.items() == {"k2": "again", "k4": 4}


@pytest.mark.parametrize("bad", [{"ttl_s": 0}, {"max_entries_per_session": 0}])
def test_bad_config_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        TurnTierConfig(**bad)  # type: ignore[arg-type]


def test_writers_and_a_purger_in_threads_keep_the_bound_and_never_fail() -> None:
    """Writers past the bound beside the upkeep's purge: without the lock this raises in the
    writers or the purger (the dict changes size while iterated); with it none fails, and the
    bound holds."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    clock = Clock()
    entries = TurnEntries(TurnTierConfig(ttl_s=1, max_entries_per_session=20), clock=clock)
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            for index in range(2000):
                entries.put(f"k{writer}-{index}", index)
                clock.now += 0.01
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    def purge() -> None:
        try:
            for _ in range(2000):
                entries.purge_expired()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)] + [threading.Thread(target=purge)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert errors == []
    assert len(entries) <= 20 and len(entries.items()) <= len(entries)
