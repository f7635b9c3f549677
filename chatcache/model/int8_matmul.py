"""A faster mode on the CPU, chosen with `precision="int8"`: every linear layer as an int8 product.

One stream's decode step multiplies one row by every weight matrix, so it is bound by reading
the weights: 540 MB a token in fp32, 83% of the step on this project's machine. Here each weight
is kept as int8 with a scale per output row (a quarter of the bytes), each input row is rounded
to int8 with a scale of its own when it arrives, and `torch._int_mm` (oneDNN's int8 kernels)
takes the product. Measured on the bundled model (2 cores, AVX-512 with VNNI; bench/decode_profile.py):
a decode step about 2x faster than fp32's, the weights' resident memory a quarter.

What it costs, which is why it is not the default: perplexity on SGD dev conversations within a
percent of fp32's, but the greedy next token differs at about one position in ten, so replies
part from the exact ones after a few tokens. And it gives up the token tier's exactness: the
integer products are exact and each row has its own scale, so a row's product never depends on
the other rows of a batch, yet the fp32 attention before each layer differs in its last bits
between a prompt computed in one piece and one computed on reused KV, and rounding to int8
turns some of those differences into whole steps. A turn on reused KV then sometimes differs
from a full recompute, by a token the model was not torn between (measured: half the turns of
8 bundled-model conversations run together; every difference in fp32 is a near-tie).
"""

from __future__ import annotations

import torch
from torch import nn

_INT8_MAX = 127


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
