"""API keys, the tenants they belong to, their roles, and each key's request rate.

A tenant is whose data a request may touch: its sessions and its answer-cache entries. A
key's role says which side of a conversation it speaks for: `customer` (the default) talks
to the bot; `agent` is a person who takes over handed-off conversations, and only an agent's
key may claim one, answer in it or hand it back. An agent's key names its person
(`KEY TENANT agent NAME`): claims and replies are made under that name, so nobody holding
another agent's key can act as them. Keys are compared in constant time, so
response timing says nothing about how much of a guess was right.
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

TENANT = re.compile(r"[A-Za-z0-9_-]{1,32}")
"""A tenant name: it prefixes the tenant's session ids in the database, so it has no separator."""
AGENT_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
"""An agent's name: customers see it beside the agent's replies, and a session's claim stores it (64 characters)."""

DEFAULT_TENANT = "default"  # every request's tenant when no keys are configured
CUSTOMER, AGENT = "customer", "agent"
ROLES = (CUSTOMER, AGENT)


class KeyFileError(ValueError):
    """A key file or `CHATCACHE_API_KEYS` line that is not `KEY TENANT [ROLE [NAME]]`."""


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: its key's tenant and role, and an agent key's person."""

    tenant: str
    role: str
    name: str | None = None  # an agent key's person; None on an open server, where the agent says who they are


OPEN_CALLER = Caller(DEFAULT_TENANT, AGENT)
"""Everyone on a server without keys: with nobody told apart there is nobody to refuse, so the
one open tenant may do everything (a deployment with agents configures keys)."""


@dataclass
class ApiKeys:
    """The configured keys; none configured means an open server with one tenant."""

    _callers: dict[str, Caller] = field(default_factory=dict)

    def add_lines(self, lines: Iterable[str], source: str) -> None:
        """Add `KEY TENANT [ROLE [NAME]]` lines (ROLE `customer`, the default, or `agent`, whose
        NAME is required); blank lines and `#` comments are skipped.

        Raises:
            KeyFileError: a line with another shape, a bad tenant name, role or agent name, an
                agent key without a name, or a key given twice.
        """
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) not in (2, 3, 4):
                raise KeyFileError(f"{source}, line {number}: expected 'KEY TENANT [ROLE [NAME]]', got {len(parts)} fields")
            key, tenant = parts[:2]
            role = parts[2] if len(parts) > 2 else CUSTOMER
            name = parts[3] if len(parts) > 3 else None
            if len(key) < 16:
                raise KeyFileError(f"{source}, line {number}: a key must be at least 16 characters")
            if not TENANT.fullmatch(tenant):
                raise KeyFileError(f"{source}, line {number}: tenant {tenant!r} must be 1-32 of A-Z a-z 0-9 _ -")
            if role not in ROLES:
                raise KeyFileError(f"{source}, line {number}: role {role!r} must be one of {', '.join(ROLES)}")
            if role == AGENT and name is None:
                raise KeyFileError(f"{source}, line {number}: an agent's key names its person ('KEY TENANT agent NAME'): claims and replies are made under that name")
            if name is not None and (role != AGENT or not AGENT_NAME.fullmatch(name)):
                raise KeyFileError(f"{source}, line {number}: a name is given to an agent's key only, 1-64 of A-Z a-z 0-9 _ . @ -")
            if key in self._callers:
                raise KeyFileError(f"{source}, line {number}: this key is already given")
            self._callers[key] = Caller(tenant, role, name)

    @property
    def required(self) -> bool:
        return bool(self._callers)

    @property
    def tenants(self) -> set[str]:
        return {caller.tenant for caller in self._callers.values()} or {DEFAULT_TENANT}

    def caller_of(self, key: str | None) -> Caller | None:
        """The key's tenant and role; None for a missing or unknown key. Without keys, everyone
        is `OPEN_CALLER`."""
        if not self._callers:
            return OPEN_CALLER
        if not key:
            return None
        found = None
        for known, caller in self._callers.items():  # every key compared: the time does not depend on which matched
            if hmac.compare_digest(known.encode(), key.encode()):
                found = caller
        return found


class TokenBucket:
    """`rate` requests per second per key, up to `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._levels: dict[str, tuple[float, float]] = {}  # key: (tokens, when)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take one request's token; returns 0 if there was one, else the seconds until there is."""
        now = time.monotonic()
        with self._lock:
            tokens, when = self._levels.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            if tokens >= 1:
                self._levels[key] = (tokens - 1, now)
                return 0.0
            self._levels[key] = (tokens, now)
            return (1 - tokens) / self.rate
