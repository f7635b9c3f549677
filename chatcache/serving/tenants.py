"""One engine per tenant on one model, and the session ids clients see.

Each tenant gets its own `ChatEngine` (its sessions' user is the tenant, its answer cache's
scope names the tenant), all on the same loaded model, scheduler, session database and token
tier, so one memory budget holds every tenant's KV and every decode shares one batch. A
client's session id is stored as `TENANT/ID`: two tenants may pick the same id and still
never meet, and no id a client sends can name another tenant's session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from chatcache import TokenTier
from chatcache.storage import SessionStore

from ..engine import ChatEngine
from ..errors import InvalidMessageError

CLIENT_ID_LENGTH = 90  # with the tenant prefix, within the session tier's 128 characters


def stored_id(tenant: str, session_id: str) -> str:
    """The session tier's id of a tenant's session.

    Raises:
        InvalidMessageError: an id a client may not use (empty, too long, or with a control character).
    """
    if not session_id or len(session_id) > CLIENT_ID_LENGTH or not session_id.isprintable():
        raise InvalidMessageError(f"A session id is 1 to {CLIENT_ID_LENGTH} printable characters.")
    return f"{tenant}/{session_id}"


def client_id(tenant: str, stored: str) -> str:
    return stored.removeprefix(f"{tenant}/")


class TenantEngines:
    """The engines of a server, built on first use of each tenant.

    Args:
        build: makes a tenant's engine on the shared model, store and token tier.
        store: the session database every engine writes.
        token_tier: the KV every engine keeps (one budget).
    """

    def __init__(self, build: Callable[[str], ChatEngine], store: SessionStore, token_tier: TokenTier) -> None:
        self._build = build
        self.store = store
        self.token_tier = token_tier
        self._engines: dict[str, ChatEngine] = {}
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> ChatEngine:
        with self._lock:
            engine = self._engines.get(tenant)
            if engine is None:
                engine = self._engines[tenant] = self._build(tenant)
            return engine

    def engines(self) -> list[ChatEngine]:
        with self._lock:
            return list(self._engines.values())

    def close(self) -> None:
        """Stop every engine's background work, spill every idle session's KV, close the database."""
        for engine in self.engines():
            engine.close()
        self.token_tier.spill_all()  # also when no tenant ever came
        self.store.close()
