"""A model's identity is its weights: every weight counts, the directory they sit in does not."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from chatcache import ChatModel, TokenTierConfig, load_chat_model
from chatcache.model import loading as models
from chatcache.model import weights_identity as fingerprint
from chatcache.storage import default_data_dir

SYSTEM = "You are a test bot that answers questions about bookings."
QUESTION = "What is the weather like in Paris tomorrow?"
CACHED_ANSWER = "Sunny, 25 degrees."


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`load_chat_model` as a new process would run it: nothing loaded yet."""
    monkeypatch.setattr(models, "_chat_models", {})  # private: the process's loaded models, none as in a new process

    def fresh(directory: Path) -> ChatModel:
        models._chat_models.clear()
        return load_chat_model(str(directory), device="cpu")

    return fresh


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The weight files hashed, in order."""
    calls: list[Path] = []
    real = fingerprint.hash_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(fingerprint, "hash_file", counting)
    return calls


def change_last_layer_in_place(directory: Path) -> None:
    """Add 1 to the first value of the last layer's down projection, writing into the saved file."""
    path = directory / "model.safetensors"
    with path.open("r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        last = max(int(name.split(".")[2]) for name in header if name.startswith("model.layers."))
        tensor = header[f"model.layers.{last}.mlp.down_proj.weight"]
        assert tensor["dtype"] == "F32"
        handle.seek(8 + length + tensor["data_offsets"][0])
        (value,) = struct.unpack("<f", handle.read(4))
        handle.seek(-4, 1)
        handle.write(struct.pack("<f", value + 1.0))


def spill_then_reopen(make_engine, writer: ChatModel, reader: ChatModel, tmp_path: Path) -> Any:  # type: ignore[no-untyped-def]
    """A session spilled to disk and an answer cached by `writer`; `reader` is the next process."""
    shared = {"store": f"sqlite:///{tmp_path}/shared.db", "token_tier": TokenTierConfig(spill_dir=tmp_path / "kv")}
    first = make_engine(writer, system_prompt=SYSTEM, answer_cache=True, embedder=_embed, **shared)
    first.chat("s", "Hello there", max_new_tokens=8)
    first.token_tier.unload("s")
    first.sessions.create("q")
    where = first.turns.answer_scope("q", QUESTION)  # where session q's next turn looks it up
    assert where is not None and first.answer_cache.store(QUESTION, CACHED_ANSWER, where.scope, entropy_bits=0.0, latency_ms=1.0)
    first.close()
    return make_engine(reader, system_prompt=SYSTEM, answer_cache=True, embedder=_embed, **shared)


def _embed(texts: list[str]) -> Any:
    import numpy as np

    rows = np.zeros((len(texts), 8))
    rows[:, 0] = 1.0  # every question alike: only the scope can keep an answer from being served
    return rows


def test_a_changed_last_layer_gets_a_new_identity_and_nothing_old_is_reused(  # type: ignore[no-untyped-def]
    make_engine, build_tiny, load, tmp_path: Path
) -> None:
    directory = build_tiny(tmp_path / "model")
    before = load(directory)
    change_last_layer_in_place(directory)
    after = load(directory)
    assert after.identity != before.identity

    engine = spill_then_reopen(make_engine, before, after, tmp_path)
    got = engine.chat("s", "Book a table for two", max_new_tokens=8)
    assert got.stats.tier == "prefix"  # the old weights' KV is not restored: all but the system prompt recomputed
    answer = engine.chat("q", QUESTION, max_new_tokens=8)
    assert not answer.stats.answer_cache_hit and answer.text != CACHED_ANSWER


def test_a_copied_model_directory_is_the_same_model(make_engine, build_tiny, load, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    directory = build_tiny(tmp_path / "model")
    original = load(directory)
    copy = load(shutil.copytree(directory, tmp_path / "elsewhere" / "copy"))
    assert copy.identity == original.identity

    engine = spill_then_reopen(make_engine, original, copy, tmp_path)
    assert engine.chat("s", "Book a table for two", max_new_tokens=8).stats.tier == "disk"
    answer = engine.chat("q", QUESTION, max_new_tokens=8)
    assert answer.stats.answer_cache_hit and answer.text == CACHED_ANSWER


def test_file_digests_are_remembered_until_the_file_changes(build_tiny, load, hashed: list[Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    directory = build_tiny(tmp_path / "model")
    weights = (directory / "model.safetensors").resolve()
    first = load(directory)
    assert hashed == [weights]
    assert str(weights) in json.loads((default_data_dir() / "weights-digests.json").read_text())

    assert load(directory).identity == first.identity
    assert hashed == [weights]  # the second load read the remembered digest

    change_last_layer_in_place(directory)
    assert load(directory).identity != first.identity
    assert hashed == [weights, weights]


def test_a_model_built_in_memory_is_identified_by_its_tensors(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import copy

    same = ChatModel("in memory", copy.deepcopy(tiny_model.model), tiny_model.tokenizer)
    twin = ChatModel("another name", copy.deepcopy(tiny_model.model), tiny_model.tokenizer)
    assert same.identity == twin.identity
    with torch.no_grad():
        twin.model.model.layers[-1].mlp.down_proj.weight[0, 0] += 1.0
    changed = ChatModel("another name", twin.model, tiny_model.tokenizer)
    assert changed.identity != same.identity
