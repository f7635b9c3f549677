"""Faster fp32 decode steps on the CPU: multiply each weight by the few rows, not the rows by it.

A decode step multiplies one row per running request by every weight matrix of the model.
`nn.Linear` computes that as rows x weight-transposed; MKL computes the same product as
weight x rows-transposed much faster for few rows. Measured on the bundled model on this
project's 2-core machine, a whole decode step with 300 positions of KV, interleaved medians:
2 rows 95 ms against 168 ms, 4 rows 110 against 187, 8 rows 139 against 180, 16 rows 188
against 251. One row is no faster (100 against 94 ms; in a closed-loop run a single stream lost
15%), and a prefill chunk has many rows, where `nn.Linear` is as fast or a little faster (512
rows: 1.32 s against 1.39 s): for one row and above `FEW_ROWS` rows the layer is the plain
`nn.Linear`. In the engine (8 SGD conversations of 3 turns behind a 150-token system prompt,
closed loop, interleaved twice): 8 at once 39.7 and 39.5 tokens/s against 29.9 and 32.3, TTFT
p50 589 and 622 ms against 785 and 784; one at a time 10.9 and 10.9 against 12.2 and 10.8.

The product is the same in fp32 with another order of summation: logits differ by under 1e-4,
the same order as between a batched and a lone decode, and greedy replies agree with a full
recompute on the same kernels. Only the CPU in float32 is switched (`load_chat_model`); CUDA's
GEMMs have no such gap.

`use_packed_weights` goes further for the compiled decode step (`compiled_decode`): the few
rows are multiplied by a copy of each weight that oneDNN laid out for them once
(`mkldnn._reorder_linear_weight`), as vLLM-CPU's GEMMs read theirs, instead of MKL packing the
weight again at every product. At 8 rows and 300 positions of KV, a whole decode step of the
bundled model took 88.6 ms eager on packed weights against 116.9 ms, and compiled 74.8 ms
(`bench/compiled_decode.py`, interleaved medians, 2 shared cores); one row gains nothing.
The cost is a second copy of the weights (538 MB for the bundled model), which is why it comes
only with the compiled step, an opt-in. The packed copy is a oneDNN tensor inductor cannot take
as a graph input, so the product is an opaque custom op that finds the layer by its number.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

FEW_ROWS = 64  # rows at most that take the weight-first product (from two: one row is as fast either way)
PACKED_FOR_ROWS = 8  # the row count oneDNN lays a packed weight out for (any count multiplies correctly)
_packed_layers: list[weakref.ref[FewRowsLinear]] = []  # the custom op's way to a layer's packed weight


@torch.library.custom_op("chatcache::packed_product", mutates_args=())
def _packed_product(rows: torch.Tensor, layer: int) -> torch.Tensor:
    linear = _packed_layers[layer]()
    assert linear is not None and linear.packed is not None, "a packed layer outlived its number"
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, linear.packed, linear.bias, "none", [], "")
    return out


@_packed_product.register_fake
def _(rows: torch.Tensor, layer: int) -> torch.Tensor:
    linear = _packed_layers[layer]()
    assert linear is not None
    return rows.new_empty(rows.shape[0], linear.out_features)


class FewRowsLinear(nn.Linear):
    """An `nn.Linear` whose product with 2 to `FEW_ROWS` rows is taken weight-first, or from its packed weight once `pack`ed."""

    packed: torch.Tensor | None = None
    _packed_number = -1

    def pack(self) -> None:
        """Keep a oneDNN-packed copy of the weight, which products of few rows read from now on."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACKED_FOR_ROWS)
        self._packed_number = len(_packed_layers)
        _packed_layers.append(weakref.ref(self))

    @classmethod
    def sharing(cls, linear: nn.Linear) -> FewRowsLinear:
        """The same layer on the same parameters (a tied output embedding stays tied)."""
        with torch.device("meta"):  # no weights allocated only to be replaced
            layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // input.shape[-1]
        if rows == 1 or rows > FEW_ROWS:
            return F.linear(input, self.weight, self.bias)
        flat = input.reshape(rows, input.shape[-1])
        if self.packed is not None:
            product: torch.Tensor = _packed_product(flat, self._packed_number)
            return product.reshape(*input.shape[:-1], self.out_features)
        # .contiguous(): a transposed result fed to the next layer takes MKL's slow path.
        out = torch.mm(self.weight, flat.t()).t().contiguous()
        if self.bias is not None:
            out += self.bias
        return out.reshape(*input.shape[:-1], self.out_features)


def use_few_rows_matmul(model: nn.Module) -> int:
    """Swap every plain `nn.Linear` of `model` for a `FewRowsLinear` on its parameters; returns how many.

    Layers with hooks (offloading, adapters) are left as they are: a swap would drop the hooks.
    """
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and not (child._forward_hooks or child._forward_pre_hooks or hasattr(child, "_hf_hook")):
                setattr(parent, name, FewRowsLinear.sharing(child))
                swapped += 1
    return swapped


def use_packed_weights(model: nn.Module) -> int:
    """Pack the weight of every `FewRowsLinear` of `model` (none without oneDNN); returns how many."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return 0
    layers = [module for module in model.modules() if isinstance(module, FewRowsLinear) and module.packed is None]
    for layer in layers:
        layer.pack()
    return len(layers)
