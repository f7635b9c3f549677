"""The token tier: each session's KV cache, kept across turns so a turn prefills only new tokens.

A session's entry holds the token ids exactly as they were fed to the model and the KV for
them. On a new turn the prompt is matched against the entry (or, for a new session, against
the shared system-prompt prefix), the cache is cropped to the longest common prefix and the
caller prefills the rest. At least one prompt token is always left to prefill: the model's
next-token logits come from that forward pass.

Memory is bounded: entries in use are counted with a reservation for the tokens the turn may
add, and idle sessions are evicted by the same LFU+ policy as the answer cache (frequency with
latency-aware decay, plus recency), to disk when a spill directory is set. A spill is an
optimisation: one that fails (full disk, ...) is logged and the KV dropped, so the session's
next turn recomputes it; the turn that caused it goes on. A session's heat is kept only while
its KV is in memory or on disk. Shared prefixes are copied, never lent: `forward` extends the
cache it is given.

A spill file is written outside the tier's lock, by the thread whose turn made the room: a
write takes a few hundred milliseconds for a 1,000-token session, and under the lock it held up
every other turn's checkout and admission control's memory checks (a server's fast refusals
among them). Until its file is written an evicted session's KV still counts as resident, so no
turn starts on memory that is not free yet; that session's own next checkout waits for the file.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers import DynamicCache, PretrainedConfig

from ..model import kv
from .lfu import Heat, LfuPlus
from ..config import TokenTierConfig
from .kv_spill import SpillStore

Prefill = Callable[[list[int], DynamicCache], None]
log = logging.getLogger("chatcache")
RESTORE_RATE_WEIGHT = 0.2  # weight of the newest restore in the measured seconds per byte (a moving average)


@dataclass
class KVEntry:
    """Token ids and the KV computed for exactly those ids."""

    ids: list[int]
    cache: DynamicCache
    nbytes: int


@dataclass
class Checkout:
    """A session's cache for one turn: positions `[0, reused)` of `prompt` are already computed."""

    cache: DynamicCache
    reused: int
    tier: str


@dataclass(frozen=True)
class SessionKV:
    """What the token tier holds for one session now (`TokenTier.session_kv`): where its KV is,
    what it covers and its size, for an operator or a test to see a spill or a restore happen.

    Attributes:
        where: "memory"; "spilling" (evicted, its file being written: it still counts as
            resident); "disk"; or None: nothing (never computed, dropped, or checked out by a
            turn running now).
        ids: the token ids its KV covers, exactly as the model read them; empty with none.
        nbytes: its KV's bytes in memory, or its file's size on disk; 0 with none.
        file: where the tier keeps the session's KV on disk (there while `where` is "disk");
            None without a spill directory.
    """

    where: Literal["memory", "spilling", "disk"] | None
    ids: list[int]
    nbytes: int
    file: Path | None


@dataclass
class TokenTierStats:
    """Counters and sizes for monitoring and the chat app's cache panel."""

    resident_bytes: int = 0
    budget_bytes: int = 0
    sessions_in_memory: int = 0
    sessions_with_heat: int = 0  # those LFU+ keeps a heat of to pick victims by: with KV in memory or on disk
    prefixes: int = 0
    evictions: int = 0
    spills: int = 0
    failed_spills: int = 0
    restores: int = 0
    failed_restores: int = 0
    hits: dict[str, int] = field(default_factory=dict)
    restore_s_per_byte: float | None = None  # what restores from disk took of late (a moving average); None before the first


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for index in range(n):
        if a[index] != b[index]:
            return index
    return n


class TokenTier:
    """Per-session KV caches within a memory budget, with a shared system-prompt prefix store."""

    def __init__(
        self,
        config: TokenTierConfig,
        model_config: PretrainedConfig,
        bytes_per_token: int,
        prefill: Prefill,
        spill_identity: tuple[str, str],
        device: torch.device,
    ) -> None:
        self.config = config
        self._model_config = model_config
        self.bytes_per_token = bytes_per_token
        self._prefill = prefill
        self._device = device
        self._lock = threading.RLock()
        self._memory_freed = threading.Condition(self._lock)  # a turn's KV left memory: waiting turns may fit now
        self._sessions: dict[str, KVEntry] = {}  # LFU+ picks victims: insertion order means nothing
        self._prefixes: OrderedDict[str, KVEntry] = OrderedDict()
        self._in_use: dict[str, int] = {}
        self._spilling: dict[str, KVEntry] = {}  # evicted; their files are being written
        self._heat: dict[str, Heat] = {}
        self._policy = LfuPlus()
        self._stats = TokenTierStats(budget_bytes=config.memory_budget_bytes)
        self._restore_s_per_byte: float | None = None  # measured on restores (a moving average)
        self._spill = (
            SpillStore(Path(config.spill_dir), *spill_identity, config.spill_int8, config.disk_budget_bytes, config.spill_keys)
            if config.spill_dir is not None
            else None
        )

    # -- one turn ---------------------------------------------------------------------

    def checkout(self, session_id: str, prompt: list[int], prefix: list[int], reserve_tokens: int) -> Checkout:
        """Take the session's cache for a turn, cropped to what the prompt shares with it.

        Waits while the turns already in flight leave too little of the budget for this one's
        `reserve_tokens`: the budget holds across every running turn, not only between turns.

        Args:
            session_id: the session; its turns must not overlap (the engine serializes them).
            prompt: the ids the model must have seen before generating.
            prefix: the shared system-prompt ids, used when the session has nothing better.
            reserve_tokens: tokens the turn may add beyond what is cached (prompt plus reply).
        """
        limit = len(prompt) - 1  # leave one token to prefill, even on an exact hit
        reserve = reserve_tokens * self.bytes_per_token
        while True:
            with self._lock:
                # Turns in flight are never cut short, so one that would take memory past the
                # budget even with every idle session evicted waits until an earlier one is done;
                # one whose memory was held since its admission (`reserve`) has it already.
                held = session_id in self._in_use
                while session_id in self._spilling or (not held and not self._has_room(reserve)):
                    self._memory_freed.wait()
                evicted = self._evict_to_fit(keep=session_id, adding=0 if held else reserve)
                if not evicted:
                    self._in_use[session_id] = reserve
                    entry, tier = self._sessions.pop(session_id, None), "session"
                    break
            self._write_out(evicted)  # then room is checked again: another turn may have taken it
        if entry is None and self._spill is not None:
            entry, tier = self._restore(session_id), "disk"
        if entry is not None and self.config.enabled:
            reused = min(common_prefix_length(entry.ids, prompt), limit)
            if reused > 0 and (reused == len(entry.ids) or kv.is_croppable(entry.cache)):
                kv.crop_to(entry.cache, reused)
                return self._count(Checkout(entry.cache, reused, tier))
        if prefix and self.config.enabled:
            shared = self._prefix_entry(prefix)
            reused = min(common_prefix_length(shared.ids, prompt), limit)
            if reused > 0 and (reused == len(shared.ids) or kv.is_croppable(shared.cache)):
                cache = kv.clone(shared.cache, self._model_config)
                kv.crop_to(cache, reused)
                return self._count(Checkout(cache, reused, "prefix"))
        return self._count(Checkout(kv.new_cache(self._model_config), 0, "none"))

    def reusable(self, session_id: str, prompt: list[int], prefix: list[int]) -> int:
        """How many of `prompt`'s tokens a checkout would take from a cache now, taking nothing.

        Admission control's estimate of a turn's prefill before it is let in: the session's KV
        in memory or on disk, else the shared prefix (computed once if it is not yet).
        """
        if not self.config.enabled:
            return 0
        best = max(common_prefix_length(self._held_ids(session_id), prompt), common_prefix_length(prefix, prompt))
        return max(0, min(best, len(prompt) - 1))

    def held_tokens(self, session_id: str) -> int:
        """How many positions of KV the session has now, in memory or on disk (0: none, or in a turn)."""
        return len(self._held_ids(session_id))

    def session_kv(self, session_id: str) -> SessionKV:
        """Where the session's KV is now (memory, being written, disk or nowhere), the ids it
        covers and its size; reads a spilled file's ids, not its tensors, and changes nothing."""
        file = self._spill.path(session_id) if self._spill is not None else None
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is not None:
                return SessionKV("memory", list(entry.ids), entry.nbytes, file)
            entry = self._spilling.get(session_id)
            if entry is not None:
                return SessionKV("spilling", list(entry.ids), entry.nbytes, file)
        if self._spill is None or not (size := self._spill.spilled_bytes(session_id)):
            return SessionKV(None, [], 0, file)
        return SessionKV("disk", list(self._spill.spilled_ids(session_id) or ()), size, file)

    def _held_ids(self, session_id: str) -> Sequence[int]:
        """The ids of the session's KV in memory, being written, or on disk (read without its tensors)."""
        with self._lock:
            entry = self._sessions.get(session_id) or self._spilling.get(session_id)
            if entry is not None:
                return entry.ids
        spilled = self._spill.spilled_ids(session_id) if self._spill is not None else None
        return spilled or []

    def restore_estimate(self, session_id: str) -> float:
        """Seconds a checkout would spend restoring the session's KV from disk, at the rate
        restores took of late; 0 when it is in memory, has nothing on disk, or no restore was
        measured yet. Admission control adds it to a turn's predicted time to first token."""
        if self._spill is None or self._restore_s_per_byte is None:
            return 0.0
        with self._lock:
            if session_id in self._sessions:
                return 0.0
        return self._spill.spilled_bytes(session_id) * self._restore_s_per_byte

    def fits(self, reserve_tokens: int) -> bool:
        """Whether a turn reserving `reserve_tokens` would start now rather than wait for memory (`checkout`)."""
        with self._lock:
            return self._has_room(reserve_tokens * self.bytes_per_token)

    def reserve(self, session_id: str, reserve_tokens: int) -> bool:
        """Hold memory for the session's next turn from now until its checkout, where there is
        room now; False (nothing held) where the turn would wait for memory.

        Admission control decides on a turn a while before it checks its KV out: without the
        hold, a burst of turns would each see the same free memory, all be let in, and then
        wait in `checkout` for one another. `release` lets go of a hold whose turn never runs.
        """
        with self._lock:
            reserve = reserve_tokens * self.bytes_per_token
            if not self._has_room(reserve):
                return False
            self._in_use[session_id] = reserve
            return True

    def checkin(self, session_id: str, ids: list[int], cache: DynamicCache, latency_ms: float = 0.0) -> None:
        """Give a session's cache back after its turn; `ids` are exactly the positions it holds.

        `latency_ms` is what serving the turn's prompt cost (its time to first token): it sets
        how fast the session's heat decays under the LFU+ policy.
        """
        if kv.cached_length(cache) != len(ids):
            raise AssertionError(f"cache holds {kv.cached_length(cache)} positions for {len(ids)} ids")
        with self._lock:
            self._in_use.pop(session_id, None)
            self._memory_freed.notify_all()
            if not self.config.enabled:
                return
            entry = KVEntry(ids=list(ids), cache=cache, nbytes=kv.kv_bytes(cache))
            self._sessions[session_id] = entry
            self._policy.touch(self._heat.setdefault(session_id, Heat()), time.monotonic(), latency_ms)
            evicted = self._evict_to_fit(keep=None)
        self._write_out(evicted)

    def copy_for(self, session_id: str, prompt: list[int]) -> DynamicCache:
        """A private copy of an idle session's KV, as far as `prompt` begins the same (and short
        of its last token, which the model must read), for work beside the conversation
        (prefetch); empty when the session has no KV in memory."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None:
                return kv.new_cache(self._model_config)
            copy, shared = kv.clone(entry.cache, self._model_config), common_prefix_length(entry.ids, prompt)
        kv.crop_to(copy, min(shared, len(prompt) - 1))
        return copy

    def release(self, session_id: str) -> None:
        """Cancel a checkout whose turn failed: nothing is kept, so the next turn recomputes."""
        with self._lock:
            self._in_use.pop(session_id, None)
            self._memory_freed.notify_all()

    def drop(self, session_id: str) -> None:
        """Forget a session everywhere: memory and disk."""
        with self._lock:
            while session_id in self._spilling:  # its file would be written after the discard
                self._memory_freed.wait()
            self._sessions.pop(session_id, None)
            self._heat.pop(session_id, None)
        if self._spill is not None:
            self._spill.discard(session_id)

    def unload(self, session_id: str) -> None:
        """Let go of an idle session's memory: its KV to disk when there is a spill dir, its heat.

        A session in a turn is checked out, not in memory here: its checkin keeps it as usual.
        """
        with self._lock:
            evicted = self._take_out(session_id) if session_id in self._sessions else []
            self._heat.pop(session_id, None)
        self._write_out(evicted)

    def spill_all(self) -> int:
        """Write every idle session to disk (at shutdown), so the next process restores them.

        Returns how many were written; one that fails is logged and recomputed when needed.
        """
        if self._spill is None:
            return 0
        with self._lock:
            written = self._stats.spills
            evicted = [sid for session_id in list(self._sessions) for sid in self._take_out(session_id)]  # a session in a turn is checked out, not here
        self._write_out(evicted)
        with self._lock:
            return self._stats.spills - written

    def clear(self) -> None:
        """Drop every session and prefix from memory (spilled files stay valid)."""
        with self._lock:
            self._sessions.clear()
            self._prefixes.clear()

    # -- memory -------------------------------------------------------------------------

    def _has_room(self, reserve: int) -> bool:
        """Whether a turn reserving `reserve` bytes fits beside the turns in flight, the prefixes
        and the sessions whose files are being written, every idle session evicted; a turn alone
        always starts, whatever its size."""
        held = sum(self._in_use.values()) + sum(e.nbytes for e in self._prefixes.values()) + self._spilling_bytes()
        return not self._in_use or held + reserve <= self.config.memory_budget_bytes

    def _spilling_bytes(self) -> int:
        return sum(e.nbytes for e in self._spilling.values())

    def resident_bytes(self) -> int:
        """KV bytes in memory: idle sessions, prefixes, turns in flight and sessions being written to disk."""
        with self._lock:
            held = sum(e.nbytes for e in self._sessions.values()) + sum(e.nbytes for e in self._prefixes.values())
            return held + sum(self._in_use.values()) + self._spilling_bytes()

    def stats(self) -> TokenTierStats:
        with self._lock:
            self._stats.resident_bytes = self.resident_bytes()
            self._stats.sessions_in_memory = len(self._sessions)
            self._stats.sessions_with_heat = len(self._heat)
            self._stats.restore_s_per_byte = self._restore_s_per_byte
            self._stats.prefixes = len(self._prefixes)
            self._stats.failed_restores = self._spill.rejected if self._spill is not None else 0
            return TokenTierStats(**{**self._stats.__dict__, "hits": dict(self._stats.hits)})

    def _evict_to_fit(self, keep: str | None, adding: int = 0) -> list[str]:
        """Evict idle sessions (coldest by LFU+ first) until everything fits the budget with
        `adding` bytes more once the files being written are done (lock held); returns the
        sessions whose files the caller must write (`_write_out`) after releasing the lock."""
        evicted: list[str] = []
        while self.resident_bytes() - self._spilling_bytes() + adding > self.config.memory_budget_bytes:
            idle = {sid: self._heat[sid] for sid in self._sessions if sid != keep}
            victim = self._policy.victim(idle, time.monotonic())
            if victim is not None:
                evicted.extend(self._take_out(victim))
            elif len(self._prefixes) > 0 and not self._in_use:
                self._prefixes.popitem(last=False)
            else:
                break  # only in-flight turns are left; they are never cut short
        return evicted

    def _take_out(self, session_id: str) -> list[str]:
        """Evict an idle session (lock held): its KV waits in `_spilling` for its file, or is
        dropped without a spill dir. Returns the sessions to write out: it, or none."""
        entry = self._sessions.pop(session_id)
        self._stats.evictions += 1
        if self._spill is None:
            self._heat.pop(session_id, None)  # nothing left to be hot about
            return []
        self._spilling[session_id] = entry
        return [session_id]

    def _write_out(self, session_ids: list[str]) -> None:
        """Write evicted sessions' files (lock not held), then let their memory go."""
        for session_id in session_ids:
            assert self._spill is not None  # only a spill dir gives files to write
            with self._lock:
                entry = self._spilling[session_id]
            try:
                self._spill.save(session_id, entry.ids, kv.to_tensors(entry.cache))
                written = True
            except OSError as exc:
                log.warning("Could not spill a session's KV to %s (%s); its next turn recomputes it", self._spill.directory, exc)
                written = False
            with self._lock:
                del self._spilling[session_id]
                if written:
                    self._stats.spills += 1
                else:
                    self._stats.failed_spills += 1
                    self._heat.pop(session_id, None)  # nothing left to be hot about
                self._memory_freed.notify_all()

    def _restore(self, session_id: str) -> KVEntry | None:
        assert self._spill is not None
        started, file_bytes = time.perf_counter(), self._spill.spilled_bytes(session_id)
        spilled = self._spill.load(session_id, self._device)
        if spilled is None:
            return None
        self._spill.discard(session_id)  # memory is the copy of record again
        cache = kv.from_tensors(self._model_config, spilled.layers)
        if file_bytes:
            rate = (time.perf_counter() - started) / file_bytes
            with self._lock:
                average = self._restore_s_per_byte
                self._restore_s_per_byte = rate if average is None else (1 - RESTORE_RATE_WEIGHT) * average + RESTORE_RATE_WEIGHT * rate
        self._stats.restores += 1
        return KVEntry(ids=spilled.ids, cache=cache, nbytes=kv.kv_bytes(cache))

    def _prefix_entry(self, prefix: list[int]) -> KVEntry:
        key = hashlib.sha256(torch.tensor(prefix, dtype=torch.int64).numpy().tobytes()).hexdigest()
        with self._lock:
            entry = self._prefixes.get(key)
            if entry is not None:
                self._prefixes.move_to_end(key)
                return entry
        cache = kv.new_cache(self._model_config)
        self._prefill(prefix, cache)
        entry = KVEntry(ids=list(prefix), cache=cache, nbytes=kv.kv_bytes(cache))
        with self._lock:
            self._prefixes[key] = entry
            while len(self._prefixes) > self.config.max_prefixes:
                self._prefixes.popitem(last=False)
            evicted = self._evict_to_fit(keep=None)
        self._write_out(evicted)
        return entry

    def _count(self, checkout: Checkout) -> Checkout:
        with self._lock:
            self._stats.hits[checkout.tier] = self._stats.hits.get(checkout.tier, 0) + 1
        return checkout
