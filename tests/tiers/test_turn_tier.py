"""The turn tier forgets on time, on drift, and within its bounds."""

from __future__ import annotations

import sys
import threading

import pytest

from chatcache.errors import ConfigError
from chatcache.tiers.turn_tier import TurnTier, TurnTierConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    tier = TurnTier(TurnTierConfig(ttl_s=300), clock=clock)
    tier.put("s", "intent", "transfer")
    clock.now += 299
    assert tier.get("s", "intent") == "transfer"
    clock.now += 2
    assert tier.get("s", "intent") is None
    assert tier.items("s") == {}


def test_purge_removes_only_expired_entries() -> None:
    clock = Clock()
    tier = TurnTier(TurnTierConfig(ttl_s=10), clock=clock)
    tier.put("a", "old", 1)
    clock.now += 5
    tier.put("b", "new", 2)
    clock.now += 6
    assert tier.purge_expired() == 1
    assert len(tier) == 1 and tier.get("b", "new") == 2


def test_invalidate_drops_a_session_and_leaves_others() -> None:
    tier = TurnTier()
    tier.put("a", "slot:amount", "200")
    tier.put("a", "intent", "transfer")
    tier.put("b", "intent", "balance")
    assert tier.invalidate("a") == 2
    assert tier.items("a") == {}
    assert tier.items("b") == {"intent": "balance"}


def test_clear_drops_every_session() -> None:
    tier = TurnTier()
    tier.put("a", "intent", "transfer")
    tier.put("b", "intent", "balance")
    tier.clear()
    assert len(tier) == 0 and tier.items("a") == {} and tier.items("b") == {}


def test_bounds_drop_the_oldest_entry_and_session() -> None:
    tier = TurnTier(TurnTierConfig(max_entries_per_session=2, max_sessions=2))
    for key in ("k1", "k2", "k3"):
        tier.put("a", key, key)
    assert set(tier.items("a")) == {"k2", "k3"}
    tier.put("b", "k", 1)
    tier.put("a", "k4", 4)  # "a" is now the most recently used
    tier.put("c", "k", 1)
    assert tier.items("b") == {} and tier.items("a") and tier.items("c")


def test_bad_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="ttl_s"):
        TurnTierConfig(ttl_s=0)


def test_concurrent_writers_do_not_lose_entries() -> None:
    tier = TurnTier(TurnTierConfig(max_entries_per_session=10_000))

    def write(session: str) -> None:
        for index in range(500):
            tier.put(session, f"k{index}", index)

    threads = [threading.Thread(target=write, args=(f"s{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tier) == 2000


def test_concurrent_writers_keep_the_bounds_and_never_fail() -> None:
    """Writers sharing sessions past both bounds: without the tier's lock this raises KeyError
    in the writers (checked by hand); with it no writer fails and both bounds hold."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    tier = TurnTier(TurnTierConfig(max_entries_per_session=20, max_sessions=3))
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            for index in range(2000):
                tier.put(f"s{index % 5}", f"k{writer}-{index}", index)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert errors == []
    held = [len(tier.items(f"s{i}")) for i in range(5)]
    assert sum(1 for n in held if n) <= 3 and max(held) <= 20 and len(tier) == sum(held)
