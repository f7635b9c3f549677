"""A reply stream lets go of its session: a `with` block closes it however the block ends,
closing it mid-reply stops the generation, and a stream nobody reads is closed within its bound.

"Free" is checked as another turn would find it: a second thread's turn on the same session
(which waits on the session's lock for as long as it is held), and a second process on the same
SQLite file taking the session's lease in the database. Every wait is bounded by WAIT_S, far
beyond what a release takes, so a session that is never let go of fails the test instead of
hanging it, and a loaded machine does not make it flaky.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from chatcache import ChatEngine, MemoryConfig, Reply
from chatcache.reply import ReplyStream

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a test bot. Answer briefly."
QUESTION = "Hello there"
WAIT_S = 60.0
ABANDON_S = 1.0  # short, yet far longer than a probe of the lease takes under load

# Another process on the same database: on "try" it takes the session's lease once, at once; on
# "wait" it waits for it as another process's turn would (`TurnLeases.hold`). Either way it lets
# go again and answers "taken" or "held".
LEASE_PROBE = r"""
import sys, uuid
from chatcache.storage import SessionBusyError, SessionStore
store = SessionStore(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "try":
        holder = uuid.uuid4().hex
        taken = store.leases.try_acquire("s", holder) is not None
        if taken:
            store.leases.release("s", holder)
    else:
        try:
            with store.leases.hold("s", wait_s=float(sys.argv[2])):
                taken = True
        except SessionBusyError:
            taken = False
    print("taken" if taken else "held", flush=True)
"""


@pytest.fixture
def lease_probe(store_url: str) -> Iterator[Callable[[str], str]]:
    """`probe("try")` or `probe("wait")`: what a second process finds of the session's lease
    (on SQLite, and on PostgreSQL when the tests have a server: `store_url`)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LEASE_PROBE, store_url, str(WAIT_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def probe(how: str) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(how + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline().strip()
        assert answer in ("taken", "held"), proc.stderr.read() if proc.stderr else answer
        return answer

    try:
        ready = proc.stdout.readline().strip()
        assert ready == "ready", proc.stderr.read() if proc.stderr else ready
        yield probe
    finally:
        proc.stdin.close()
        proc.wait(timeout=WAIT_S)


class TurnInThread:
    """A turn on the session in a thread of its own, started now; `finished` waits for it, bounded."""

    def __init__(self, engine: ChatEngine, text: str) -> None:
        self.reply: Reply | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(engine, text), daemon=True)
        self._thread.start()

    def _run(self, engine: ChatEngine, text: str) -> None:
        try:
            self.reply = engine.chat("s", text, max_new_tokens=4)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            self.error = error

    def finished(self) -> Reply:
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), f"the session was still held after {WAIT_S} s"
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        return self.reply


@pytest.fixture
def engine(tiny_model, make_engine, store_url: str) -> ChatEngine:  # type: ignore[no-untyped-def]
    built: ChatEngine = make_engine(tiny_model, system_prompt=SYSTEM, store=store_url, memory=MemoryConfig(abandon_stream_after_s=ABANDON_S))
    return built


def _roles(engine: ChatEngine) -> list[str]:
    return [m.role for m in engine.sessions.history("s")]


def _read_one_piece_then_leave(engine: ChatEngine, how: str, while_held: Callable[[], object]) -> ReplyStream:
    """A `with` block that takes one piece, calls `while_held`, and is left by `break` or by an
    exception; the stream, closed by the block."""
    try:
        with engine.stream("s", QUESTION, max_new_tokens=200) as stream:
            for _ in stream:
                while_held()
                if how == "break":
                    break
                raise RuntimeError("the reader failed")
    except RuntimeError as error:
        assert how == "raise" and str(error) == "the reader failed"
    return stream


@pytest.mark.parametrize("how", ["break", "raise"])
def test_a_with_block_lets_a_waiting_thread_in(engine: ChatEngine, how: str) -> None:
    """Another thread's turn, queued on the session while the block runs, gets in as it ends."""
    queued: list[TurnInThread] = []
    stream = _read_one_piece_then_leave(engine, how, lambda: queued.append(TurnInThread(engine, "A second question")))
    assert stream.reply is not None and stream.reply.stats.finish_reason == "cancelled"
    queued[0].finished()
    assert _roles(engine) == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("how", ["break", "raise"])
def test_a_with_block_lets_another_process_take_the_lease_at_once(engine: ChatEngine, lease_probe, how: str) -> None:  # type: ignore[no-untyped-def]
    held: list[str] = []
    _read_one_piece_then_leave(engine, how, lambda: held.append(lease_probe("try")))
    assert held == ["held"]  # the turn held the session while the block ran
    assert lease_probe("try") == "taken"  # at its first try: not once the lease ran out


def test_closing_mid_reply_stops_the_generation_and_frees_the_session(engine: ChatEngine, tiny_model, lease_probe) -> None:  # type: ignore[no-untyped-def]
    """A reader in another thread takes one piece; `close` from this thread ends the turn: the
    model's worker runs no request any more, and the reader gets no further piece."""
    took_one, closed = threading.Event(), threading.Event()
    received: list[str] = []
    ended: list[BaseException | None] = []
    stream = engine.stream("s", QUESTION, max_new_tokens=400)

    def read() -> None:
        try:
            for piece in stream:
                received.append(piece)
                took_one.set()
                closed.wait(WAIT_S)
            ended.append(None)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            ended.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert took_one.wait(WAIT_S)
    stream.close()
    assert tiny_model.scheduler.running == 0  # the worker let go of the reply when `close` returned
    closed.set()
    reader.join(WAIT_S)
    assert ended == [None] and len(received) == 1  # the loop ended: no piece after the close
    reply = stream.reply
    assert reply is not None and reply.stats.finish_reason == "cancelled"
    assert reply.text.startswith(received[0]) and len(reply.token_ids) < 400
    stream.close()  # closing again does nothing
    assert lease_probe("try") == "taken"
    TurnInThread(engine, "A second question").finished()


def test_an_abandoned_stream_frees_the_session_within_its_bound(engine: ChatEngine, lease_probe) -> None:  # type: ignore[no-untyped-def]
    """A stream read once, then neither read nor closed but still referenced (so the garbage
    collector cannot help), is closed once no piece was taken for `abandon_stream_after_s`:
    another process waiting for the session gets it, and so does another thread's turn."""
    stream = engine.stream("s", QUESTION, max_new_tokens=200)
    next(stream)
    taken = time.monotonic()
    assert lease_probe("try") == "held"
    assert lease_probe("wait") == "taken"  # another process's turn gets in instead of giving up
    freed_after = time.monotonic() - taken
    assert ABANDON_S <= freed_after < WAIT_S
    TurnInThread(engine, "A second question").finished()
    reply = stream.reply
    assert reply is not None and reply.stats.finish_reason == "cancelled"
    with pytest.raises(StopIteration):
        next(stream)  # closed for the reader who went away
    assert _roles(engine) == ["user", "assistant", "user", "assistant"]


def test_an_async_with_block_frees_the_session(engine: ChatEngine, lease_probe) -> None:  # type: ignore[no-untyped-def]
    async def main() -> Reply | None:
        async with engine.astream("s", QUESTION, max_new_tokens=200) as stream:
            async for _ in stream:
                break
        return stream.reply

    reply = asyncio.run(main())
    assert reply is not None and reply.stats.finish_reason == "cancelled"
    assert lease_probe("try") == "taken"
    TurnInThread(engine, "A second question").finished()


# -- the watcher alone, on a stand-in for a turn -----------------------------------------


class StandInTurn:
    """A turn's generator: yields "a", then waits for `go` before "b"; `released` is set when it
    is closed (where a turn lets go of its session)."""

    def __init__(self) -> None:
        self.go, self.released = threading.Event(), threading.Event()

    def pieces(self) -> Generator[str, None, None]:
        try:
            yield "a"
            self.go.wait(WAIT_S)
            yield "b"
            yield "c"
        finally:
            self.released.set()


def test_a_piece_being_made_is_never_abandoned_however_long_it_takes() -> None:
    """While the reader waits inside `next` for longer than the bound, the stream stays open;
    once the reader stops taking pieces, it is closed within the bound."""
    turn = StandInTurn()
    stream = ReplyStream(turn.pieces(), abandon_after_s=0.2)
    assert next(stream) == "a"
    second: list[str] = []
    reader = threading.Thread(target=lambda: second.append(next(stream)), daemon=True)
    reader.start()
    assert not turn.released.wait(1.0)  # five bounds inside `next`: still in use
    turn.go.set()
    reader.join(WAIT_S)
    assert second == ["b"]
    assert turn.released.wait(WAIT_S)  # then nobody took a piece: closed
    with pytest.raises(StopIteration):
        next(stream)


def test_without_a_bound_a_stream_is_left_to_its_reader() -> None:
    turn = StandInTurn()
    stream = ReplyStream(turn.pieces())
    assert next(stream) == "a"
    assert not turn.released.wait(1.0)
    with stream:
        pass
    assert turn.released.is_set()
