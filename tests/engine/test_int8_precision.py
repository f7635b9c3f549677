"""The int8 precision (`chatcache.model.int8_precision`): close to fp32, each row independent of
the other rows, a model of its own identity, and turns on reused or restored KV the same as a
full recompute."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from chatcache import ChatModel, ConfigError, TokenTierConfig, load_chat_model
from chatcache.model.generation import forward
from chatcache.model.int8_precision import Int8Linear, float64_attention, use_int8_matmul
from chatcache.model.kv import new_cache

from .test_token_tier_correctness import checked_out_whole

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


def test_int8_is_another_model_than_exact_with_another_identity(int8_tiny: ChatModel, tiny_model: ChatModel, tiny_model_dir: Path) -> None:
    assert int8_tiny is not tiny_model
    assert (int8_tiny.precision, tiny_model.precision) == ("int8", "exact")  # exact unless asked
    assert int8_tiny.identity == tiny_model.identity + "+int8"  # spilled KV and answers never cross modes
    assert [name for name, m in int8_tiny.model.named_modules() if type(m) is nn.Linear] == []
    assert int8_tiny.model.config._attn_implementation == "chatcache_float64"
    assert tiny_model.model.config._attn_implementation == "chatcache_grouped_sdpa"  # sdpa's floats, its grouped heads never copied
    assert load_chat_model(str(tiny_model_dir), device="cpu", precision="int8") is int8_tiny


def test_a_precision_that_cannot_be_had_is_a_clear_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="precision must be one of exact, int8"):
        load_chat_model(str(tiny_model_dir), device="cpu", precision="int4")
    with pytest.raises(ConfigError, match="float32 weights on the CPU"):
        load_chat_model(str(tiny_model_dir), device="cpu", dtype=torch.bfloat16, precision="int8")


def test_float64_attention_is_sdpa_and_a_query_alone_is_its_row_of_the_prompt() -> None:
    """Grouped heads, causal order, a padded batch row: the same as sdpa to fp32's rounding, and
    the last query on its own bit for bit what it is in the whole prompt (what fp32 sdpa is not)."""
    torch.manual_seed(2)
    attention = nn.Module().eval()
    query, key, value = torch.randn(2, 6, 40, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    causal = torch.ones(40, 40).tril().bool()
    mask = causal.expand(2, 1, 40, 40).clone()
    mask[1, :, :, 30:] = False  # row 1 is padded after 30 positions
    got, _ = float64_attention(attention, query, key, value, mask, scaling=0.25)
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(got, expected.transpose(1, 2), rtol=1e-5, atol=1e-6)
    unmasked, _ = float64_attention(attention, query, key, value, None, scaling=0.25)  # causal when left out
    assert torch.equal(unmasked[0], got[0])
    alone, _ = float64_attention(attention, query[:, :, -1:], key, value, None, scaling=0.25)
    assert torch.equal(alone[0], got[0, -1:])


def test_int8_turns_on_reused_and_restored_kv_are_a_full_recompute(make_engine, int8_tiny: ChatModel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The reply tokens were decoded one at a time and the session restored from disk; a prompt
    computed in one piece gives the same logits, bit for bit."""
    engine = make_engine(int8_tiny, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=tmp_path))
    engine.chat("s", TURNS[0], max_new_tokens=8)
    engine.token_tier.unload("s")
    reply = engine.chat("s", TURNS[1], max_new_tokens=8)
    assert reply.stats.tier == "disk" and reply.stats.reused_tokens > 0.5 * reply.stats.prompt_tokens
    ids = engine.token_tier.session_kv("s").ids
    probe = int8_tiny.tokenizer.encode("And", add_special_tokens=False)
    reused = forward(int8_tiny.model, probe, checked_out_whole(engine.token_tier, "s", ids, probe))
    full = forward(int8_tiny.model, ids + probe, new_cache(int8_tiny.model.config))
    assert torch.equal(reused, full)
