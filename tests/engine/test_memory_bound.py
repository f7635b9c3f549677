"""The engine bounds per-session state in memory by itself: by count and by idle time.

A session let go of continues on its next turn exactly like the uncached path: rebuilt from
the session tier, its KV restored from disk (or recomputed). A session in a turn in another
thread is never let go of.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

import chatcache
from chatcache import ConfigError, MemoryConfig, TokenTierConfig, TurnTierConfig
from chatcache.engine.memory import ResidentSessions
from chatcache.storage import SessionStore
from chatcache.tiers.conversations import Conversations

SYSTEM = "You are a test bot."
TEXTS = ["Hello there", "Book a table for two", "What about Paris?"]


def held_by_chatcache(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes alive that chatcache's own code allocated. tracemalloc traces the whole process, and
    what earlier tests left running on their threads is none of the engine's: a fresh-clone run
    counted 195 KiB over the last 60 sessions after the rest of the suite, against 38 KiB alone."""
    package = str(Path(chatcache.__file__).parent)
    return sum(trace.size for trace in snapshot.filter_traces([tracemalloc.Filter(True, f"{package}/*")]).traces)


def per_session_sizes(engine) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Every structure that holds something per session, by its number of sessions: the
    sessions' memories (conversation, drift topic, turn-tier entries), and the token tier's KV
    and heat, which the token tier holds because engines on one model share its budget."""
    kv = engine.kv_stats()
    return {
        "session memories": len(engine.sessions.held_in_memory()),
        "token tier KV": kv.sessions_in_memory,
        "token tier heat": kv.sessions_with_heat,
    }


def test_many_sessions_keep_every_per_session_structure_within_the_bound(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, toy_embed, tmp_path: Path, monkeypatch
) -> None:
    """120 sessions under a bound of 20. Past the bound, Python memory stops growing: traced
    with tracemalloc from session 40 (so that by session 60 the sessions in memory are all
    traced ones), what chatcache's own code allocated and still holds grows by under 64 KiB over
    the last 60 sessions (measured: 7 KiB), where without the bound it grows by 212 KiB
    (conversations, drift topics, turn-tier entries, heat) besides their KV. Counting the whole
    process instead counted what earlier tests left running on their threads: 195 KiB after the
    rest of the suite against 38 KiB alone (`held_by_chatcache`). The spill store's remembered ids
    have a bound in bytes (tested with the spill store), set here to what a few sessions take, so
    that it too is reached by session 60."""
    from chatcache.tiers import kv_spill

    monkeypatch.setattr(kv_spill, "KNOWN_IDS_BYTES", 4096)
    bound, sessions = 20, 120
    engine = make_engine(
        tiny_model,
        system_prompt=SYSTEM,
        drift=True,
        embedder=toy_embed,
        token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"),
        memory=MemoryConfig(max_sessions_in_memory=bound),
    )
    traced: dict[int, int] = {}
    kv: dict[int, int] = {}
    try:
        for index in range(sessions):
            if index == 2 * bound:
                tracemalloc.start()
            if index in (3 * bound, sessions - 1):
                gc.collect()  # count what is held, not garbage waiting for the cycle collector
                traced[index], kv[index] = held_by_chatcache(tracemalloc.take_snapshot()), engine.kv_stats().resident_bytes
            engine.chat(f"s{index}", TEXTS[index % 3], max_new_tokens=2)
            sizes = per_session_sizes(engine)
            assert max(sizes.values()) <= bound, (index, sizes)
    finally:
        tracemalloc.stop()
    assert min(per_session_sizes(engine).values()) == bound  # every structure did hold sessions
    assert traced[sessions - 1] - traced[3 * bound] < 64 << 10, traced
    assert kv[sessions - 1] <= kv[3 * bound] * 1.1, kv
    assert len(engine.sessions.all()) == sessions  # nothing was ended: the session tier keeps them all


def converse(engine, turns: list[tuple[str, str]]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [engine.chat(session, text, max_new_tokens=10).token_ids for session, text in turns]


def test_a_session_let_go_of_continues_like_the_uncached_path(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # "a" is the least recently used when "c" opens, so it is let go of before its second turn.
    turns = [("a", TEXTS[0]), ("b", TEXTS[0]), ("c", TEXTS[1]), ("a", TEXTS[1]), ("a", TEXTS[2])]
    reference = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    want = converse(reference, turns)
    for spill_dir, tier in ((tmp_path / "kv", "disk"), (None, "prefix")):
        engine = make_engine(
            tiny_model,
            system_prompt=SYSTEM,
            token_tier=TokenTierConfig(spill_dir=spill_dir),
            memory=MemoryConfig(max_sessions_in_memory=2),
        )
        assert converse(engine, turns[:3]) == want[:3]
        assert engine.sessions.loaded("a") is None and engine.token_tier.session_kv("a").where != "memory"
        # "b" and "c" hold KV in memory, so each has a heat: "a" has none left.
        assert [engine.token_tier.session_kv(s).where for s in "bc"] == ["memory"] * 2 and engine.kv_stats().sessions_with_heat == 2
        restored = engine.chat("a", TEXTS[1], max_new_tokens=10)
        assert restored.stats.tier == tier and restored.token_ids == want[3]
        assert converse(engine, turns[4:]) == want[4:]
        assert engine.sessions.history("a") == reference.sessions.history("a")


def test_idle_sessions_are_let_go_of_after_the_idle_limit(make_engine, tiny_model, toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(
        tiny_model,
        system_prompt=SYSTEM,
        drift=True,
        embedder=toy_embed,
        token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"),
        memory=MemoryConfig(idle_seconds=0.5, sweep_every_s=0),
    )
    engine.chat("a", TEXTS[0], max_new_tokens=4)
    engine.chat("b", TEXTS[0], max_new_tokens=4)
    time.sleep(0.6)
    engine.chat("c", TEXTS[1], max_new_tokens=4)
    assert engine.sessions.held_in_memory() == ["c"]
    kv = engine.kv_stats()
    assert engine.token_tier.session_kv("c").where == "memory" and kv.sessions_in_memory == kv.sessions_with_heat == 1  # "c"'s alone
    assert engine.token_tier.session_kv("a").where == "disk"  # let go of, not lost


def test_a_session_in_a_turn_in_another_thread_is_not_let_go_of(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    want = converse(reference, [("busy", TEXTS[0]), ("busy", TEXTS[1])])
    engine = make_engine(
        tiny_model,
        system_prompt=SYSTEM,
        token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"),
        memory=MemoryConfig(max_sessions_in_memory=2),
    )
    mid_turn, others_done = threading.Event(), threading.Event()
    got: list[list[int]] = []

    def slow_turn() -> None:
        stream = engine.stream("busy", TEXTS[0], max_new_tokens=10)
        pieces = iter(stream)
        next(pieces)  # the turn holds its conversation from here...
        mid_turn.set()
        others_done.wait(timeout=60)
        list(pieces)  # ...to here
        assert stream.reply is not None
        got.append(stream.reply.token_ids)

    thread = threading.Thread(target=slow_turn)
    thread.start()
    assert mid_turn.wait(timeout=60)
    for session in ("x", "y", "z"):  # each pushes "busy" past the bound of two
        engine.chat(session, TEXTS[0], max_new_tokens=4)
        assert engine.sessions.loaded("busy") is not None
    others_done.set()
    thread.join(timeout=60)
    assert got == want[:1]
    assert engine.sessions.loaded("x") is None and engine.sessions.loaded("y") is None
    assert engine.chat("busy", TEXTS[1], max_new_tokens=10).token_ids == want[1]
    assert [m.content for m in engine.sessions.records("busy") if m.role.value == "user"] == TEXTS[:2]


def test_a_turn_waiting_for_a_conversation_dropped_meanwhile_takes_the_rebuilt_one(  # type: ignore[no-untyped-def]
    make_engine, tiny_model
) -> None:
    engine = make_engine(tiny_model, system_prompt=SYSTEM)
    engine.chat("s", TEXTS[0], max_new_tokens=4)
    sessions = engine.sessions
    stale = sessions.open("s", create=False)
    held: list[object] = []
    with stale.lock:  # a turn in progress
        waiter = threading.Thread(target=lambda: held.extend(_hold(sessions)))
        waiter.start()
        time.sleep(0.2)  # the waiter has the stale memory and waits for its lock
        sessions.forget("s")  # dropped (let go of, or after a failed write) while it waits
    waiter.join(timeout=30)
    assert held and held[0] is not stale and held[0] is sessions.open("s", create=False)


def _hold(sessions) -> list[object]:  # type: ignore[no-untyped-def]
    with sessions.hold("s", create=False) as memory:
        return [memory]


class Resident:
    """ResidentSessions on a real session tier, with a fake clock and a count of expiries."""

    def __init__(self, tmp_path: Path, **config: float) -> None:
        self.now = 1000.0
        self.expiries = 0
        store = SessionStore(f"sqlite:///{tmp_path}/sessions.db")
        self.sessions = ResidentSessions(
            MemoryConfig(**config),  # type: ignore[arg-type]
            Conversations(store, "bot", "user", None),
            TurnTierConfig(),
            None,
            self.expire,
            clock=lambda: self.now,
        )

    def expire(self) -> None:
        self.expiries += 1

    def use(self, *session_ids: str) -> None:
        for session_id in session_ids:
            self.sessions.open(session_id, create=True)

    def held(self) -> list[str]:
        return [memory.key for memory in self.sessions.sessions()]


def test_the_least_recently_used_sessions_go_beyond_the_count(tmp_path: Path) -> None:
    resident = Resident(tmp_path, max_sessions_in_memory=2)
    resident.use("a", "b", "a", "c", "d")
    assert resident.held() == ["c", "d"]


def test_idle_sessions_go_at_the_next_sweep_only(tmp_path: Path) -> None:
    resident = Resident(tmp_path, idle_seconds=60, sweep_every_s=30)
    resident.use("a")
    resident.now += 50
    resident.use("b")
    resident.now += 15  # "a" is idle, but the first sweep is not due yet (30 s after start)
    resident.use("b")
    assert resident.held() == ["a", "b"]
    resident.now += 20
    resident.use("c")
    assert resident.held() == ["b", "c"]


def test_a_session_in_a_turn_in_another_thread_is_kept_and_tried_again(tmp_path: Path) -> None:
    resident = Resident(tmp_path, max_sessions_in_memory=1)
    in_turn, done = threading.Event(), threading.Event()

    def turn() -> None:
        with resident.sessions.hold("a", create=True):
            in_turn.set()
            done.wait(timeout=30)

    thread = threading.Thread(target=turn)
    thread.start()
    assert in_turn.wait(timeout=30)
    resident.use("b")  # "a" is in a turn: kept, as if just used, so "b" is the oldest now
    assert resident.held() == ["b", "a"]
    memory = resident.sessions.loaded("a")
    done.set()
    thread.join(timeout=30)
    resident.use("c")
    assert resident.held() == ["c"]
    assert resident.sessions.loaded("a") is None and memory is not None


def test_a_caller_kept_conversation_is_let_go_of_like_a_session(tmp_path: Path) -> None:
    resident = Resident(tmp_path, max_sessions_in_memory=2)
    with resident.sessions.hold_kv("lc:key"):
        resident.use("a", "b")  # past the bound, but the key's turn holds it
    assert len(resident.sessions) == 3  # past the bound: the key in a turn is kept, as if just used
    resident.use("a", "c")  # the key is now the least recently used
    assert len(resident.sessions) == 2 and resident.held() == ["a", "c"]


def test_the_session_tier_expires_at_a_bounded_rate(tmp_path: Path) -> None:
    resident = Resident(tmp_path, expire_every_s=300)
    for _ in range(10):
        resident.use("a")
        resident.now += 60
    assert resident.expiries == 1  # due once, at 300 s; the next would be at 600 s


def test_memory_config_refuses_bad_bounds() -> None:
    for bad in ({"max_sessions_in_memory": 0}, {"idle_seconds": 0}, {"sweep_every_s": -1}):
        with pytest.raises(ConfigError):
            MemoryConfig(**bad)  # type: ignore[arg-type]
