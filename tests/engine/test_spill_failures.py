"""A spill that cannot be written (full disk, file size limit) never costs a turn its reply.

The failures here are real: `RLIMIT_FSIZE` makes the kernel refuse any write past a few KiB
with EFBIG, as a disk that fills up mid-file does, and root cannot bypass it (unlike a
read-only directory). It is a per-process limit, so it is set here only around turns whose
session database is in memory (nothing else writes a file meanwhile); the `chatcache ask`
test (tests/cli) sets it in a subprocess. SIGXFSZ is ignored so the write returns the error
instead of killing the process.
"""

from __future__ import annotations

import fcntl
import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chatcache import TokenTierConfig

SYSTEM = "You are a test bot."
TURNS = [("a", "Hello there"), ("b", "Hello there"), ("a", "Book a table for two")]
LIMIT = 4096  # bytes: any spill file of these sessions is larger


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Every write of this process past `limit` bytes into a file fails with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def one_session_budget(make_engine, model) -> int:  # type: ignore[no-untyped-def]
    """Room for the shared prefix and one short session: a second session's turn evicts the first."""
    probe = make_engine(model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    probe.chat("p", TURNS[0][1], max_new_tokens=12)
    return probe.kv_stats().resident_bytes + probe.token_tier.bytes_per_token * 8


def test_a_turn_whose_eviction_spill_fails_keeps_its_reply_and_the_next_turn_recomputes(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    want = [reference.chat(session, text, max_new_tokens=12).token_ids for session, text in TURNS]
    spill = tmp_path / "kv"
    engine = make_engine(
        tiny_model,
        system_prompt=SYSTEM,
        store="sqlite://",
        token_tier=TokenTierConfig(memory_budget_bytes=one_session_budget(make_engine, tiny_model), spill_dir=spill),
    )
    with file_size_limit(LIMIT):
        replies = [engine.chat(session, text, max_new_tokens=12) for session, text in TURNS]
    assert [reply.token_ids for reply in replies] == want
    assert replies[2].stats.tier == "prefix"  # "a"'s KV was dropped, not restored from disk
    stats = engine.kv_stats()
    assert stats.failed_spills >= 2 and stats.spills == 0
    assert "Could not spill" in caplog.text
    assert list(spill.iterdir()) == []  # no partial file
    for session in ("a", "b"):
        said = [(m.role.value, m.content) for m in engine.sessions.records(session)]
        texts = [text for s, text in TURNS if s == session]
        replies_of = [r.text for r, (s, _) in zip(replies, TURNS) if s == session]
        assert said == [pair for t, r in zip(texts, replies_of) for pair in (("user", t), ("assistant", r))]


def test_close_with_a_failing_spill_does_not_raise(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spill = tmp_path / "kv"
    engine = make_engine(tiny_model, system_prompt=SYSTEM, store="sqlite://", token_tier=TokenTierConfig(spill_dir=spill))
    engine.chat("s", TURNS[0][1], max_new_tokens=12)
    with file_size_limit(LIMIT):
        engine.close()
    assert engine.kv_stats().failed_spills == 1
    assert list(spill.iterdir()) == []


def test_temporary_files_of_killed_writers_are_removed_when_the_tier_opens(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spill = tmp_path / "kv"
    spill.mkdir()
    ours = spill / f"{'0' * 32}.tmp4242.17"  # cut short between write and rename
    library = spill / ".tmpAb12Cd"  # safetensors' own, left by earlier versions
    unrelated = spill / "notes.txt"
    for path in (ours, library, unrelated):
        path.write_bytes(b"\0" * 1000)
    make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=spill))
    assert not ours.exists() and not library.exists()
    assert unrelated.exists()


def test_temporary_files_of_live_writers_stay_and_count_against_the_disk_budget(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path
) -> None:
    probe = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "probe"))
    probe.chat("p", TURNS[0][1], max_new_tokens=12)
    probe.token_tier.unload("p")
    size = probe.token_tier.session_kv("p").nbytes  # every session below spills this much
    spill = tmp_path / "kv"
    spill.mkdir()
    live = spill / f"{'0' * 32}.tmp{os.getpid()}.1"
    with open(live, "wb") as writer:  # another writer, still at work: it holds the file's lock
        fcntl.flock(writer, fcntl.LOCK_EX)
        writer.write(b"\0" * size)
        writer.flush()
        # Two spilled sessions fit the budget; with the live writer's file they do not.
        engine = make_engine(
            tiny_model,
            system_prompt=SYSTEM,
            token_tier=TokenTierConfig(spill_dir=spill, disk_budget_bytes=2 * size + size // 2),
        )
        assert live.exists()
        for session in ("a", "b"):
            engine.chat(session, TURNS[0][1], max_new_tokens=12)
            engine.token_tier.unload(session)
        assert engine.token_tier.session_kv("a").where is None  # its file went to make room
        assert engine.token_tier.session_kv("b").where == "disk"
