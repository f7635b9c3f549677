"""The audit ledger: what the answer cache's audits have measured, in this process and every replica.

An audit is a served answer the model answered again from scratch (`CachedAnswers.maybe_audit`);
it agreed or it did not. The ledger is the one owner of the tallies: all audits, the wrong ones,
and per scope those of answers found by meaning (an exact repeat is the same question, so it
says nothing about how far the cache may stretch a meaning). With a database, each audit is a
row of `answer_audits` and the tallies are of the whole table, read the way `AnswerCache.sync`
reads entries; every replica then counts the same audits.

It measures and it warns; it does not decide what is served. `breached` tells the lookup that a
scope's audits show its error above `max_error_rate`, and the lookup demotes that scope.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from chatcache.storage import AnswerAudits, AuditRecord
from chatcache.storage.database import SYNC_OVERLAP

from .bound import interval, lower_bound


@dataclass(frozen=True)
class BoundStatus:
    """What the answer cache promises and what its audits have measured so far.

    Attributes:
        max_error_rate: the share of answers served by meaning that may be wrong; None: no bound.
        confidence: how sure the bound is, and the level of `interval`.
        audits, audit_errors: every audit the ledger counted (all replicas'), and those whose
            served answer the model did not give.
        estimate: audit_errors / audits; None before the first audit.
        interval: the two-sided exact (Clopper-Pearson) interval on that error rate at `confidence`.
        semantic_audits, semantic_audit_errors: the same for answers found by meaning, which
            the bound is about.
        scopes_by_meaning, scopes_exact_only: scopes whose calibration certified a point, and
            calibrated scopes that serve exact repeats only (`AnswerCacheStats`).
    """

    max_error_rate: float | None
    confidence: float
    audits: int
    audit_errors: int
    estimate: float | None
    interval: tuple[float, float]
    semantic_audits: int
    semantic_audit_errors: int
    scopes_by_meaning: int
    scopes_exact_only: int


@dataclass
class _Tally:
    audits: int = 0
    errors: int = 0

    def add(self, agreed: bool) -> None:
        self.audits += 1
        self.errors += not agreed


class AuditLedger:
    """Records audits and counts them, with every replica's when they share a database.

    Args:
        max_error_rate: the bound `breached` tests against; None: never breached.
        confidence: the level of `breached`'s test and of `status`'s interval.
        table: the database's audits; None keeps them in this process's memory only.
        clock: aware UTC now, stamped on each audit.
    """

    def __init__(
        self, max_error_rate: float | None, confidence: float, table: AnswerAudits | None, clock: Callable[[], datetime]
    ) -> None:
        self._max_error_rate = max_error_rate
        self._confidence = confidence
        self._table = table
        self._clock = clock
        self._lock = threading.Lock()  # the tallies
        self._reading = threading.Lock()  # one read of the table at a time, so no row is counted twice
        self._all = _Tally()
        self._semantic = _Tally()
        self._by_scope: dict[str, _Tally] = {}  # answers found by meaning only
        self._synced_through = 0  # the highest audit id read from the table
        self._counted: set[int] = set()  # ids counted above `_synced_through - SYNC_OVERLAP`
        self.sync()

    def record(self, scope: str, entry_id: int, exact: bool, similarity: float, agreed: bool) -> None:
        """Count one audit; with a database, store it and count it as it reads the table.

        Reading it back, rather than counting it here too, keeps one path that counts a row:
        a read running at the same time cannot count it a second time. An audit costs a whole
        model answer, so the extra read is nothing beside it.
        """
        if self._table is None:
            with self._lock:
                self._count(scope, exact, agreed)
            return
        self._table.add(AuditRecord(0, scope, entry_id, exact, similarity, agreed, self._clock()))
        self.sync()  # its id is above every id read so far: it was handed out after they were committed

    def sync(self) -> int:
        """Count the audits stored since the last read (other processes', and this one's); how many."""
        if self._table is None:
            return 0
        with self._reading:
            records = self._table.added_after(max(0, self._synced_through - SYNC_OVERLAP))
            with self._lock:
                new = [r for r in records if r.id not in self._counted]
                for record in new:
                    self._count(record.scope, record.exact, record.agreed)
                    self._counted.add(record.id)
                self._synced_through = max([self._synced_through, *(r.id for r in records)])
                floor = self._synced_through - SYNC_OVERLAP
                self._counted = {i for i in self._counted if i > floor}
            return len(new)

    def _count(self, scope: str, exact: bool, agreed: bool) -> None:
        self._all.add(agreed)
        if not exact:
            self._semantic.add(agreed)
            self._by_scope.setdefault(scope, _Tally()).add(agreed)

    def breached(self, scope: str) -> bool:
        """Whether the scope's audits of answers found by meaning show, at the confidence, an error
        rate above `max_error_rate` (the one-sided lower Clopper-Pearson bound is above it).

        Asked after every audit, the test looks again and again, so a scope within its bound is
        flagged more often than 1 - confidence. That costs hits, never errors: a flagged scope
        serves exact repeats only.
        """
        if self._max_error_rate is None:
            return False
        with self._lock:
            tally = self._by_scope.get(scope)
            if tally is None:
                return False
            errors, audits = tally.errors, tally.audits
        return lower_bound(errors, audits, self._confidence) > self._max_error_rate

    def status(self, scopes_by_meaning: int, scopes_exact_only: int) -> BoundStatus:
        """The bound and the audits counted so far, from memory (no database read)."""
        with self._lock:
            audits, errors = self._all.audits, self._all.errors
            semantic = _Tally(self._semantic.audits, self._semantic.errors)
        return BoundStatus(
            max_error_rate=self._max_error_rate,
            confidence=self._confidence,
            audits=audits,
            audit_errors=errors,
            estimate=errors / audits if audits else None,
            interval=interval(errors, audits, self._confidence),
            semantic_audits=semantic.audits,
            semantic_audit_errors=semantic.errors,
            scopes_by_meaning=scopes_by_meaning,
            scopes_exact_only=scopes_exact_only,
        )
