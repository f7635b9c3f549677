"""Small operations on a transformers `DynamicCache`: size, copy, crop, and tensors in and out.

Only caches whose layers are all plain `DynamicLayer`s are cropped: a sliding-window or
linear-attention layer cannot give back the states it already dropped, so for those the
token tier reuses a cache only by appending to it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import CacheLayerMixin, DynamicLayer


def new_cache(config: PretrainedConfig) -> DynamicCache:
    return DynamicCache(config=config)


def cached_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def keys_values(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's key and value states.

    `Cache.layers` may also hold linear-attention layers (recurrent state, no keys) and dummy
    layers (no state), and a layer's keys are None until its first update.

    Raises:
        TypeError: the layer holds no key and value states.
    """
    if isinstance(layer, CacheLayerMixin) and layer.keys is not None and layer.values is not None:
        return layer.keys, layer.values
    raise TypeError(f"{type(layer).__name__} holds no key and value states")


def kv_bytes(cache: DynamicCache) -> int:
    """Bytes of key and value states the cache holds (its logical size)."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, CacheLayerMixin) and layer.is_initialized and layer.keys is not None:
            keys, values = keys_values(layer)
            total += keys.numel() * keys.element_size()
            total += values.numel() * values.element_size()
    return total


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Estimate from the config, used before any cache exists (keys and values, all layers)."""
    text = config.get_text_config()
    layers: int = text.num_hidden_layers
    heads: int = text.num_attention_heads
    kv_heads: int = getattr(text, "num_key_value_heads", None) or heads
    head_dim: int = getattr(text, "head_dim", None) or text.hidden_size // heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * kv_heads * head_dim * element


def is_croppable(cache: DynamicCache) -> bool:
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions (transformers 5 crops by a negative count)."""
    excess = cached_length(cache) - length
    if excess > 0:
        cache.crop(-excess)


def to_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [keys_values(layer) for layer in cache.layers]


def from_tensors(config: PretrainedConfig, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    return DynamicCache(ddp_cache_data=tensors, config=config)


def clone(cache: DynamicCache, config: PretrainedConfig) -> DynamicCache:
    """A deep copy: `forward` and `generate` extend the cache they are given."""
    return from_tensors(config, [(k.clone(), v.clone()) for k, v in to_tensors(cache)])
