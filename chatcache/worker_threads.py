"""Threads that run torch, and turns left open, end before the interpreter finalizes.

Python 3.11 ends a daemon thread that wants the GIL back once finalization has begun with
`pthread_exit`. A thread coming back from a torch operator unwinds through C++ frames that may
not throw, and the whole process aborts ("terminate called without an active exception",
exit 134) after its work was done: a script that ends while a reply is still decoding, or while
the model worker finishes its last step. Every owner of such a thread is closed at exit, before
finalization, while its thread can still end normally. A turn left open (a reply stream the
script never finished or closed) is closed first, as `ReplyStream.close` would: left to
finalization, its clean-up runs torch while the interpreter tears torch down, and aborts too.

What is closed at exit, newest first: a server's turn threads (`AsyncReplyStream`, joined),
the watcher of abandoned streams (joined: it may be closing a turn), turns left open, engines (their idle KV spilled and their database closed, as `close` does),
prefetchers (joined) and the model workers (joined). Our other threads need nothing here: a
lease keeper is joined when its turn ends, and the answer heads' pool is joined by
`concurrent.futures` before any `atexit` function runs.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import weakref
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


log = logging.getLogger("chatcache")

_registered = itertools.count()
_open: weakref.WeakKeyDictionary[Closable, int] = weakref.WeakKeyDictionary()  # owner -> when registered
_open_lock = threading.Lock()  # turns register from any thread


def close_at_exit(owner: Closable) -> None:
    """Close `owner` when the interpreter exits, unless it is gone by then; its `close` must
    end what it runs (join its threads, finish its turn) and may be called again."""
    with _open_lock:
        _open[owner] = next(_registered)


@atexit.register
def _close_open_owners() -> None:
    # Newest first, as atexit does: a turn and an engine's prefetcher end before the model worker they use.
    with _open_lock:
        owners = sorted(_open.items(), key=lambda item: item[1], reverse=True)
    for owner, _ in owners:
        try:
            owner.close()
        except Exception:  # noqa: BLE001 - one that cannot close (a turn running in another thread) stops none of the rest
            log.exception("closing %r at exit failed", owner)
