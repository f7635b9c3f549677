"""The int8 precision (`precision="int8"`): linear layers as int8 products, attention in float64.

One stream's decode step multiplies one row by every weight matrix, so it is bound by reading
the weights: 540 MB a token in fp32, 83% of the step on this project's machine. Here each weight
is kept as int8 with a scale per output row (a quarter of the bytes), each input row is rounded
to int8 with a scale of its own when it arrives, and `torch._int_mm` (oneDNN's int8 kernels)
takes the product. Measured on the bundled model (2 cores, AVX-512 with VNNI;
bench/decode_profile.py): a decode step about 2x faster than fp32's, the weights' resident
memory under half; perplexity on SGD dev conversations within a percent of fp32's, the same
greedy next token at about nine positions in ten, so replies part from fp32's after a few tokens.
That difference is why it is a choice and not the default: a reply is another reply, and on
LangChain's standard Unicode tool-call test the bundled model copies a Japanese company's name
into the call in fp32 and writes another name in int8.

The token tier's promise (a turn on reused KV is the turn a full recompute would give) is kept
by computing attention in float64. The integer products are exact and each row has its own
scale, so a linear layer's output row never depends on the other rows of a batch or on how a
prompt was split. Attention is the one step whose fp32 result does: its sums run in another
order for one query than for a prompt computed in one piece, and rounding the next layer's
input to int8 turns those last-bit differences into whole steps (measured: replies on a reused
system prompt equal to a full recompute in 3 of 20 with fp32 attention). In float64 the
differences sit far below fp32's last bit and vanish when the result is rounded back to fp32
(20 of 20); the KV stays fp32, so the token tier's memory is unchanged, and the attention of
a 135M model is a small part of its step, so the cost is a few milliseconds at 1,000 tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

_INT8_MAX = 127
FLOAT64_ATTENTION = "chatcache_float64"  # the name it is registered under in transformers


class Int8Linear(nn.Module):
    """A linear layer whose product is taken in int8: the weight per output row, the input per row."""

    weight_int8: torch.Tensor
    weight_scales: torch.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / _INT8_MAX
        quantized = (weight / scales[:, None]).round().clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
        # Kept [out, in] and read transposed: oneDNN's fastest layout for few rows (5.8 against
        # 14 us for one row by 576x576, measured here).
        self.register_buffer("weight_int8", quantized)
        self.register_buffer("weight_scales", scales)
        self.bias = linear.bias

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features).float()
        row_scales = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / _INT8_MAX
        rows_int8 = (rows / row_scales).round_().to(torch.int8)
        out = torch._int_mm(rows_int8, self.weight_int8.t()).float()
        out *= row_scales
        out *= self.weight_scales
        if self.bias is not None:
            out += self.bias
        return out.to(input.dtype).reshape(*input.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_int8_matmul(model: nn.Module) -> int:
    """Swap every plain `nn.Linear` of `model` for an `Int8Linear`; returns how many.

    The fp32 weights of the swapped layers are freed, except where another module still holds
    them (a tied output embedding is also the input embedding). Layers with hooks (offloading,
    adapters) are left as they are: a swap would drop the hooks.
    """
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and not (child._forward_hooks or child._forward_pre_hooks or hasattr(child, "_hf_hook")):
                setattr(parent, name, Int8Linear(child))
                swapped += 1
    return swapped


def float64_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Softmax attention in float64, in transformers' attention-function signature.

    Query heads are grouped under the key-value head they share, so the keys and values are
    never repeated; the result is (batch, query, heads, dim) in the query's dtype.
    """
    if module.training or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("float64 attention is for inference with plain softmax attention (no dropout, softcap or sinks)")
    batch, heads, queries, dim = query.shape
    kv_heads, kv_length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scores = query.reshape(batch, kv_heads, group * queries, dim).double() @ key.double().transpose(-1, -2)
    scores *= scaling if scaling is not None else dim**-0.5
    if attention_mask is None and queries > 1:  # transformers leaves out a mask plain causal order implies
        columns = torch.arange(kv_length, device=query.device)
        attention_mask = (columns[None, :] <= columns[kv_length - queries :, None])[None, None]
    if attention_mask is not None:
        per_query = scores.view(batch, kv_heads, group, queries, kv_length)
        mask = attention_mask[:, :, None]
        if mask.dtype == torch.bool:
            per_query.masked_fill_(~mask, torch.finfo(torch.float64).min)
        else:
            per_query += mask.double()
    out = torch.softmax(scores, dim=-1) @ value.double()
    return out.reshape(batch, heads, queries, dim).transpose(1, 2).to(query.dtype).contiguous(), None


AttentionInterface.register(FLOAT64_ATTENTION, float64_attention)
AttentionMaskInterface.register(FLOAT64_ATTENTION, sdpa_mask)  # a boolean mask, as for sdpa


def supports_int8_precision(model: PreTrainedModel) -> bool:
    """Whether the model takes its attention from transformers' interface (most current models do)."""
    return bool(model._supports_attention_backend)


def use_int8_precision(model: PreTrainedModel) -> None:
    """Put `model` in the int8 precision: `Int8Linear` layers and float64 attention."""
    use_int8_matmul(model)
    model.set_attn_implementation(FLOAT64_ATTENTION)
