"""Memory budget, eviction to disk, and restore: a restored session replies as if never evicted."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from chatcache import TokenTierConfig
from chatcache.tiers.kv_spill import SpillStore, dequantize_int8, quantize_int8

SYSTEM = "You are a test bot."
TURNS = ["Hello there", "Book a table for two", "What about Paris?"]
KEY = b"k" * 32  # signs the files of the stores built here


def bytes_per_turn_budget(make_engine, model, turns: int) -> int:  # type: ignore[no-untyped-def]
    # Room for roughly one conversation of `turns` short turns: forces eviction of the others.
    probe = make_engine(model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    for text in TURNS[:turns]:
        probe.chat("p", text, max_new_tokens=12)
    return probe.kv_stats().resident_bytes + probe.token_tier.bytes_per_token * 60


def test_memory_never_exceeds_budget_and_spilled_sessions_restore_exactly(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    budget = bytes_per_turn_budget(make_engine, tiny_model, 3)
    engine = make_engine(
        tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(memory_budget_bytes=budget, spill_dir=tmp_path)
    )
    never_evicted = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    tiers = []
    for text in TURNS:
        for session in ("a", "b", "c"):
            got = engine.chat(session, text, max_new_tokens=12)
            want = never_evicted.chat(session, text, max_new_tokens=12)
            assert got.token_ids == want.token_ids
            assert engine.kv_stats().resident_bytes <= budget
            tiers.append(got.stats.tier)
    stats = engine.kv_stats()
    assert stats.evictions > 0 and stats.spills > 0 and stats.restores > 0
    assert "disk" in tiers


def test_a_restore_from_disk_is_priced_by_the_measured_rate(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Admission control's share of a spilled session's first token: its file at the rate restores took."""
    budget = bytes_per_turn_budget(make_engine, tiny_model, 1)
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(memory_budget_bytes=budget, spill_dir=tmp_path))
    tier = engine.token_tier
    sessions = ["a", "b", "c", "d"]
    for session in sessions:
        engine.chat(session, TURNS[0], max_new_tokens=12)  # room for about one: the others go to disk

    def on_disk() -> list[str]:
        return [s for s in sessions if tier.session_kv(s).where == "disk"]

    first = on_disk()
    assert first and tier.restore_estimate(first[0]) == 0.0  # no restore measured yet: nothing to price it by
    engine.chat(first[0], TURNS[1], max_new_tokens=12)
    assert engine.kv_stats().restores == 1
    spilled = on_disk()
    assert spilled
    for session in spilled:
        estimate = tier.restore_estimate(session)
        assert estimate > 0 and estimate == tier.stats().restore_s_per_byte * tier.session_kv(session).nbytes  # type: ignore[operator]
    for resident in set(sessions) - set(spilled):
        assert tier.restore_estimate(resident) == 0.0  # in memory
    assert tier.restore_estimate("nobody") == 0.0


def test_corrupted_truncated_or_foreign_spill_files_fall_back_to_recompute(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    want = [reference.chat("s", text, max_new_tokens=12).token_ids for text in TURNS[:2]]

    def damage_flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))

    def damage_truncate(path: Path) -> None:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    def damage_garbage(path: Path) -> None:
        path.write_bytes(b"not a safetensors file")

    for damage in (damage_flip, damage_truncate, damage_garbage):
        spill = tmp_path / damage.__name__
        engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=spill))
        assert engine.chat("s", TURNS[0], max_new_tokens=12).token_ids == want[0]
        engine.token_tier.unload("s")
        path = engine.token_tier.session_kv("s").file
        assert path is not None and path.is_file()
        damage(path)
        got = engine.chat("s", TURNS[1], max_new_tokens=12)
        assert got.token_ids == want[1]
        assert got.stats.tier == "prefix"  # the file was refused, the shared prefix served
        assert engine.kv_stats().failed_restores == 1
        assert not path.exists()


def test_spill_file_of_other_weights_is_refused(make_engine, tiny_model, build_tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from chatcache import load_chat_model
    other = load_chat_model(str(build_tiny(tmp_path / "other", seed=1)), device="cpu")
    assert other.identity != tiny_model.identity
    writer = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"))
    reader = make_engine(other, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"))
    writer.chat("s", TURNS[0], max_new_tokens=12)
    writer.token_tier.unload("s")
    # Put the first model's KV exactly where the second model looks for this session.
    writer.token_tier.session_kv("s").file.replace(reader.token_tier.session_kv("s").file)
    reference = make_engine(other, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    got = reader.chat("s", TURNS[0], max_new_tokens=12)
    assert got.stats.tier != "disk"
    assert reader.kv_stats().failed_restores == 1
    assert got.token_ids == reference.chat("s", TURNS[0], max_new_tokens=12).token_ids


def test_int8_spill_is_smaller_and_serves_the_next_turn(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    full = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "fp"))
    small = make_engine(
        tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "q", spill_int8=True)
    )
    for engine in (full, small):
        engine.chat("s", TURNS[0], max_new_tokens=40)
        engine.token_tier.unload("s")
    fp, q = (engine.token_tier.session_kv("s") for engine in (full, small))
    assert fp.where == q.where == "disk"
    fp_size, q_size = fp.nbytes, q.nbytes
    assert q_size < 0.4 * fp_size
    reply = small.chat("s", TURNS[1], max_new_tokens=12)
    assert reply.stats.tier == "disk" and reply.stats.generated_tokens > 0


def test_int8_round_trip_error_is_bounded() -> None:
    x = torch.randn(1, 2, 16, 64)
    q, scale = quantize_int8(x)
    back = dequantize_int8(q, scale, torch.float32)
    # Symmetric rounding error is at most half a step of each vector's scale.
    assert torch.all((back - x).abs() <= scale / 2 + 1e-6)
    assert q.dtype == torch.int8


def test_ending_a_session_releases_memory_and_disk(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path))
    engine.chat("a", TURNS[0], max_new_tokens=8)
    engine.chat("b", TURNS[0], max_new_tokens=8)
    engine.token_tier.unload("b")
    before = engine.kv_stats().resident_bytes
    engine.sessions.end("a")
    engine.sessions.end("b")
    assert engine.kv_stats().resident_bytes < before
    assert engine.token_tier.session_kv("a").where != "memory"
    assert engine.token_tier.session_kv("b").where is None and not engine.token_tier.session_kv("b").file.exists()


def test_eviction_keeps_a_frequently_used_session_over_a_recent_one(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """LFU+ (the answer cache's policy): a busy conversation outlives a one-turn one, unlike plain LRU."""
    probe = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    probe.chat("x", "Hello there", max_new_tokens=8)
    one_session = probe.kv_stats().resident_bytes
    budget = 3 * one_session  # the prefix and about two short sessions
    engine = make_engine(
        tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(memory_budget_bytes=budget, spill_dir=tmp_path)
    )
    for text in ("Hello there", "Book a table", "ok", "Paris?"):
        engine.chat("busy", text, max_new_tokens=8)
    engine.chat("once", "Hello there", max_new_tokens=8)
    engine.chat("newcomer", "Hello there", max_new_tokens=8)
    assert engine.token_tier.session_kv("busy").where == "memory" and engine.token_tier.session_kv("once").where != "memory"
    assert engine.kv_stats().resident_bytes <= budget


def test_a_spill_being_written_holds_up_only_its_own_session(make_engine, tiny_model, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """While one session's file is written, other threads read the tier at once (admission's checks
    among them), the written KV still counts and is still known, and that session's next checkout
    waits for the file and restores from it."""
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path))
    engine.chat("a", TURNS[0], max_new_tokens=12)
    engine.chat("b", TURNS[0], max_new_tokens=12)
    tier = engine.token_tier
    resident = tier.resident_bytes()
    ids = [*tier.session_kv("a").ids, 42, 43]  # the next turn's prompt extends what the session holds
    prefix = engine.system_ids
    reusable = tier.reusable("a", ids, prefix)
    writing, release = threading.Event(), threading.Event()
    save = SpillStore.save

    def slow_save(*args, **kwargs):  # type: ignore[no-untyped-def]
        writing.set()
        assert release.wait(30)
        return save(*args, **kwargs)

    monkeypatch.setattr(SpillStore, "save", slow_save)  # every store's writes: this engine's is the only one writing
    unloading = threading.Thread(target=tier.unload, args=("a",))
    unloading.start()
    assert writing.wait(30)
    readers = [
        threading.Thread(target=lambda: results.append(("room", tier.fits(1)))),
        threading.Thread(target=lambda: results.append(("reusable", tier.reusable("a", ids, prefix)))),
        threading.Thread(target=lambda: results.append(("resident", tier.resident_bytes()))),
        threading.Thread(target=lambda: results.append(("b", tier.checkout("b", ids, prefix, len(ids) + 12).tier))),
    ]
    results: list[tuple[str, object]] = []
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(10)
    assert dict(results) == {"room": True, "reusable": reusable, "resident": resident, "b": "session"}, "none waited for the write"
    tier.release("b")
    checkouts: list[str] = []
    own = threading.Thread(target=lambda: checkouts.append(tier.checkout("a", ids, prefix, len(ids) + 12).tier))
    own.start()
    own.join(0.5)
    assert own.is_alive() and not checkouts, "its own checkout waits for its file"
    release.set()
    own.join(30)
    unloading.join(30)
    assert checkouts == ["disk"] and tier.stats().spills == 1


def test_the_least_a_turn_costs_is_what_its_session_holds_and_where(make_engine, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Admission's door: the message's tokens to prefill, the KV the session holds (at least the
    system prompt) plus message and reply in memory, and a restore when the KV is on disk."""
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path))
    tier, message = engine.token_tier, "What about Paris?"
    new = len(engine.renderer.encode_text(message))
    fresh = engine.admission.least_cost(message, "new", max_new_tokens=20)
    assert (fresh.prefill_tokens, fresh.kv_tokens, fresh.restore_s) == (new, len(engine.system_ids) + new + 20, 0.0)
    engine.chat("s", TURNS[0], max_new_tokens=12)
    held = tier.held_tokens("s")
    assert held > len(engine.system_ids)
    assert engine.admission.least_cost(message, "s", max_new_tokens=20).kv_tokens == held + new + 20
    tier.unload("s")
    engine.chat("s", TURNS[1], max_new_tokens=12)  # a restore is measured: spilled KV gets a price
    held = tier.held_tokens("s")
    tier.unload("s")
    on_disk = engine.admission.least_cost(message, "s", max_new_tokens=20)
    assert tier.held_tokens("s") == held and on_disk.kv_tokens == held + new + 20 and on_disk.restore_s > 0


def files_opened_for_ids(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The paths `SpillStore.spilled_ids` opens from now on (it reads a file's ids with `safe_open`)."""
    import safetensors

    opened: list[str] = []
    real_open = safetensors.safe_open

    def counting_open(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", counting_open)
    return opened


def test_spilled_ids_are_read_once_per_file_and_again_when_another_writer_replaces_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Admission asks for a spilled session's ids on the event loop at every request: the store
    answers from memory for the file it wrote, and reads a file another process wrote since."""
    opened = files_opened_for_ids(monkeypatch)
    layers = [(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))]
    ours, other_process = (SpillStore(tmp_path, "weights", "template", int8=False, budget_bytes=10**8, keys=[KEY]) for _ in range(2))
    ours.save("s", [1, 2, 3, 4, 5], layers)
    assert [list(ours.spilled_ids("s") or []) for _ in range(3)] == [[1, 2, 3, 4, 5]] * 3 and opened == []
    longer = [(torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4))]
    other_process.save("s", [9, 8, 7, 6, 5, 4, 3], longer)
    assert list(ours.spilled_ids("s") or []) == [9, 8, 7, 6, 5, 4, 3] and len(opened) == 1
    assert list(ours.spilled_ids("s") or []) == [9, 8, 7, 6, 5, 4, 3] and len(opened) == 1  # remembered after that read
    assert ours.spilled_ids("nobody") is None
    other_process.discard("s")
    assert ours.spilled_ids("s") is None


def test_the_remembered_spilled_ids_stay_within_their_byte_bound(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Thousands of spilled sessions must not hold their ids as Python lists forever: past the
    bound the least recently used are forgotten, and asking for one reads its file again."""
    import sys

    from chatcache.tiers import kv_spill

    monkeypatch.setattr(kv_spill, "KNOWN_IDS_BYTES", 4096)
    opened = files_opened_for_ids(monkeypatch)
    store = kv_spill.SpillStore(tmp_path, "weights", "template", int8=False, budget_bytes=10**9, keys=[KEY])
    ids = {f"s{n}": list(range(1000 + n, 1000 + n + 100)) for n in range(40)}  # 40 x 100 ids: 16 KB as int32
    for session, session_ids in ids.items():
        store.save(session, session_ids, [(torch.zeros(1, 1, 100, 2), torch.zeros(1, 1, 100, 2))])
    remembered = store._known_ids  # private: the store's own bound on what it remembers, which nothing outside it sees
    assert 0 < remembered.currsize <= 4096 and len(remembered) < len(ids)
    assert all(sys.getsizeof(value[1]) < 8 * 100 for value in remembered.values())  # 4 bytes an id, not 36
    assert list(store.spilled_ids("s39") or []) == ids["s39"] and opened == []  # the latest is remembered
    assert list(store.spilled_ids("s0") or []) == ids["s0"] and len(opened) == 1  # the first was forgotten: read again
