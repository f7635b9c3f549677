"""Attention on the CPU that never copies the KV for grouped heads: transformers' sdpa, less one copy.

Models with grouped-query attention (SmolLM2-135M: 9 query heads over 3 key-value heads) share
each key-value head among several query heads. For one query token transformers folds the
grouped query heads together and attends on the key-value heads as they are, but for several
query tokens under a mask (a prefill chunk after a reused prefix, a decode step fed drafted
tokens) it repeats every key and value head for each query head it serves: a copy of the whole
KV in every layer of every step. Measured on the bundled model (2 shared cores, 8 rows over
2,900 positions): 61% of a step fed two tokens a row went to that copy, which made the step
5.7x the cost of a step fed one token, and speculative decoding a loss.

torch's CPU kernel takes the grouped heads itself (`enable_gqa`) under a mask too, and gives
the same floats as attention on the repeated heads (tested on the tiny model and the bundled
one: `tests/engine/test_grouped_attention.py`). transformers does not ask for it off XPU and MPS
because CUDA's fast kernels refuse a mask with grouped heads; so this is registered under its
own name and set on CPU models only, and everything else goes to transformers' own function.

One query token's heads are packed onto their key head here as transformers packs them
eagerly (the same operations, so the same floats), but also under `torch.compile`, where
transformers repeats the keys and values instead: the compiled decode step
(`compiled_decode`) runs this function too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_ATTENTION = "chatcache_grouped_sdpa"  # the name it is registered under in transformers


def grouped_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with grouped heads attended without repeating the keys and
    values under a mask, also when compiled; the result is (batch, query, heads, dim)."""
    plain = not module.training and dropout == 0.0 and kwargs.get("softcap") is None and kwargs.get("position_bias") is None
    groups = int(getattr(module, "num_key_value_groups", 1))
    if not (plain and groups > 1 and attention_mask is not None and query.device.type == "cpu"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    batch, heads, queries, dim = query.shape
    if queries == 1:  # as transformers' `pack_gqa`: the group's heads as queries of their key head; the mask broadcasts
        packed = query.reshape(batch, heads // groups, groups, dim)
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask, scale=scaling)
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)  # the masks sdpa takes


def use_grouped_attention(model: PreTrainedModel) -> bool:
    """Give a CPU model on transformers' sdpa attention this function instead; True if it did.
    A model on another attention (eager, a precision's own) keeps it."""
    if model.config._attn_implementation != "sdpa" or not model._supports_attention_backend:
        return False
    model.set_attn_implementation(GROUPED_ATTENTION)
    return True
