"""Answer-cache audits in the session database: served answers the model answered again.

Every replica writes the audits it runs here and reads the others', so the error the audits
measure is the deployment's, not one process's. Rows are only added: an audit is evidence
about decisions already made, and stays when the entry it checked is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from chatcache.storage.database import Database
from chatcache.storage.models import AnswerAuditRow


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit: the served entry, how it was found, and whether the model's own answer agreed."""

    id: int
    scope: str
    entry_id: int
    exact: bool
    similarity: float
    agreed: bool
    audited_at: datetime


def _record(row: AnswerAuditRow) -> AuditRecord:
    return AuditRecord(**{name: getattr(row, name) for name in AuditRecord.__dataclass_fields__})


class AnswerAudits:
    """Insert and read answer-cache audits."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def add(self, record: AuditRecord) -> AuditRecord:
        """Store a new audit; the given `id` is ignored and the stored one returned."""
        values = {name: getattr(record, name) for name in AuditRecord.__dataclass_fields__ if name != "id"}
        with self._db.transaction() as db:
            row = AnswerAuditRow(**values)
            db.add(row)
            db.flush()
            return _record(row)

    def added_after(self, audit_id: int) -> list[AuditRecord]:
        """Audits with an id above `audit_id`, oldest first: what other processes stored since."""
        with self._db.transaction() as db:
            query = select(AnswerAuditRow).where(AnswerAuditRow.id > audit_id).order_by(AnswerAuditRow.id)
            return [_record(row) for row in db.scalars(query)]
