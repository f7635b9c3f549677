"""Reply streams nobody reads any more are closed, so their session is free again.

From its first piece until it ends or is closed, a turn holds its session: the session's lock
(this process's other threads wait on it, without a limit) and its lease in the database (other
processes wait up to the lease wait, while a keeper thread renews it). A reader that stops
reading without closing its stream, and still references it (a client that went away, a loop
abandoned without a `with`), would hold the session for good: the garbage collector never
closes the stream, and the keeper renews the lease for ever. One watcher thread per process
closes every started stream from which no piece was taken for its `abandon_after_s`, as
`ReplyStream.close` would: the turn keeps what was generated and lets go of the session.

It deliberately never interrupts a piece being made: a stream whose reader is inside `next`
(waiting for the session, prefilling, decoding) is in use, however long that takes. A stream
that was never iterated holds nothing, so it is not watched.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from typing import Protocol

from .worker_threads import close_at_exit

log = logging.getLogger("chatcache")


class Watched(Protocol):
    def close_if_abandoned(self, now: float) -> float | None:
        """Close the stream if no piece was taken long enough before `now` (monotonic seconds);
        return when to look again, or None once it is closed or ended."""
        ...


class AbandonedStreams:
    """The watcher: one daemon thread, started with the first stream it watches, that sleeps
    until the earliest moment a watched stream could be abandoned.

    Streams are held weakly, so a stream that is dropped is closed by the garbage collector as
    before and the watcher forgets it.
    """

    def __init__(self) -> None:
        self._streams: weakref.WeakSet[Watched] = weakref.WeakSet()
        self._changed = threading.Condition()
        self._added = False  # a stream was added since the thread last looked
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, stream: Watched) -> None:
        """Close `stream` once it is abandoned; call it once the stream holds its session."""
        with self._changed:
            if self._stopped:
                return  # the interpreter is exiting: every open stream is being closed anyway
            self._streams.add(stream)
            self._added = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chatcache-abandoned-streams", daemon=True)
                self._thread.start()
                # It may be closing a turn (torch) at exit: it ends before the interpreter finalizes.
                close_at_exit(self)
            self._changed.notify()

    def close(self) -> None:
        """Stop watching and wait for the thread (at exit)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            next_look = self._close_abandoned()
            with self._changed:
                if not self._added and not self._stopped:
                    self._changed.wait(None if next_look == math.inf else max(next_look - time.monotonic(), 0.0))
                if self._stopped:
                    return

    def _close_abandoned(self) -> float:
        """Close the abandoned streams; when the next one could be abandoned (inf: none watched).
        A method of its own so that no strong reference outlives it while the thread waits."""
        with self._changed:
            streams = list(self._streams)
            self._added = False  # one added from now on is looked at before the thread waits
        next_look = math.inf
        for stream in streams:
            try:
                look = stream.close_if_abandoned(time.monotonic())
            except Exception:  # noqa: BLE001 - one turn whose clean-up failed stops none of the others
                log.exception("closing an abandoned reply stream failed")
                look = None
            if look is None:
                with self._changed:
                    self._streams.discard(stream)
            else:
                next_look = min(next_look, look)
        return next_look


_watcher = AbandonedStreams()


def watch(stream: Watched) -> None:
    """Close `stream` once no piece was taken from it for its bound (`ReplyStream`)."""
    _watcher.watch(stream)
