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

Only the one-token step is compiled: a step feeding drafts stays eager.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from ..config import default_data_dir
from .batch_kv import BatchKV
from .few_rows import use_packed_weights
from .grouped_attention import GROUPED_ATTENTION, use_grouped_attention

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


def batch_bucket(rows: int) -> int:
    """The rows a step of `rows` requests is padded to: the smallest bucket that holds them, or `rows` beyond the last."""
    return next((size for size in BATCH_BUCKETS if size >= rows), rows)


class _LayerKV:
    """One decoder layer's buffer rows in a step: `update` writes each row's new key and value at its
    column and returns the columns attended to. It ignores the layer number the attention names,
    which would make every layer's graph a different one."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, columns: torch.Tensor, width: torch.Tensor) -> None:
        self.keys, self.values, self.columns, self.width = keys, values, columns, width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        # An indexed write, which inductor does in place: a scatter was copied whole into a new buffer under dynamic shapes.
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        self.keys[rows, :, self.columns] = key_states[:, :, 0]
        self.values[rows, :, self.columns] = value_states[:, :, 0]
        return self.keys[:, :, : self.width.shape[0]], self.values[:, :, : self.width.shape[0]]


class _BucketLayer(CacheLayerMixin):
    """What the model's own (eager) forward asks of a layer's cache around the compiled layers: the
    columns attended to. The buffers are written by the compiled layers, through `_LayerKV`."""

    is_sliding = False
    is_compileable = True

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers leaves CacheLayerMixin.__init__ unannotated
        self.kv = _LayerKV(torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0))
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("a bucket layer is handed its buffers before every step")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        raise AssertionError("a compiled layer writes its KV through the _LayerKV it is handed")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.kv.width.shape[0], 0

    def get_seq_length(self) -> int:
        return self.kv.width.shape[0]

    def get_max_length(self) -> int:
        return -1


class _BucketCache(Cache):
    def __init__(self, layers: int) -> None:
        self.bucket_layers = [_BucketLayer() for _ in range(layers)]
        super().__init__(layers=[*self.bucket_layers])


def _decoder_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: _LayerKV) -> torch.Tensor:
    """One decoder layer's step, the function compiled once for all layers: each layer's weights
    and buffers are inputs of the one graph, not constants of a graph of its own."""
    hidden = layer.forward(hidden, attention_mask=mask, position_embeddings=(cos, sin), cache=kv, use_cache=True)
    return hidden


class CompiledDecode:
    """The one-token decode step of `model` on a `BatchKV`, its decoder layers compiled per batch bucket.

    The decoder layers (the model's `_no_split_modules`, transformers' name for its repeated
    blocks) share one compiled function, so a bucket compiles one layer, not the whole model:
    inductor's compile of the bundled model's 30 layers took 43 to 64 s a bucket, one layer's
    about 1/30 of that. What is around them (embedding, rotary tables, mask, final norm, output
    layer) is the model's own forward, run eagerly: a few dozen small operators a step.

    Args:
        model: the causal LM, on `grouped_attention` (the same products as `sdpa`, which it is
            given if it has that); its `FewRowsLinear` layers read packed weights.

    Raises:
        ValueError: the model's attention is neither, or it names no repeated decoder layer.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if model.config._attn_implementation != GROUPED_ATTENTION and not use_grouped_attention(model):
            raise ValueError(f"a compiled decode step needs sdpa attention, not {model.config._attn_implementation!r}")
        block_names = set(model._no_split_modules or ())
        self.layers = [module for module in model.modules() if type(module).__name__ in block_names]
        if len(self.layers) != model.config.get_text_config().num_hidden_layers:
            raise ValueError(f"a compiled decode step needs the model's decoder layers, not {sorted(block_names)}")
        # torch sets the variable to its own default (a /tmp folder) when it is imported: only a choice of the user's stays.
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_data_dir() / "inductor")
        use_packed_weights(model)
        self.model = model
        self._caches: dict[int, _BucketCache] = {}
        self._layer_step: Callable[..., torch.Tensor] = torch.compile(_decoder_layer)

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
        mask = (width <= columns[:, None])[:, None, None, :]
        torch._dynamo.mark_dynamic(width, 0)  # one graph for every length
        torch._dynamo.mark_dynamic(mask, 3)
        for layer, (keys, values) in zip(cache.bucket_layers, batch.layer_buffers(bucket, len(width))):
            torch._dynamo.mark_dynamic(keys, 2)
            torch._dynamo.mark_dynamic(values, 2)
            layer.kv = _LayerKV(keys, values, columns, width)
        with self._compiled_layers(cache):
            logits: torch.Tensor = self.model(input_ids=ids, attention_mask=mask, position_ids=columns[:, None], cache=cache, use_cache=True).logits
        return logits[:rows]

    @contextmanager
    def _compiled_layers(self, cache: _BucketCache) -> Iterator[None]:
        """Have the model's forward call each decoder layer through the compiled function, for
        this step only: the prefill and a step fed drafts run the same layers eagerly.

        `_compiled_call_impl` is where `nn.Module.compile` puts a module's compiled call, and
        what `nn.Module.__call__` runs instead of the module's forward when it is set.
        """

        def compiled(layer: nn.Module, kv: _LayerKV) -> Callable[..., torch.Tensor]:
            def call(hidden: torch.Tensor, attention_mask: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], **_: object) -> torch.Tensor:
                return self._layer_step(layer, hidden, attention_mask, *position_embeddings, kv)

            return call

        for layer, bucket_layer in zip(self.layers, cache.bucket_layers):
            layer._compiled_call_impl = compiled(layer, bucket_layer.kv)
        try:
            yield
        finally:
            for layer in self.layers:
                layer._compiled_call_impl = None
