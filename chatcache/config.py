"""Engine settings, checked once at construction so a bad value fails early and clearly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage import default_data_dir

from .errors import ConfigError

__all__ = ["GenerationConfig", "TokenTierConfig", "default_data_dir"]


@dataclass
class TokenTierConfig:
    """Settings of the token tier (the per-session KV cache).

    Attributes:
        enabled: reuse KV across turns; off means every turn prefills its whole prompt.
        memory_budget_bytes: ceiling for all KV held in memory (sessions and shared prefixes).
        spill_dir: where cold sessions go; None keeps nothing on disk (evicted KV is dropped).
        spill_int8: quantize spilled KV to int8 (about 3.9x smaller, not bit-exact on restore).
        disk_budget_bytes: ceiling for spilled files; the least recently used go first.
        max_prefixes: how many distinct system-prompt prefixes are kept.
    """

    enabled: bool = True
    memory_budget_bytes: int = 1 << 30
    spill_dir: Path | None = None
    spill_int8: bool = False
    disk_budget_bytes: int = 4 << 30
    max_prefixes: int = 8

    def __post_init__(self) -> None:
        if self.memory_budget_bytes <= 0:
            raise ConfigError(f"memory_budget_bytes must be positive, got {self.memory_budget_bytes}")
        if self.disk_budget_bytes <= 0:
            raise ConfigError(f"disk_budget_bytes must be positive, got {self.disk_budget_bytes}")
        if self.max_prefixes < 1:
            raise ConfigError(f"max_prefixes must be at least 1, got {self.max_prefixes}")
        if self.spill_dir is not None:
            self.spill_dir = Path(self.spill_dir).expanduser()


@dataclass
class GenerationConfig:
    """Decoding settings of one turn. Greedy unless a temperature is given."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(s for s in self.stop if s)
