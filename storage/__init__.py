"""The session tier: chat sessions, their messages, facts and dialogue state, persisted.

By default everything lives in one SQLite file, `chatcache.db`, in a data directory
(`$CHATCACHE_DATA_DIR`, else `~/.local/share/chatcache`); any SQLAlchemy URL works too.

    from chatcache.storage import SessionStore

    store = SessionStore.open()
    session = store.get_or_create_session("s-42", user_id="ada", bot="travel")
    store.append_message(session.id, "user", "Book me a train to Lyon", token_count=7)

This package never imports the engine, dialogue or app layers.
"""

from chatcache.storage.errors import (
    CorruptDatabaseError,
    InvalidIdError,
    InvalidTextError,
    LeaseLostError,
    SchemaVersionError,
    SessionBusyError,
    SessionClaimedError,
    SessionClosedError,
    SessionExistsError,
    StaleVersionError,
    StorageBusyError,
    StorageConfigError,
    StorageError,
    UnknownSessionError,
)
from chatcache.storage.records import ChatSession, Fact, FactKind, Message, Role, SessionStatus
from chatcache.storage.answers import AnswerEntries, AnswerRecord
from chatcache.storage.audits import AnswerAudits, AuditRecord
from chatcache.storage.engine import ACTIONS_DIR_ENV, actions_data_dir, default_data_dir
from chatcache.storage.leases import Lease, SessionHead
from chatcache.storage.store import DEFAULT_TTL, CommittedTurn, NewFact, SessionStore

__all__ = [
    "ACTIONS_DIR_ENV",
    "AnswerAudits",
    "AnswerEntries",
    "AnswerRecord",
    "AuditRecord",
    "Lease",
    "LeaseLostError",
    "SessionBusyError",
    "SessionHead",
    "DEFAULT_TTL",
    "ChatSession",
    "CommittedTurn",
    "CorruptDatabaseError",
    "Fact",
    "FactKind",
    "InvalidIdError",
    "InvalidTextError",
    "Message",
    "NewFact",
    "Role",
    "SchemaVersionError",
    "SessionClaimedError",
    "SessionClosedError",
    "SessionExistsError",
    "SessionStatus",
    "SessionStore",
    "StaleVersionError",
    "StorageBusyError",
    "StorageConfigError",
    "StorageError",
    "UnknownSessionError",
    "actions_data_dir",
    "default_data_dir",
]
