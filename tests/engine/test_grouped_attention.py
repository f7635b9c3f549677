"""Grouped-head attention without repeated KV (`chatcache.model.grouped_attention`) gives the
floats transformers' sdpa gives, on the steps where it differs from it: several query tokens
under a mask (a prefill chunk after a reused prefix, a decode step fed drafted tokens)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from chatcache.model.batch_kv import BatchKV
from chatcache.model.generation import prefill
from chatcache.model.grouped_attention import GROUPED_ATTENTION, use_grouped_attention


def _pair(source: PreTrainedModel) -> tuple[PreTrainedModel, PreTrainedModel]:
    """The model on transformers' sdpa, and a copy of it on the grouped attention."""
    plain = copy.deepcopy(source)
    plain.set_attn_implementation("sdpa")
    grouped = copy.deepcopy(plain)
    assert use_grouped_attention(grouped) and grouped.config._attn_implementation == GROUPED_ATTENTION
    return plain, grouped


def _batch_step_logits(model: PreTrainedModel, prompts: list[list[int]], fed: list[int]) -> torch.Tensor:
    """One decode step as the scheduler runs it: each row's prompt prefilled, then every row
    fed `fed` tokens at once over the batch's KV, under the batch's mask."""
    batch = BatchKV(model.config)
    for prompt in prompts:
        cache = DynamicCache(config=model.config)
        prefill(model, prompt, cache)
        batch.join(cache, room=len(fed))
    mask = batch.begin_step(len(fed))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([fed] * len(prompts)), attention_mask=mask, position_ids=batch.positions(), cache=batch, use_cache=True)
    return out.logits  # type: ignore[no-any-return]


def test_the_loaded_cpu_model_attends_grouped_heads_without_repeating_them(tiny_model) -> None:  # type: ignore[no-untyped-def]
    assert tiny_model.model.config.num_key_value_heads < tiny_model.model.config.num_attention_heads
    assert tiny_model.model.config._attn_implementation == GROUPED_ATTENTION


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_masked_multi_token_steps_equal_sdpa_bit_for_bit(tiny_model_dir: Path, rows: int) -> None:
    plain, grouped = _pair(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval())
    torch.manual_seed(3)
    prompts = [torch.randint(5, 200, (int(n),)).tolist() for n in torch.randint(4, 40, (rows,))]  # rows of other lengths
    for fed in (1, 2, 9):
        tokens = torch.randint(5, 200, (fed,)).tolist()
        assert torch.equal(_batch_step_logits(grouped, prompts, tokens), _batch_step_logits(plain, prompts, tokens)), fed
    # A prefill chunk after a reused prefix (transformers masks it) and a whole prompt (no mask).
    for prefix, chunk in ((prompts[0], [7, 8, 9, 10]), ([], prompts[0])):
        results = []
        for model in (grouped, plain):
            cache = DynamicCache(config=model.config)
            if prefix:
                prefill(model, prefix, cache)
            with torch.no_grad():
                results.append(model(input_ids=torch.tensor([chunk]), cache=cache, use_cache=True).logits)
        assert torch.equal(*results)


def test_a_drafted_step_of_the_bundled_model_equals_sdpa(bundled_model) -> None:  # type: ignore[no-untyped-def]
    """The real model's grouped heads (9 over 3), 8 rows fed 5 tokens each after 300-token prompts."""
    plain, grouped = _pair(bundled_model.model)
    ids = bundled_model.tokenizer("Our branches are open from nine to five on weekdays. " * 30).input_ids[:300]
    prompts = [ids[: 300 - 7 * row] for row in range(8)]
    tokens = bundled_model.tokenizer(" and on Saturdays").input_ids[:5]
    assert torch.equal(_batch_step_logits(grouped, prompts, tokens), _batch_step_logits(plain, prompts, tokens))


def test_a_model_on_another_attention_keeps_it(tiny_model_dir: Path) -> None:
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    assert not use_grouped_attention(eager) and eager.config._attn_implementation == "eager"
