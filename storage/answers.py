"""Answer-cache entries in the session database: the record the in-memory index is rebuilt from.

The vector index lives in memory (and in a file that is only a shortcut); this table is the
truth. Embeddings are float32 blobs, so any SQLAlchemy backend stores them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update

from chatcache.storage.database import Database
from chatcache.storage.models import AnswerEntryRow


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """One stored answer, as the answer cache keeps it."""

    id: int
    scope: str
    intent: str | None
    question: str
    normalized: str
    answer: str
    embedding: bytes
    entropy_bits: float
    latency_ms: float
    prefetched: bool
    hits: int
    created_at: datetime
    expires_at: datetime
    last_hit_at: datetime | None


def _record(row: AnswerEntryRow) -> AnswerRecord:
    return AnswerRecord(**{name: getattr(row, name) for name in AnswerRecord.__dataclass_fields__})


class AnswerEntries:
    """Insert, read, touch and delete answer-cache entries."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def add(self, record: AnswerRecord) -> AnswerRecord:
        """Store a new entry; the given `id` is ignored and the stored one returned."""
        values = {name: getattr(record, name) for name in AnswerRecord.__dataclass_fields__ if name != "id"}
        with self._db.transaction() as db:
            row = AnswerEntryRow(**values)
            db.add(row)
            db.flush()
            return _record(row)

    def all(self) -> list[AnswerRecord]:
        with self._db.transaction() as db:
            return [_record(row) for row in db.scalars(select(AnswerEntryRow).order_by(AnswerEntryRow.id))]

    def added_after(self, entry_id: int) -> list[AnswerRecord]:
        """Entries with an id above `entry_id`, oldest first: what other processes stored since."""
        with self._db.transaction() as db:
            query = select(AnswerEntryRow).where(AnswerEntryRow.id > entry_id).order_by(AnswerEntryRow.id)
            return [_record(row) for row in db.scalars(query)]

    def record_hit(self, entry_id: int, at: datetime, expires_at: datetime) -> None:
        with self._db.transaction() as db:
            db.execute(
                update(AnswerEntryRow)
                .where(AnswerEntryRow.id == entry_id)
                .values(hits=AnswerEntryRow.hits + 1, last_hit_at=at, expires_at=expires_at)
            )

    def delete(self, entry_ids: Iterable[int]) -> None:
        ids = list(entry_ids)
        if ids:
            with self._db.transaction() as db:
                db.execute(delete(AnswerEntryRow).where(AnswerEntryRow.id.in_(ids)))

    def clear(self) -> None:
        with self._db.transaction() as db:
            db.execute(delete(AnswerEntryRow))
