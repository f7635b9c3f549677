"""The int8 mode (`chatcache.model.int8_matmul`): close to fp32, each row independent of the other
rows, a model of its own identity, and the token tier working on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from chatcache import ChatModel, ConfigError, TokenTierConfig, load_chat_model
from chatcache.model.generation import forward
from chatcache.model.int8_matmul import Int8Linear, use_int8_matmul
from chatcache.tiers.kv import new_cache

SYSTEM = "You are a customer-service assistant for a bank. Answer briefly."
TURNS = ["Hi, my card has not arrived.", "It was sent two weeks ago."]


@pytest.fixture(scope="module")
def int8_tiny(tiny_model_dir: Path) -> ChatModel:
    return load_chat_model(str(tiny_model_dir), device="cpu", precision="int8")


def test_the_product_is_within_the_rounding_of_weights_and_rows() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536)
    rows = torch.randn(5, 576)
    with torch.no_grad():
        exact = linear(rows)
        got = Int8Linear(linear)(rows)
    assert got.shape == exact.shape
    # Each row and each weight row rounded to 255 levels: a few tenths of a percent of the largest output.
    assert float((got - exact).abs().max()) < 0.01 * float(exact.abs().max())
    assert float((got - exact).abs().max()) > 0  # it is rounded: the exact path is another mode


def test_a_rows_result_does_not_depend_on_the_other_rows() -> None:
    """Exact integer sums and a scale per row: a batched decode row equals that row alone, bit for bit."""
    torch.manual_seed(1)
    layer = Int8Linear(nn.Linear(64, 48))
    rows = torch.randn(9, 64) * torch.logspace(-2, 2, 9)[:, None]  # rows of very different sizes
    with torch.no_grad():
        batched = layer(rows)
        for i in range(len(rows)):
            assert torch.equal(batched[i : i + 1], layer(rows[i : i + 1]))
        assert torch.equal(layer(rows.reshape(3, 3, 64)).reshape(9, 48), batched)  # any leading shape


def test_swapping_frees_nothing_tied_and_leaves_hooked_layers() -> None:
    embedding = nn.Embedding(50, 16)
    head = nn.Linear(16, 50, bias=False)
    head.weight = embedding.weight
    hooked = nn.Linear(16, 16)
    hooked.register_forward_hook(lambda *args: None)
    model = nn.ModuleDict({"embed": embedding, "head": head, "hooked": hooked})
    assert use_int8_matmul(model) == 1
    assert isinstance(model["head"], Int8Linear) and model["hooked"] is hooked
    assert model["embed"].weight is embedding.weight  # the input embedding keeps its fp32 rows
    with torch.no_grad():
        hidden = embedding(torch.tensor([3, 7]))
        exact = hidden @ embedding.weight.t()
        assert float((model["head"](hidden) - exact).abs().max()) < 0.02 * float(exact.abs().max())


def test_loading_in_int8_is_another_model_with_another_identity(int8_tiny: ChatModel, tiny_model: ChatModel, tiny_model_dir: Path) -> None:
    assert int8_tiny is not tiny_model
    assert (int8_tiny.precision, tiny_model.precision) == ("int8", "exact")  # exact unless asked
    assert int8_tiny.identity == tiny_model.identity + "+int8"  # spilled KV and answers never cross modes
    assert [name for name, m in int8_tiny.model.named_modules() if type(m) is nn.Linear] == []
    assert load_chat_model(str(tiny_model_dir), device="cpu", precision="int8") is int8_tiny


def test_a_precision_that_cannot_be_had_is_a_clear_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="precision must be one of exact, int8"):
        load_chat_model(str(tiny_model_dir), device="cpu", precision="int4")
    with pytest.raises(ConfigError, match="float32 weights on the CPU"):
        load_chat_model(str(tiny_model_dir), device="cpu", dtype=torch.bfloat16, precision="int8")


def test_int8_turns_reuse_and_restore_kv_close_to_a_recompute(make_engine, int8_tiny: ChatModel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Not equal, close: rounding to int8 turns last-bit differences of the fp32 attention into steps."""
    engine = make_engine(int8_tiny, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path))
    engine.chat("s", TURNS[0], max_new_tokens=8)
    engine.token_tier.unload("s")
    reply = engine.chat("s", TURNS[1], max_new_tokens=8)
    assert reply.stats.tier == "disk" and reply.stats.reused_tokens > 0.5 * reply.stats.prompt_tokens
    entry = engine.token_tier._sessions["s"]
    probe = int8_tiny.tokenizer.encode("And", add_special_tokens=False)
    reused = forward(int8_tiny.model, probe, entry.cache)
    full = forward(int8_tiny.model, entry.ids + probe, new_cache(int8_tiny.model.config))
    assert float((reused - full).abs().max()) < 0.05 * float(full.abs().max())
