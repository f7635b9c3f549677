"""The answer cache: a question asked again, in the same context, gets the stored answer.

A lookup runs in order: the scope (model, bot, tenant, dialogue context), an exact match on
the normalised text, a vector search among the scope's questions, the choice of one answer (by
the scope's answer head where it has one, `heads.py`, else by a vote between the answers found:
the best must clear the threshold and beat the nearest *different* answer by a margin), and the
verification checks. Only then is an answer served. Entries are stored
with their question embedding and the mean token entropy of the answer (uncertain answers
are refused), live in the session database and are re-indexed from it at start, expire
after a TTL, and are evicted by the LFU+ policy beyond a count or byte capacity. Processes
sharing one database (replicas behind a router) see each other's answers: a lookup first
indexes what the others stored since its last look, once that look is `sync_interval_s` old,
so an answer stored anywhere is served everywhere within about that interval. An entry one
process evicts leaves the table, and stays in the others' memory until they evict it too or
restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

import numpy as np

from chatcache.storage import AnswerAudits, AnswerEntries, AnswerRecord
from chatcache.storage.database import SYNC_OVERLAP
from chatcache.storage.rules import text_problem

from .audits import AuditLedger, BoundStatus
from .calibration import Calibration
from .config import AnswerCacheConfig
from .decision import OperatingPoint, reach, read
from .index import VectorIndex
from .keys import Scope, normalize
from ..tiers.lfu import Heat, LfuPlus
from .scope_models import Bound, ScopeModels, ScopeRows
from .verify import Verdict, echoes_particulars, verify

Embed = Callable[[list[str]], np.ndarray]
_ENTRY_OVERHEAD = 256  # bytes of bookkeeping per entry, besides text and vector


@dataclass(frozen=True)
class CacheHit:
    """An answer served from the cache and why; `scope` is the key of the scope it was found in."""

    entry_id: int
    answer: str
    question: str
    similarity: float
    exact: bool
    prefetched: bool
    scope: str


@dataclass
class AnswerCacheStats:
    lookups: int = 0
    hits: int = 0
    exact_hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    refused_by_verification: int = 0
    refused_as_ambiguous: int = 0
    refused_by_head: int = 0  # the scope's answer head was not confident enough of any answer
    refused_without_evidence: int = 0  # under a bound, the scope has not certified a point (or its audits breached it)
    scopes_by_meaning: int = 0  # under a bound, scopes whose calibration certified a point
    scopes_exact_only: int = 0  # under a bound, calibrated scopes that serve exact repeats only
    stores: int = 0
    synced: int = 0  # entries other processes stored, indexed here
    refused_high_entropy: int = 0
    evictions: int = 0
    expirations: int = 0
    entries: int = 0
    bytes: int = 0
    scopes: int = 0  # scopes with entries in memory, each with its own index (a follow-up's are many and short-lived)
    prefetched_entries: int = 0
    prefetched_hits: int = 0
    audits: int = 0  # this process's audits (`bound_status` counts every replica's)
    audit_agreements: int = 0
    audit_errors: int = 0  # audits whose served answer the model did not give
    refusal_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


@dataclass
class _Entry:
    record: AnswerRecord
    vector: np.ndarray
    nbytes: int
    heat: Heat
    answer_key: str  # the normalised answer: what the vote groups neighbours by


def _unit_vector(blob: bytes, dim: int) -> np.ndarray | None:
    if len(blob) != 4 * dim:
        return None
    vector = np.frombuffer(blob, dtype=np.float32).copy()
    if not np.isfinite(vector).all() or abs(float(np.linalg.norm(vector)) - 1.0) > 1e-3:
        return None
    return vector


def _now() -> datetime:
    return datetime.now(timezone.utc)


class AnswerCache:
    """Semantic, context-scoped answers with LFU+ eviction, persisted in the session database.

    Args:
        config: thresholds, TTL and capacity.
        embed: texts to unit-normalised rows (the engine passes its sentence embedder).
        entries: the session database's answer table; None keeps the cache in memory only.
        clock: aware UTC now, for TTLs (tests pass a fake one).
        audits: the same database's audit table, so audits are kept and every replica counts
            them (`audits.py`); None keeps them in memory.
    """

    def __init__(
        self,
        config: AnswerCacheConfig,
        embed: Embed,
        entries: AnswerEntries | None = None,
        clock: Callable[[], datetime] = _now,
        policy: LfuPlus | None = None,
        audits: AnswerAudits | None = None,
    ) -> None:
        self.config = config
        self._embed = embed
        self._entries_db = entries
        self._clock = clock
        self._policy = policy or LfuPlus()
        self._lock = threading.RLock()
        self._entries: dict[int, _Entry] = {}
        self._exact: dict[str, dict[str, int]] = {}
        self._indexes: dict[str, VectorIndex] = {}
        self._bytes = 0
        self._next_local_id = 1
        self._dim: int | None = None
        self._synced_through = 0  # the highest entry id read from the table
        self._next_sync = 0.0  # monotonic time of the next look at the table
        self._syncing = threading.Lock()
        self._audits = AuditLedger(config.max_error_rate, config.bound_confidence, audits, clock)
        self.stats = AnswerCacheStats()
        bound = Bound(config.max_error_rate, config.bound_confidence) if config.max_error_rate is not None else None
        heads = config.head_confidence is not None
        self._scopes = (
            ScopeModels(
                self._scope_rows,
                config.head_min_wordings if heads else None,
                bound,
                config.neighbors,
                config.verify,
                min_entries=2 * config.head_min_wordings,
            )
            if heads or bound is not None
            else None
        )
        if entries is not None:
            self._load(entries)

    # -- lookup -------------------------------------------------------------------------

    def lookup(
        self,
        question: str,
        scope: Scope,
        embedding: np.ndarray | None = None,
        intent_scoped: bool = False,
        across_users: bool = False,
        common_words: frozenset[str] = frozenset(),
    ) -> CacheHit | None:
        """The cached answer for `question` in `scope`, or None.

        Args:
            question: the user's text.
            scope: where the answer must be valid.
            embedding: the question's unit embedding if the caller already has it.
            intent_scoped: the scope is a confirmed cacheable intent: a lower threshold applies.
            across_users: the scope is shared by users: an answer found by meaning is refused
                when it repeats particulars of its own question that this one lacks (another
                user's name, say). An exact match is the same question, so it is served.
            common_words: stems that are nobody's particulars (the bot's own words), see `verify.stems`.
        """
        started = time.perf_counter()
        normalized = normalize(question)
        if not normalized:
            return None
        key = scope.key()
        self._catch_up()
        with self._lock:
            self.stats.lookups += 1
            entry_id = self._live_exact(key, normalized)
            if entry_id is not None:
                return self._hit(entry_id, 1.0, exact=True, started=started)
            if key not in self._indexes:
                self.stats.misses += 1
                return None
            point = self._point(key, intent_scoped)
            if point is None:
                self.stats.refused_without_evidence += 1
                self.stats.misses += 1
                return None
        vector = embedding if embedding is not None else self._embed([normalized])[0]
        with self._lock:
            candidates = self._choose(key, vector, point)
            if not candidates:
                self.stats.misses += 1
                return None
            # Every stored wording of the winning answer may vouch for it: serve through the
            # closest one that passes verification, so one odd rewording does not block it.
            verdict = Verdict(False, "echoes another question's particulars")
            for entry_id, similarity in candidates:
                record = self._entries[entry_id].record
                if across_users and echoes_particulars(question, record.question, record.answer, common_words):
                    continue
                verdict = verify(question, record.question) if self.config.verify else Verdict(True)
                if verdict.ok:
                    return self._hit(entry_id, similarity, exact=False, started=started)
            self.stats.refused_by_verification += 1
            reason = verdict.reason.split(":")[0]
            self.stats.refusal_reasons[reason] = self.stats.refusal_reasons.get(reason, 0) + 1
            self.stats.misses += 1
            return None

    def nearest_answers(
        self,
        question: str,
        scope: Scope,
        count: int,
        embedding: np.ndarray | None = None,
        across_users: bool = False,
        common_words: frozenset[str] = frozenset(),
    ) -> list[str]:
        """The distinct answers stored for the `count` questions in `scope` nearest `question`,
        nearest first, however far: not to serve (nothing here is a lookup, and no threshold
        applies) but for the model to draft its own reply from. In a scope users share, an
        answer that repeats particulars of its own question that this one lacks is left out,
        as a lookup leaves it out (`lookup`'s `across_users`).
        """
        normalized = normalize(question)
        key = scope.key()
        self._catch_up()
        with self._lock:
            if not normalized or key not in self._indexes:
                return []
        vector = embedding if embedding is not None else self._embed([normalized])[0]
        answers: list[str] = []
        with self._lock:
            if key not in self._indexes:  # evicted meanwhile
                return []
            for entry_id, _ in self._indexes[key].search(vector, count):
                if not self._alive(entry_id):
                    continue
                record = self._entries[entry_id].record
                if across_users and echoes_particulars(question, record.question, record.answer, common_words):
                    continue
                if record.answer not in answers:
                    answers.append(record.answer)
        return answers

    def contains(self, question: str, scope: Scope) -> bool:
        """Whether this exact (normalised) question already has a live entry in `scope`; not a lookup."""
        self._catch_up()
        with self._lock:
            return self._live_exact(scope.key(), normalize(question)) is not None

    def knows(self, question: str) -> bool:
        """Whether any scope holds this exact (normalised) question, live or expired: without it a
        turn surely has no exact hit. In memory only (no sync with other replicas), so admission
        control's door can ask it of every request while the model is saturated."""
        normalized = normalize(question)
        with self._lock:
            return any(normalized in questions for questions in self._exact.values())

    def _live_exact(self, key: str, normalized: str) -> int | None:
        """The live entry stored for exactly this normalised question in the scope, if any."""
        entry_id = self._exact.get(key, {}).get(normalized)
        return entry_id if entry_id is not None and self._alive(entry_id) else None

    def _point(self, key: str, intent_scoped: bool) -> OperatingPoint | None:
        """How sure a lookup in this scope must be to serve by meaning; None: exact repeats only.

        Under an error bound it is the point the scope's calibration certified (none until it
        has certified one, nor once the scope's audits show its error above the bound). A
        confirmed cacheable intent's scope is the dialogue's: the state machine vouches for the
        meaning, so its own threshold applies, bound or not.
        """
        config = self.config
        if intent_scoped:
            return OperatingPoint(config.intent_similarity_threshold, config.margin, config.head_confidence or 1.0)
        if config.max_error_rate is None:
            return OperatingPoint(config.similarity_threshold, config.margin, config.head_confidence or 1.0)
        calibration = self._scopes.calibration(key) if self._scopes is not None else None
        if calibration is None or self._audits.breached(key):
            return None  # not calibrated yet, or live questions have shown the calibration wrong
        return calibration.point

    def _choose(self, key: str, vector: np.ndarray, point: OperatingPoint) -> list[tuple[int, float]]:
        """Stored wordings of the one answer `vector` asks for that clear `point`, closest first; none when unclear.

        The scope's answer head chooses the answer when it has one and knows the answer of the
        nearest wording (it must be `point.head_confidence` sure); else the neighbours vote and the
        best answer must lead the nearest different one by `point.margin` (`decision.read`).
        """
        head = self._scopes.head(key) if self._scopes is not None else None
        found = [(i, s) for i, s in self._indexes[key].search(vector, reach(self.config.neighbors, head)) if self._alive(i)]
        reading = read(found, lambda entry_id: self._entries[entry_id].answer_key, head, vector, self.config.neighbors)
        if reading is None:
            return []
        wordings = reading.wordings_from(point.threshold)
        if wordings and not reading.admits(point):
            if reading.head_probability is not None:
                self.stats.refused_by_head += 1
            else:
                self.stats.refused_as_ambiguous += 1
            return []
        return wordings

    def _alive(self, entry_id: int) -> bool:
        entry = self._entries.get(entry_id)
        if entry is None:
            return False
        if entry.record.expires_at <= self._clock():
            self._remove([entry_id])
            self.stats.expirations += 1
            return False
        return True

    def _hit(self, entry_id: int, similarity: float, exact: bool, started: float) -> CacheHit:
        """Count a hit; `started` is when the lookup began, so the entry's heat decays by what serving it cost."""
        entry = self._entries[entry_id]
        now = self._clock()
        expires = now + timedelta(seconds=self.config.ttl_s) if self.config.sliding_ttl else entry.record.expires_at
        entry.record = replace(entry.record, hits=entry.record.hits + 1, last_hit_at=now, expires_at=expires)
        if self._entries_db is not None and self.config.sliding_ttl:
            self._entries_db.record_hit(entry_id, now, expires)
        self._policy.touch(entry.heat, now.timestamp(), latency_ms=(time.perf_counter() - started) * 1000)
        self.stats.hits += 1
        self.stats.exact_hits += exact
        self.stats.semantic_hits += not exact
        self.stats.prefetched_hits += entry.record.prefetched
        record = entry.record
        return CacheHit(entry_id, record.answer, record.question, similarity, exact, record.prefetched, record.scope)

    # -- store --------------------------------------------------------------------------

    def store(
        self,
        question: str,
        answer: str,
        scope: Scope,
        entropy_bits: float,
        latency_ms: float,
        embedding: np.ndarray | None = None,
        intent: str | None = None,
        prefetched: bool = False,
        overwrite: bool = False,
    ) -> bool:
        """Cache `answer` for `question` in `scope`; False when it is refused or already there.

        With `overwrite`, an entry for the same normalised question in the scope is overwritten
        (LangChain's cache contract) instead of kept.
        """
        normalized = normalize(question)
        if not normalized or not answer.strip() or text_problem(question) or text_problem(answer):
            return False  # nothing to key, or text the database cannot store (a NUL, a lone surrogate)
        if entropy_bits > self.config.max_entropy_bits:
            with self._lock:
                self.stats.refused_high_entropy += 1
            return False
        key = scope.key()
        with self._lock:
            existing = self._live_exact(key, normalized)
            if existing is not None:
                if not overwrite:
                    return False
                self._remove([existing])
        vector = np.asarray(embedding if embedding is not None else self._embed([normalized])[0], dtype=np.float32)
        now = self._clock()
        record = AnswerRecord(
            id=0,
            scope=key,
            intent=intent,
            question=question,
            normalized=normalized,
            answer=answer,
            embedding=vector.tobytes(),
            entropy_bits=entropy_bits,
            latency_ms=latency_ms,
            prefetched=prefetched,
            hits=0,
            created_at=now,
            expires_at=now + timedelta(seconds=self.config.ttl_s),
            last_hit_at=None,
        )
        with self._lock:
            if self._entries_db is not None:
                record = self._entries_db.add(record)
            else:
                record = replace(record, id=self._next_local_id)
                self._next_local_id += 1
            self._insert(record, vector)
            self.stats.stores += 1
            self._evict_to_fit()
        return True

    def _insert(self, record: AnswerRecord, vector: np.ndarray) -> None:
        nbytes = len(record.question.encode()) + len(record.answer.encode()) + vector.nbytes + _ENTRY_OVERHEAD
        heat = Heat(frequency=1.0, last_used=record.created_at.timestamp())
        self._entries[record.id] = _Entry(record, vector, nbytes, heat, normalize(record.answer))
        self._exact.setdefault(record.scope, {})[record.normalized] = record.id
        index = self._indexes.get(record.scope)
        if index is None:
            index = self._indexes[record.scope] = VectorIndex(vector.shape[0])
        index.add(record.id, vector)
        self._bytes += nbytes
        if self._scopes is not None:
            self._scopes.changed(record.scope, len(index))

    def _remove(self, entry_ids: list[int]) -> None:
        """Drop entries from memory and, in one transaction, from the database."""
        for entry_id in entry_ids:
            entry = self._entries.pop(entry_id)
            scope = entry.record.scope
            exact = self._exact[scope]
            if exact.get(entry.record.normalized) == entry_id:
                del exact[entry.record.normalized]
            index = self._indexes[scope]
            index.remove(entry_id)
            if not exact and not len(index):  # follow-up scopes are many and short-lived
                del self._exact[scope], self._indexes[scope]
            if self._scopes is not None:
                self._scopes.changed(scope, len(index))
            self._bytes -= entry.nbytes
        if self._entries_db is not None and entry_ids:
            self._entries_db.delete(entry_ids)

    def _evict_to_fit(self) -> None:
        """Pick the coldest entries until the rest fits, then remove them in one go."""
        def over(count: int, nbytes: int) -> bool:
            return count > self.config.max_entries or nbytes > self.config.max_bytes

        count, nbytes, victims = len(self._entries), self._bytes, []
        if not over(count, nbytes):
            return
        now = self._clock().timestamp()
        heats = {entry_id: entry.heat for entry_id, entry in self._entries.items()}
        while over(count, nbytes):
            victim = self._policy.victim(heats, now)
            if victim is None:
                break
            del heats[victim]
            victims.append(victim)
            count, nbytes = count - 1, nbytes - self._entries[victim].nbytes
        self._remove(victims)
        self.stats.evictions += len(victims)

    # -- upkeep -------------------------------------------------------------------------

    def _load(self, entries: AnswerEntries) -> None:
        """Re-index every live entry from the database.

        Expired entries, and any whose stored embedding is not a unit vector of the embedder's
        size (a corrupted blob), are deleted: a damaged index is rebuilt, never served from.
        """
        records = entries.all()
        if not records:
            return
        dim = self._dimension()
        now = self._clock()
        dropped = []
        for record in records:
            vector = _unit_vector(record.embedding, dim)
            if record.expires_at <= now or vector is None:
                dropped.append(record.id)
                continue
            self._insert(record, vector)
        self._synced_through = records[-1].id
        entries.delete(dropped)
        self._evict_to_fit()

    def sync(self) -> int:
        """Index the live entries other processes stored since the last look; how many were new here.

        An entry for a question this process already holds in the same scope is left out (two
        replicas that answered it at once), as is a damaged one (its vector is not a unit vector
        of the embedder's size; the next start deletes it). The audits other processes stored
        are counted too.
        """
        self._audits.sync()
        if self._entries_db is None:
            return 0
        records = self._entries_db.added_after(max(0, self._synced_through - SYNC_OVERLAP))
        if not records:
            return 0
        dim = self._dimension()
        added = 0
        with self._lock:
            now = self._clock()
            for record in records:
                self._synced_through = max(self._synced_through, record.id)
                if record.id in self._entries or record.expires_at <= now:
                    continue
                if self._live_exact(record.scope, record.normalized) is not None:
                    continue
                vector = _unit_vector(record.embedding, dim)
                if vector is not None:
                    self._insert(record, vector)
                    added += 1
            self.stats.synced += added
            self._evict_to_fit()
        return added

    def _catch_up(self) -> None:
        """`sync`, when the last look at the table is `sync_interval_s` old and no other thread is looking."""
        if self._entries_db is None or not self.config.sync_interval_s:
            return
        now = time.monotonic()
        if now < self._next_sync or not self._syncing.acquire(blocking=False):
            return
        try:
            self._next_sync = now + self.config.sync_interval_s
            self.sync()
        finally:
            self._syncing.release()

    def calibrate(self) -> None:
        """Fit every scope's answer head, and under an error bound its calibration, on its current entries now.

        They otherwise follow the entries in the background, refitted once a scope has changed by
        a tenth, so right after a bulk load a lookup may still be judged by an older head, and
        under a bound a new scope serves exact repeats only until its calibration is done.
        """
        if self._scopes is not None:
            with self._lock:  # a scope too small for a head has none: no need to read its rows
                keys = [key for key, index in self._indexes.items() if len(index) >= 2 * self.config.head_min_wordings]
            self._scopes.fit_now(keys)

    def calibration(self, scope: Scope) -> Calibration | None:
        """What the scope's calibration certified under the bound, as of its last fit; None before one."""
        return self._scopes.calibration(scope.key()) if self._scopes is not None else None

    def _scope_rows(self, key: str) -> ScopeRows:
        """The scope's live entries, for its answer head and calibration."""
        with self._lock:
            now = self._clock()
            live = [e for e in self._entries.values() if e.record.scope == key and e.record.expires_at > now]
            if not live:
                return ScopeRows(np.zeros((0, self._dim or 1), dtype=np.float32), [], [])
            return ScopeRows(
                np.stack([e.vector for e in live]), [e.answer_key for e in live], [e.record.question for e in live]
            )

    def _dimension(self) -> int:
        if self._dim is None:
            self._dim = int(self._embed(["dimension probe"]).shape[1])
        return self._dim

    def purge_expired(self) -> int:
        with self._lock:
            now = self._clock()
            expired = [i for i, e in self._entries.items() if e.record.expires_at <= now]
            self._remove(expired)
            self.stats.expirations += len(expired)
            return len(expired)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._exact.clear()
            self._indexes.clear()
            if self._scopes is not None:
                self._scopes.clear()
            self._bytes = 0
            if self._entries_db is not None:
                self._entries_db.clear()

    def record_audit(self, hit: CacheHit, agreed: bool) -> None:
        """Count an audit of `hit`: whether the model, asked the question from scratch, gave the served answer."""
        with self._lock:
            self.stats.audits += 1
            self.stats.audit_agreements += agreed
            self.stats.audit_errors += not agreed
        self._audits.record(hit.scope, hit.entry_id, hit.exact, hit.similarity, agreed)

    def bound_status(self) -> BoundStatus:
        """The bound, the scopes it lets serve by meaning, and what every replica's audits measured:
        from memory, cheap enough for every turn."""
        with self._lock:
            return self._audits.status(*self._scope_counts())

    def _scope_counts(self) -> tuple[int, int]:
        """Under a bound, how many scopes serve by meaning and how many exact repeats only (0, 0 without one)."""
        if self.config.max_error_rate is None or self._scopes is None:
            return 0, 0
        by_meaning = self._scopes.certified_scopes()
        return by_meaning, len(self._indexes) - by_meaning

    def snapshot(self) -> AnswerCacheStats:
        with self._lock:
            self.stats.entries = len(self._entries)
            self.stats.bytes = self._bytes
            self.stats.scopes = len(self._indexes.keys() | self._exact.keys())
            self.stats.prefetched_entries = sum(e.record.prefetched for e in self._entries.values())
            self.stats.scopes_by_meaning, self.stats.scopes_exact_only = self._scope_counts()
            return replace(self.stats, refusal_reasons=dict(self.stats.refusal_reasons))
