"""Spilled KV is signed: a file someone with write access to the spill dir altered is refused.

The attacker here can read and write the spill directory and knows the file format, so they can
recompute anything that does not need the key: the SHA-256 an unsigned file carried, the
metadata, another session's file name. Every refusal is logged and counted, and the turn gives
the reply of the uncached path. Files signed with a key that is configured (the current one
or, during a rotation, the previous one) are restored from disk by any engine that holds it.
"""

from __future__ import annotations

import hashlib
import logging
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from chatcache import TokenTierConfig
from chatcache.errors import ConfigError

SYSTEM = "You are a test bot."
TURNS = ["Hello there", "Book a table for two"]
OLD_KEY = b"old-key-0123456749abcdef0123456749"
NEW_KEY = b"new-key-0123456749abcdef0123456749"


def unsigned_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """The SHA-256 that files carried before signing, as anyone can compute it."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def rewrite(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write a spill file back as an attacker would: new tensors, every keyless field recomputed."""
    save_file(tensors, str(path), metadata={**metadata, "sha256": unsigned_checksum(tensors)})


def read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    return load_file(str(path)), metadata


def uncached_replies(make_engine, tiny_model, session: str = "s") -> list[list[int]]:  # type: ignore[no-untyped-def]
    reference = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    return [reference.chat(session, text, max_new_tokens=12).token_ids for text in TURNS]


def spilled_after_one_turn(engine, session: str = "s") -> Path:  # type: ignore[no-untyped-def]
    engine.chat(session, TURNS[0], max_new_tokens=12)
    engine.token_tier.unload(session)
    path = engine.token_tier.session_kv(session).file
    assert isinstance(path, Path) and path.is_file()
    return path


def assert_refused_and_recomputed(engine, want: list[int], caplog: pytest.LogCaptureFixture, why: str, session: str = "s") -> None:  # type: ignore[no-untyped-def]
    got = engine.chat(session, TURNS[1], max_new_tokens=12)
    assert got.stats.tier != "disk"
    assert got.token_ids == want
    assert engine.kv_stats().failed_restores == 1 and engine.kv_stats().restores == 0
    refusals = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()]
    assert len(refusals) == 1 and repr(session) in refusals[0] and why in refusals[0]


def test_a_forged_spill_file_is_refused_and_the_turn_gives_the_uncached_reply(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    want = uncached_replies(make_engine, tiny_model)
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"))
    path = spilled_after_one_turn(engine)
    tensors, metadata = read(path)
    generator = torch.Generator().manual_seed(0)
    forged = {
        name: torch.randn(t.shape, generator=generator).to(t.dtype) * 50 if name[0] in "kv" else t
        for name, t in tensors.items()
    }
    rewrite(path, forged, metadata)
    assert_refused_and_recomputed(engine, want[1], caplog, "signature does not verify")
    assert not path.exists()


def test_a_valid_file_of_another_session_copied_over_this_ones_is_refused(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    want = uncached_replies(make_engine, tiny_model, "victim")
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"))
    theirs = spilled_after_one_turn(engine, "attacker")
    theirs.replace(spilled_after_one_turn(engine, "victim"))
    assert_refused_and_recomputed(engine, want[1], caplog, "written for another session", session="victim")


def test_a_file_signed_with_another_key_is_refused(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    want = uncached_replies(make_engine, tiny_model)
    shared = {"store": f"sqlite:///{tmp_path}/shared.db", "system_prompt": SYSTEM}
    writer = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv", spill_keys=(OLD_KEY,)), **shared)
    spilled_after_one_turn(writer)
    reader = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv", spill_keys=(NEW_KEY,)), **shared)
    assert_refused_and_recomputed(reader, want[1], caplog, "key this store does not hold")


def test_a_file_from_before_signing_is_refused(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    want = uncached_replies(make_engine, tiny_model)
    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"))
    path = spilled_after_one_turn(engine)
    tensors, metadata = read(path)
    unsigned = {name: value for name, value in metadata.items() if name not in ("key", "signature")}
    rewrite(path, tensors, {**unsigned, "format": "chatcache-kv/1"})  # exactly what the old store wrote
    assert_refused_and_recomputed(engine, want[1], caplog, "before spill files were signed")


def test_during_a_rotation_files_signed_with_the_previous_key_are_restored_and_re_signed(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old key alone, then new key plus old (the environment's pair), then the new key alone
    (a key file): a session spilled under the old key is restored by the second and, spilled
    again, by the third; a file only the old key signed is refused by the third."""
    want = uncached_replies(make_engine, tiny_model)
    spill, shared = tmp_path / "kv", {"store": f"sqlite:///{tmp_path}/shared.db", "system_prompt": SYSTEM}
    old = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=spill, spill_keys=(OLD_KEY,)), **shared)
    spilled_after_one_turn(old, "s")
    spilled_after_one_turn(old, "left-alone")

    monkeypatch.setenv("CHATCACHE_KV_KEY", NEW_KEY.decode())
    monkeypatch.setenv("CHATCACHE_KV_PREVIOUS_KEY", OLD_KEY.decode())
    rotating = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=spill), **shared)
    got = rotating.chat("s", TURNS[1], max_new_tokens=12)
    assert got.stats.tier == "disk" and got.token_ids == want[1]
    assert rotating.kv_stats().restores == 1 and rotating.kv_stats().failed_restores == 0
    rotating.token_tier.unload("s")

    key_file = tmp_path / "keys"
    key_file.write_text(NEW_KEY.decode() + "\n")
    new = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=spill, spill_key_file=key_file), **shared)
    again = new.chat("s", "What about Paris?", max_new_tokens=12)
    assert again.stats.tier == "disk" and new.kv_stats().restores == 1  # re-signed with the new key
    assert new.chat("left-alone", TURNS[1], max_new_tokens=12).stats.tier != "disk"
    assert new.kv_stats().failed_restores == 1


def test_engines_with_the_same_key_restore_each_others_files(  # type: ignore[no-untyped-def]
    make_engine, tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two engines (replicas) on one spill dir and one database, given the same key by their
    configuration and by the environment: a session spilled by one continues on the other from disk."""
    want = uncached_replies(make_engine, tiny_model)
    shared = {"store": f"sqlite:///{tmp_path}/shared.db", "system_prompt": SYSTEM}
    first = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv", spill_keys=(NEW_KEY,)), **shared)
    monkeypatch.setenv("CHATCACHE_KV_KEY", NEW_KEY.decode())
    second = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv"), **shared)
    assert first.chat("s", TURNS[0], max_new_tokens=12).token_ids == want[0]
    first.token_tier.unload("s")
    got = second.chat("s", TURNS[1], max_new_tokens=12)
    assert got.stats.tier == "disk" and got.token_ids == want[1]
    assert second.kv_stats().restores == 1 and second.kv_stats().failed_restores == 0


GENERATE = """
import sys
from pathlib import Path
from chatcache.spill_keys import generate_key_file, read_key_file
print("ready", flush=True)
sys.stdin.readline()
print(read_key_file(generate_key_file(Path(sys.argv[1])))[0].decode(), flush=True)
"""


def test_the_generated_key_file_is_private_and_processes_starting_at_once_share_one_key(tmp_path: Path) -> None:
    path = tmp_path / "data" / "kv.key"
    children = [
        subprocess.Popen([sys.executable, "-c", GENERATE, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    for child in children:  # all are waiting: let them race
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    keys = {child.communicate(timeout=60)[0].strip() for child in children}
    assert all(child.returncode == 0 for child in children)
    assert keys == {path.read_text().strip()} and len(keys.pop()) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["kv.key", "kv.key.lock"]  # no temporary file left


def test_an_engine_without_keys_uses_the_generated_one_from_the_data_dir(tmp_path: Path) -> None:
    config = TokenTierConfig(spill_dir=tmp_path / "kv")
    key_file = tmp_path / "data" / "kv.key"  # CHATCACHE_DATA_DIR of every test (conftest)
    assert config.spill_keys == (key_file.read_text().strip().encode(),)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert TokenTierConfig(spill_dir=tmp_path / "other").spill_keys == config.spill_keys


def test_bad_keys_fail_at_construction_and_keys_stay_out_of_the_repr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="at least 32"):
        TokenTierConfig(spill_dir=tmp_path / "kv", spill_keys=(b"short",))
    monkeypatch.setenv("CHATCACHE_KV_KEY", "short")
    with pytest.raises(ConfigError, match="CHATCACHE_KV_KEY is 5 bytes"):
        TokenTierConfig(spill_dir=tmp_path / "kv")
    inside = tmp_path / "kv" / "keys"
    inside.parent.mkdir()
    inside.write_text(NEW_KEY.decode())
    with pytest.raises(ConfigError, match="in the spill directory"):
        TokenTierConfig(spill_dir=tmp_path / "kv", spill_key_file=inside)
    config = TokenTierConfig(spill_dir=tmp_path / "kv", spill_keys=(NEW_KEY,))
    assert NEW_KEY.decode() not in repr(config) and "spill_keys" not in repr(config)
