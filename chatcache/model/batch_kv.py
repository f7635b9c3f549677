"""The KV of every request being decoded, as one batch: a row per request, written in place.

Decoding one token for eight sessions costs little more than for one (the weights are read
once per step), but the sessions' caches differ in length. Copying them into a padded batch
every step would move all their KV per token, so `BatchKV` keeps the batch: each request's
KV is copied into a row once when it starts decoding and copied out once when it ends. Rows
are right-padded: a row's next token is written at its own length, and an attention mask
hides the unwritten columns, so rows never move while others join or leave (the last row
fills a gap a leaving row leaves, one row's copy). Buffers grow by whole blocks of positions,
so a step writes one column instead of concatenating the whole cache as `DynamicLayer` does;
rows double when one is missing. A step may feed each row several tokens (the scheduler's
drafts): they are written from the row's length on and each sees the row's KV up to itself;
`end_step` then keeps as many of them as the row accepted, and the columns past that stay
masked until a later step writes over them, so a rejected token leaves nothing a row reads. The buffers are freed when the last row leaves, so their
size follows the busiest moment since the batch was last empty, not the busiest ever.

Only models whose cache layers are all plain `DynamicLayer`s are batched (`kv.is_croppable`):
sliding-window and linear-attention layers keep state a row copy cannot carry.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin

from .kv import from_tensors, keys_values

BLOCK = 256  # positions a buffer grows by


class _RowLayer(CacheLayerMixin):
    """One layer's keys and values for every row; `update` writes each row's new token at its length."""

    is_sliding = False
    is_compileable = False
    keys: torch.Tensor  # allocated from the start: never the base class's None
    values: torch.Tensor

    def __init__(self, batch: BatchKV) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers leaves CacheLayerMixin.__init__ unannotated
        self._batch = batch
        self.keys = torch.empty(0)
        self.values = torch.empty(0)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("a batch layer is allocated when its first row joins")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        rows, columns, width = self._batch.step_indices()
        # (rows, heads, fed, dim) written at (row, column) for each fed token: indexed as (rows, fed, heads, dim)
        self.keys[rows[:, None], :, columns] = key_states.transpose(1, 2)
        self.values[rows[:, None], :, columns] = value_states.transpose(1, 2)
        return self.keys[: len(rows), :, :width], self.values[: len(rows), :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._batch.step_indices()[2], 0

    def get_seq_length(self) -> int:
        return max(self._batch.lengths, default=0)

    def get_max_length(self) -> int:
        return -1


class BatchKV(Cache):
    """The rows being decoded; row `i` holds `lengths[i]` positions.

    Args:
        config: the model's config (layer count).
    """

    def __init__(self, config: PretrainedConfig) -> None:
        self.num_layers = config.get_text_config().num_hidden_layers
        # The same layers as `self.layers`, which `Cache` types as any kind of layer.
        self._row_layers = [_RowLayer(self) for _ in range(self.num_layers)]
        super().__init__(layers=[*self._row_layers])
        self.lengths: list[int] = []
        self._rows = torch.empty(0, dtype=torch.long)
        self._columns = torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.lengths)

    def join(self, cache: DynamicCache, room: int) -> int:
        """Copy `cache` into a new last row with space for `room` more positions; returns the row."""
        length = int(cache.get_seq_length())
        row = len(self.lengths)
        self._reserve(row + 1, length + room, cache)
        for layer, source in zip(self._row_layers, cache.layers):
            keys, values = keys_values(source)
            layer.keys[row, :, :length] = keys[0]
            layer.values[row, :, :length] = values[0]
        self.lengths.append(length)
        return row

    def leave(self, row: int, config: PretrainedConfig) -> tuple[DynamicCache, int | None]:
        """Take row `row` out as a cache of its own; the last row moves into its place.

        Returns the row's cache and the old index of the row that moved into `row`, if any.
        """
        length = self.lengths[row]
        tensors = [(layer.keys[row, :, :length].unsqueeze(0).clone(), layer.values[row, :, :length].unsqueeze(0).clone()) for layer in self._row_layers]
        last = len(self.lengths) - 1
        moved = None
        if row != last:
            moved_length = self.lengths[last]
            for layer in self._row_layers:
                layer.keys[row, :, :moved_length] = layer.keys[last, :, :moved_length]
                layer.values[row, :, :moved_length] = layer.values[last, :, :moved_length]
            self.lengths[row] = moved_length
            moved = last
        self.lengths.pop()
        if not self.lengths:  # the buffers are sized for the largest batch yet: an idle batch holds nothing
            for layer in self._row_layers:
                layer.keys, layer.values = torch.empty(0), torch.empty(0)
        return from_tensors(config, tensors), moved

    def begin_step(self, fed: int = 1) -> torch.Tensor:
        """Fix where this step writes `fed` tokens per row (from each row's length on); returns
        the attention mask for it, under which each token sees its row's KV up to itself."""
        count = len(self.lengths)
        self._reserve(count, max(self.lengths) + fed)
        self._rows = torch.arange(count)
        self._columns = torch.tensor(self.lengths, dtype=torch.long).unsqueeze(1) + torch.arange(fed)
        width = max(self.lengths) + fed
        visible = torch.arange(width) <= self._columns.unsqueeze(2)
        return visible.unsqueeze(1)  # (rows, heads, query, key), True where a row's token attends

    def end_step(self, kept: list[int]) -> None:
        """Keep the first `kept[i]` tokens row `i` was fed this step (at least one)."""
        self.lengths = [length + k for length, k in zip(self.lengths, kept, strict=True)]

    def step_indices(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self._rows, self._columns, int(self._columns.max()) + 1

    def positions(self) -> torch.Tensor:
        """Each row's positions for the tokens fed this step: the columns `begin_step` writes them at."""
        return self._columns

    def layer_buffers(self, rows: int, positions: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values, the first `rows` rows of the buffers grown to hold `rows`
        rows and `positions` positions: the fixed shapes a compiled step writes into in place."""
        self._reserve(rows, positions)
        return [(layer.keys[:rows], layer.values[:rows]) for layer in self._row_layers]

    def _reserve(self, rows: int, positions: int, like: DynamicCache | None = None) -> None:
        """Grow every buffer to at least `rows` rows and `positions` positions, keeping what they
        hold; the layers' shapes and dtype are those of the buffers, or of `like` before there are any."""
        first = self._row_layers[0].keys
        have_rows, have_positions = (first.shape[0], first.shape[2]) if first.dim() == 4 else (0, 0)
        if rows <= have_rows and positions <= have_positions:
            return
        # Rows double only when a row is missing: doubling them when only positions ran out
        # grew a server's buffers past 12 GB (rows x positions, never given back).
        new_rows = have_rows if rows <= have_rows else max(rows, 2 * have_rows)
        new_positions = max(have_positions, -(-positions // BLOCK) * BLOCK)
        shaped_like = self._row_layers if first.dim() == 4 or like is None else like.layers
        for layer, source in zip(self._row_layers, shaped_like):
            keys, _ = keys_values(source)
            _, heads, _, head_dim = keys.shape
            for name in ("keys", "values"):
                old = getattr(layer, name)
                grown = torch.zeros(new_rows, heads, new_positions, head_dim, dtype=keys.dtype, device=keys.device)
                if old.dim() == 4:
                    grown[: old.shape[0], :, : old.shape[2]] = old
                setattr(layer, name, grown)
