"""Small operations on a transformers `DynamicCache`: size, copy, crop, and tensors in and out.

Only caches whose layers are all plain `DynamicLayer`s are cropped: a sliding-window or
linear-attention layer cannot give back the states it already dropped, so for those the
token tier reuses a cache only by appending to it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer


def new_cache(config: PretrainedConfig) -> DynamicCache:
    return DynamicCache(config=config)


def cached_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def kv_bytes(cache: DynamicCache) -> int:
    """Bytes of key and value states the cache holds (its logical size)."""
    total = 0
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys is not None:
            total += layer.keys.numel() * layer.keys.element_size()
            total += layer.values.numel() * layer.values.element_size()
    return total


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Estimate from the config, used before any cache exists (keys and values, all layers)."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * text.num_hidden_layers * kv_heads * head_dim * element


def is_croppable(cache: DynamicCache) -> bool:
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions (transformers 5 crops by a negative count)."""
    excess = cached_length(cache) - length
    if excess > 0:
        cache.crop(-excess)


def to_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def from_tensors(config: PretrainedConfig, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    return DynamicCache(ddp_cache_data=tensors, config=config)


def clone(cache: DynamicCache, config: PretrainedConfig) -> DynamicCache:
    """A deep copy: `forward` and `generate` extend the cache they are given."""
    return from_tensors(config, [(k.clone(), v.clone()) for k, v in to_tensors(cache)])
