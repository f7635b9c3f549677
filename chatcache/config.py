"""Engine settings, checked once at construction so a bad value fails early and clearly."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from chatcache.storage import actions_data_dir, default_data_dir

from .errors import ConfigError
from .reply_format import ReplyFormat
from .spill_keys import check_keys, environment_keys, load_spill_keys, read_key_file

__all__ = ["GenerationConfig", "TokenTierConfig", "actions_data_dir", "check_spill_keys", "default_data_dir"]


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
        spill_keys: the keys that sign spilled KV (HMAC-SHA256), newest first: the first signs
            and every one verifies, so a file signed with the previous key is still restored while
            that key is listed second. Each key must be at least 32 bytes. When none are given and
            there is a spill dir, the keys come from `spill_key_file`, else from `CHATCACHE_KV_KEY`
            (plus `CHATCACHE_KV_PREVIOUS_KEY` during a rotation), else from `kv.key` in the data
            directory, which is generated on first use with mode 0600 (`chatcache/spill_keys.py`).
            Replicas sharing a spill dir need the same keys. The keys are never shown in the repr.
        spill_key_file: a file of spill keys, one a line, newest first; not inside `spill_dir`.
    """

    enabled: bool = True
    memory_budget_bytes: int = 1 << 30
    spill_dir: Path | None = None
    spill_int8: bool = False
    disk_budget_bytes: int = 4 << 30
    max_prefixes: int = 8
    spill_keys: tuple[bytes, ...] = field(default=(), repr=False)
    spill_key_file: Path | None = None

    def __post_init__(self) -> None:
        if self.memory_budget_bytes <= 0:
            raise ConfigError(f"memory_budget_bytes must be positive, got {self.memory_budget_bytes}")
        if self.disk_budget_bytes <= 0:
            raise ConfigError(f"disk_budget_bytes must be positive, got {self.disk_budget_bytes}")
        if self.max_prefixes < 1:
            raise ConfigError(f"max_prefixes must be at least 1, got {self.max_prefixes}")
        if self.spill_keys and self.spill_key_file is not None:
            raise ConfigError("Give spill_keys or spill_key_file, not both.")
        if self.spill_key_file is not None:
            self.spill_key_file = Path(self.spill_key_file)
        self.spill_keys = check_keys(self.spill_keys, "spill_keys")
        if self.spill_dir is not None:
            self.spill_dir = Path(self.spill_dir).expanduser()
            if not self.spill_keys:
                self.spill_keys = load_spill_keys(self.spill_dir, self.spill_key_file)


def check_spill_keys(key_file: Path | None) -> None:
    """Read the spill keys a `TokenTierConfig` with this `spill_key_file` would load (the file's,
    else the environment's), so that a short or missing key fails before a server loads its
    model, not minutes later when it builds its token tier. A key the data directory would
    generate on first use is not made here: there is nothing to check yet.

    Raises:
        ConfigError: a key is too short, or the key file is unreadable or holds none.
    """
    if key_file is not None:
        read_key_file(key_file)
    else:
        environment_keys()


def check_compiled_decode(precision: str, compiled_decode: bool) -> None:
    """A compiled decode step is for the exact precision: int8's float64 attention is not
    compiled. Checked by `load_chat_model` and by the server's settings, so that a server
    refuses the pair when it reads its settings.

    Raises:
        ConfigError: int8 with a compiled decode step.
    """
    if compiled_decode and precision == "int8":
        raise ConfigError("compiled_decode (--compiled-decode) is for the exact precision, not int8: its float64 attention is not compiled")


@dataclass
class GenerationConfig:
    """Decoding settings of one turn. Greedy unless a temperature is given.

    `repetition_penalty` (1 is none) lowers the logit of every token among the reply's last
    `REPEAT_WINDOW` tokens, as llama.cpp's and Ollama's default of 1.1 over the last 64 does:
    a positive logit is divided by it, a negative one multiplied. Only the reply's own tokens
    count, so an account number the customer gave may be repeated back. It keeps greedy
    decoding deterministic. It is off by default: on the bundled model it made fewer replies
    end by themselves and none more cacheable (bench/repetition.py), and the answer cache keeps
    only plain greedy answers.

    `reply_format` (a `ReplyFormat`: JSON schema, Lark grammar or regex) lets through only the
    tokens that keep the reply in that format; the answer cache keeps such answers apart.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    repetition_penalty: float = 1.0
    reply_format: ReplyFormat | None = None

    def __post_init__(self) -> None:
        # Type checks first: a string or a float here would fail deep in sampling, and NaN
        # passes every comparison below (`nan < 0` is False).
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be a whole number of at least 1, got {self.max_new_tokens!r}")
        if not _is_finite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature!r}")
        if not _is_finite(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_finite(self.repetition_penalty) or self.repetition_penalty < 1:
            raise ConfigError(f"repetition_penalty must be a number >= 1 (1 is none; below 1 would reward repeating), got {self.repetition_penalty!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ConfigError(f"seed must be a whole number or None, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        if not all(isinstance(s, str) for s in self.stop):
            raise ConfigError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = tuple(s for s in self.stop if s)
        if self.reply_format is not None and not isinstance(self.reply_format, ReplyFormat):
            raise ConfigError(f"reply_format must be a ReplyFormat or None, got {type(self.reply_format).__name__}")


def _is_int(value: object) -> bool:
    """An int that is not a bool (True would pass as 1 reply token)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
    """A real number, not a bool, and neither NaN nor infinite."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class MemoryConfig:
    """How much per-session state the engine keeps in memory.

    Attributes:
        max_sessions_in_memory: sessions kept at once; the least recently used beyond it go.
        idle_seconds: a session unused this long goes.
        sweep_every_s: how often idle sessions are looked for (the count is kept on every open).
        expire_every_s: how often the session tier expires sessions past their TTL.
        abandon_stream_after_s: a reply stream from which no piece was taken this long is closed
            for its reader, who went away (`chatcache/abandoned_streams.py`): the turn keeps
            what was generated, and its session is free for other threads and processes again.
            A minute is far longer than any live reader pauses between pieces (a UI renders one
            in milliseconds, a slow client's socket buffers seconds), and half the time a turn
            in another process waits for the session before giving up (the lease wait, 120 s),
            so a turn queued behind an abandoned one gets in instead of failing. A reader that
            pauses longer on purpose (a tool run between pieces) needs a larger value.
    """

    max_sessions_in_memory: int = 1000
    idle_seconds: float = 1800.0
    sweep_every_s: float = 30.0
    expire_every_s: float = 300.0
    abandon_stream_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_sessions_in_memory < 1:
            raise ConfigError(f"max_sessions_in_memory must be at least 1, got {self.max_sessions_in_memory}")
        if self.idle_seconds <= 0:
            raise ConfigError(f"idle_seconds must be positive, got {self.idle_seconds}")
        if self.sweep_every_s < 0 or self.expire_every_s < 0:
            raise ConfigError("sweep_every_s and expire_every_s must be >= 0")
        if not self.abandon_stream_after_s > 0:  # also refuses NaN
            raise ConfigError(f"abandon_stream_after_s must be positive, got {self.abandon_stream_after_s}")
