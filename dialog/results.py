"""Cached results of the actions that only read: tool-call results kept as JSON (design 004, 3.1).

A balance asked for twice in a minute need not reach the core-banking system twice. An action
says how long its result stays true (`@action("balance", cache_ttl_s=10)`); its JSON result is
kept per scope, that is tenant, user, action and arguments, so a customer never sees another's,
until the TTL runs out. An action that changes what others read names them
(`@action("transfer", invalidates=["balance"])`): once it runs, even if it then fails (it may
have moved money before it raised), their results are dropped for every user of the tenant (a
joint account's balance is read by two customers), and the next balance is read afresh. An
action without a TTL (anything that acts) runs every time.

In memory, per engine, bounded in count (least recently used out first) as well as in time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TLRUCache

MAX_RESULTS = 10_000  # results kept at most, over every scope

Scope = tuple[str, str, str, str]  # tenant, user, action, arguments as canonical JSON


@dataclass
class ResultStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    invalidated: int = 0


class ToolResults:
    """Action results by scope, each with its action's TTL.

    Args:
        max_results: results kept at most.
        clock: seconds, monotonic (a test's own clock).
    """

    def __init__(self, max_results: int = MAX_RESULTS, clock: Callable[[], float] = time.monotonic) -> None:
        self._results: TLRUCache[Scope, tuple[dict[str, Any], float]] = TLRUCache(
            maxsize=max_results, ttu=lambda _scope, entry, now: now + entry[1], timer=clock
        )
        self._lock = threading.Lock()  # cachetools caches are not thread-safe
        self.stats = ResultStats()

    @staticmethod
    def scope(tenant: str, user_id: str, action: str, arguments: Mapping[str, str]) -> Scope:
        return tenant, user_id, action, json.dumps(dict(arguments), sort_keys=True)

    def get(self, scope: Scope) -> dict[str, Any] | None:
        """The result kept for `scope`, a copy; None when there is none or it expired."""
        with self._lock:
            entry = self._results.get(scope)
            if entry is None:
                self.stats.misses += 1
                return None
            self.stats.hits += 1
            copy: dict[str, Any] = json.loads(json.dumps(entry[0]))
            return copy

    def put(self, scope: Scope, result: Mapping[str, Any], ttl_s: float) -> None:
        with self._lock:
            self._results[scope] = (json.loads(json.dumps(dict(result))), ttl_s)
            self.stats.stores += 1

    def invalidate(self, tenant: str, actions: Iterable[str]) -> None:
        """Drop every result of `actions` kept for any user of `tenant`."""
        names = set(actions)
        with self._lock:
            stale = [scope for scope in self._results if scope[0] == tenant and scope[2] in names]
            for scope in stale:
                del self._results[scope]
            self.stats.invalidated += len(stale)
