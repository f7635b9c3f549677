"""The scheduler's decode step compiled by inductor, once per batch size bucket.

Eager decoding dispatches every small operator (norms, rotary embeddings, activations, the KV
writes) one by one; inductor fuses them into a few loops, as vLLM-CPU does. A compiled graph
holds for fixed shapes, so the step is given few of them: the rows are padded up to a bucket
(1, 2, 4, 8, 16, 32, as vLLM pads to its compiled batch sizes), and the KV is `BatchKV`'s
buffers as they are, grown by `batch_kv.BLOCK` positions, with their length and the columns
attended to (the longest row's, as eager attends) compiled as dynamic dimensions: one graph per
batch bucket serves every length. A padded row is fed token 0 at position 0, sees only column
0 and writes only there, into a buffer row no request holds; rows are independent in every
operator, so the real rows' logits do not depend on it.

Two things differ from the eager step, neither in what is computed: the attention is
`grouped_attention`'s, which packs the query heads that share a key head into one head's
queries under compile too (transformers' `sdpa` does so eagerly for one query token, but under
compile copies every key and value per query head), and each row's new key and value are
written by one indexed write, which inductor does in place (a scatter, under dynamic shapes,
was copied whole every step). The graphs go to inductor's on-disk caches under chatcache's
data directory (`TORCHINDUCTOR_CACHE_DIR`, unless the user set it), so a later process loads
them instead of compiling again.

The weight products are most of the step (three quarters at 8 rows): fusing the rest gained
1.07x to 1.17x at 8 rows. The compiled step therefore also reads the weights oneDNN packed for
few rows (`few_rows.use_packed_weights`, a second copy of them), which gains as much again.

transformers routes some layers (the attention's rotary embedding) through the `kernels`
package, which keeps the routing table in a variable that becomes one for the whole process
while dynamo traces (`CompileableContextVar`; torch's "compiling" flag is the process's, not the
thread's): an eager forward of the model on another thread during a compile (a long system
prompt's prefill on the caller's thread, in `bench.concurrency`) wrote it under the trace, and
the compile failed ("Guard failed on the same frame it was created"). chatcache loads no hub
kernels, so the compiled model's layers are given their own forward back
(`without_hub_kernel_routing`): neither the trace nor the model's eager forwards write that
variable. (Another model with such layers, run eagerly on another thread during the warm-up,
still could; chatcache's embedders have none.)

Only the one-token step is compiled: a step feeding drafts stays eager. The scheduler's worker
compiles every bucket it can use before its first request (`warm_up`): two graphs, since dynamo
compiles the batch size as a dynamic dimension once it has seen a second one (one row, then one
graph for 2 to 32 rows).

The whole model is one graph, not one decoder layer compiled once and run for all of them
(regional compilation, `nn.Module.compile` on each layer, with the packed product keyed by its
weight so that every layer passed the same guards). That compiled in 9 to 20 s a bucket against
96 to 340 s, but its steps were slower: 504 against 437 ms at 8 rows and 462 against 333 ms at
one row (the bundled model over 300 positions, interleaved medians in one process on 2 cores
under a load average of 8-9), mostly dynamo's guards on each of the 30 layer calls a step (all
but the module guards dropped: 457 and 370 ms, still slower, and unsafe across models).
"""

from __future__ import annotations

import os
import time
import types
from collections.abc import Callable

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from ..config import default_data_dir
from .batch_kv import BatchKV
from .few_rows import use_packed_weights
from .grouped_attention import GROUPED_ATTENTION, use_grouped_attention

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


def without_hub_kernel_routing(model: torch.nn.Module) -> int:
    """Give each of `model`'s layers that the `kernels` package wrapped (`use_kernelized_func`:
    its instances hold `_kernel_funcs`) its class's own forward, and return how many there were.

    The wrapper only routes calls to kernels loaded from the Hugging Face Hub, and chatcache
    loads none: what the layer computes is the same (tests/engine/test_compiled_decode.py)."""
    unwrapped = 0
    for module in model.modules():
        own = getattr(type(module).forward, "__wrapped__", None)
        if own is not None and "_kernel_funcs" in vars(module):
            module.forward = types.MethodType(own, module)
            unwrapped += 1
    return unwrapped


def batch_bucket(rows: int) -> int:
    """The rows a step of `rows` requests is padded to: the smallest bucket that holds them, or `rows` beyond the last."""
    return next((size for size in BATCH_BUCKETS if size >= rows), rows)


class _BucketLayer(CacheLayerMixin):
    """One layer's buffer rows for a bucket; `update` writes each row's new key and value at its column."""

    is_sliding = False
    is_compileable = True
    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers leaves CacheLayerMixin.__init__ unannotated
        self.keys = self.values = self.columns = self.width = torch.empty(0)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("a bucket layer is handed its buffers before every step")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        # An indexed write, which inductor does in place: a scatter was copied whole into a new buffer under dynamic shapes.
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        self.keys[rows, :, self.columns] = key_states[:, :, 0]
        self.values[rows, :, self.columns] = value_states[:, :, 0]
        return self.keys[:, :, : self.width.shape[0]], self.values[:, :, : self.width.shape[0]]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.width.shape[0], 0

    def get_seq_length(self) -> int:
        return self.width.shape[0]

    def get_max_length(self) -> int:
        return -1


class _BucketCache(Cache):
    def __init__(self, layers: int) -> None:
        self.bucket_layers = [_BucketLayer() for _ in range(layers)]
        super().__init__(layers=[*self.bucket_layers])


class CompiledDecode:
    """The one-token decode step of `model` on a `BatchKV`, compiled per batch bucket.

    Args:
        model: the causal LM, on `grouped_attention` (the same products as `sdpa`, which it is
            given if it has that); its `FewRowsLinear` layers read packed weights.

    Raises:
        ValueError: the model's attention is neither.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if model.config._attn_implementation != GROUPED_ATTENTION and not use_grouped_attention(model):
            raise ValueError(f"a compiled decode step needs sdpa attention, not {model.config._attn_implementation!r}")
        # torch sets the variable to its own default (a /tmp folder) when it is imported: only a choice of the user's stays.
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_data_dir() / "inductor")
        use_packed_weights(model)
        without_hub_kernel_routing(model)
        self.model = model
        self._caches: dict[int, _BucketCache] = {}
        self._step: Callable[..., torch.Tensor] = torch.compile(self._logits)

    def warm_up(self, rows: int) -> float:
        """Compile, or load from inductor's cache on disk, the step of every batch bucket that a
        batch of up to `rows` rows uses, so that no request's step pays it; returns the seconds taken.

        Each bucket's step runs once on rows of two positions of KV made for it (a length of one
        would be compiled as a constant, not as the dynamic length every later step has).
        """
        started = time.perf_counter()
        prompt = DynamicCache(config=self.model.config)
        self.model(input_ids=torch.tensor([[0, 0]], device=self.model.device), cache=prompt, use_cache=True)
        for bucket in sorted({batch_bucket(count) for count in range(1, rows + 1)}):
            batch = BatchKV(self.model.config)
            for _ in range(bucket):
                batch.join(prompt, room=1)
            self(batch, [0] * bucket)
        return time.perf_counter() - started

    def __call__(self, batch: BatchKV, next_ids: list[int]) -> torch.Tensor:
        """Write each row's token `next_ids[i]` at its length and return its logits, (rows, 1, vocab)."""
        rows = len(batch)
        bucket = batch_bucket(rows)
        cache = self._caches.setdefault(bucket, _BucketCache(batch.num_layers))
        padding = bucket - rows
        device = self.model.device
        columns = torch.tensor(batch.lengths + [0] * padding, device=device)
        ids = torch.tensor(next_ids + [0] * padding, device=device).unsqueeze(1)
        width = torch.arange(max(batch.lengths) + 1, device=device)  # the columns attended to, as a shape
        torch._dynamo.mark_dynamic(width, 0)
        for layer, (keys, values) in zip(cache.bucket_layers, batch.layer_buffers(bucket, len(width))):
            torch._dynamo.mark_dynamic(keys, 2)  # one graph for every buffer length
            torch._dynamo.mark_dynamic(values, 2)
            layer.keys, layer.values, layer.columns, layer.width = keys, values, columns, width
        return self._step(ids, columns, width, cache)[:rows]

    def _logits(self, ids: torch.Tensor, columns: torch.Tensor, width: torch.Tensor, cache: _BucketCache) -> torch.Tensor:
        mask = (width <= columns[:, None])[:, None, None, :]
        positions = columns[:, None]
        logits: torch.Tensor = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits
        return logits
