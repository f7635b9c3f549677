"""What a turn returns: the reply text, its token ids and how the cache served it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass, field
from typing import Any

from chatcache.dialog import ActionOutcome, State

from .abandoned_streams import watch
from .worker_threads import close_at_exit

log = logging.getLogger("chatcache")


@dataclass
class TurnStats:
    """How one turn was served.

    Attributes:
        prompt_tokens: tokens the model had to have seen before replying.
        reused_tokens: of those, how many came from a cache (no compute).
        prefilled_tokens: of those, how many were computed this turn.
        generated_tokens: reply tokens.
        ttft_s: seconds from the call to the first reply token.
        total_s: seconds for the whole turn.
        decode_tokens_per_s: reply tokens per second after the first.
        drafted_tokens: tokens drafted for free (from cached answers and the prompt's n-grams) and checked by the
            model in the decode steps it ran anyway; vLLM's draft tokens.
        accepted_tokens: of those, the ones the model wrote itself: each saved a decode step.
        tier: which cache served the prompt: "session" (memory), "disk" (spilled and restored),
            "prefix" (shared system prompt only), "none" (computed from scratch), "dialog"
            (the bot's flow asked for a slot or a confirmation; the model did not run), "answer"
            (the answer cache) or "action" (the flow's action ran; its response is the reply).
        dropped_turns: earlier turns left out of the prompt (to fit the context window, or
            because the topic changed).
        kv_bytes: KV bytes the token tier holds in memory after the turn.
        mean_entropy_bits: mean entropy of the token distributions the reply was drawn from.
        finish_reason: "eos", "length", "stop" (a stop sequence), "cancelled", "flow", "cache" or "action".
        answer_cache_hit: whether the answer came from the answer cache without the model.
        drift: whether this turn was detected as a topic change.
        drift_undone: whether this turn went back to the topic the last drift dropped, which
            came back into the prompt.
        promoted: whether this turn's confirmed intent and slots became session facts.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    tier: str = "none"
    dropped_turns: int = 0
    kv_bytes: int = 0
    mean_entropy_bits: float = 0.0
    finish_reason: str = "eos"
    answer_cache_hit: bool = False
    drift: bool = False
    drift_undone: bool = False
    promoted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reply:
    """One answer: the text shown to the user and the ids the model generated."""

    session_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    stats: TurnStats = field(default_factory=TurnStats)
    intent: str | None = None
    confidence: float | None = None
    dialogue_state: str | None = None
    action: ActionOutcome | None = None  # the flow's action this turn performed, if any

    @property
    def handed_off(self) -> bool:
        """A person has the conversation now: the bot says nothing until it is handed back."""
        return self.dialogue_state == State.HANDED_OFF.value


class ReplyStream:
    """Text pieces of a reply as they are generated; `reply` is set once the stream ends.

    From its first piece until it ends, the turn holds its session: the session's lock (the
    process's other turns on it wait) and its lease in the database (so do other processes').
    Read it in a `with` block, which closes it however the block ends (read to the end, left
    early by `break`, or by an exception), as httpx's `client.stream()` closes its response:

        with engine.stream(session_id, text) as stream:
            for piece in stream:
                print(piece, end="")
        reply = stream.reply

    Closing the stream early (`close`, leaving the `with` block, or dropping the stream) cancels
    the generation; what was generated so far is kept as the reply, and the session is free
    again when `close` returns. Closing again, or after the end, does nothing. `close` from
    another thread waits for the piece being made, then cancels. A stream its reader neither
    reads nor closes is closed for it once no piece was taken for `abandon_after_s` (the
    engine's `MemoryConfig.abandon_stream_after_s`; None never), so a reader that went away
    cannot hold its session for good (`abandoned_streams.py`).
    """

    def __init__(self, turn: Generator[str, None, Reply | None], abandon_after_s: float | None = None) -> None:
        """`turn` yields the reply's pieces and returns the reply, also when it is closed early
        (then it returns what was generated) or None if there is none."""
        self._turn = turn
        self._abandon_after_s = abandon_after_s
        self._step = threading.RLock()  # one piece or the close at a time (the reader's, `close`'s, the watcher's)
        self._taken_at: float | None = None  # monotonic time the reader last took a piece; None before the first
        self._ended = False
        self._reply: Reply | None = None

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> ReplyStream:
        return self

    def __next__(self) -> str:
        with self._step:
            if self._ended:
                raise StopIteration
            try:
                piece = next(self._turn)
            except StopIteration as end:
                self._ended, self._reply = True, end.value
                raise
            except BaseException:  # the turn's error: the turn is over
                self._ended = True
                raise
            first = self._taken_at is None
            self._taken_at = time.monotonic()
        if first and self._abandon_after_s is not None:
            watch(self)  # the turn holds its session from now on
        return piece

    def close(self) -> None:
        """Cancel the generation, keep what was generated as the reply and free the session."""
        with self._step:
            self._end()

    def close_if_abandoned(self, now: float) -> float | None:
        """Close the stream if its reader took no piece for `abandon_after_s` before `now`;
        return when to look again, or None once it is closed or ended (the watcher's call)."""
        assert self._abandon_after_s is not None and self._taken_at is not None
        if not self._step.acquire(blocking=False):
            return now + self._abandon_after_s  # a piece is being made: the reader is there
        try:
            if self._ended:
                return None
            deadline = self._taken_at + self._abandon_after_s
            if now < deadline:
                return deadline
            self._end()
            reply = self.reply
            log.warning(
                "Closed a reply stream nobody read for %.0f s (session %s): the turn keeps what was generated, and the session is free again.",
                self._abandon_after_s, reply.session_id if reply is not None else "unknown",
            )  # fmt: skip
            return None
        finally:
            self._step.release()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        # What `close()` does, except that the turn's return value, its reply, is kept: before
        # Python 3.13 `close()` drops it.
        try:
            self._turn.throw(GeneratorExit())
        except StopIteration as end:
            self._reply = end.value
        except GeneratorExit:
            pass  # the turn had not started, or keeps no reply

    @property
    def reply(self) -> Reply | None:
        """The finished reply, or None while the stream is still running."""
        return self._reply


class AsyncReplyStream:
    """A `ReplyStream` for asyncio code (servers): `async for piece in stream`, never blocking the loop.

    The turn runs in a thread of its own, as `stream()` runs in its caller's, and hands each
    piece to the event loop; a pool shared by every stream would cap how many turns run at
    once (and so batch together) at its size. Cancelling the task that reads, calling
    `aclose`, or dropping the stream cancels the generation at the next token, and what was
    generated so far is kept as the reply, as when a `ReplyStream` is closed early.

    Read it in an `async with` block, which cancels the turn and waits until it has let go of
    its session however the block ends:

        async with engine.astream(session_id, text) as stream:
            async for piece in stream:
                ...

    The turn's thread reads every piece as it comes, whether or not the loop takes them, so a
    stream nobody reads any more ends with its reply (at most `max_new_tokens`), never idles.
    """

    def __init__(self, stream: ReplyStream) -> None:
        self._stream = stream
        self._pieces: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        self._stop = threading.Event()
        self._ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._turn_thread = threading.Thread(
            target=_relay, args=(stream, loop, self._pieces, self._stop, self._ended), name="chatcache-turn", daemon=True
        )
        self._turn_thread.start()
        close_at_exit(self)

    async def __aenter__(self) -> AsyncReplyStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncReplyStream:
        return self

    async def __anext__(self) -> str:
        try:
            item = await self._pieces.get()
        except asyncio.CancelledError:
            self._stop.set()
            raise
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def aclose(self) -> None:
        """Cancel the generation and wait until the turn has recorded what it generated."""
        self._stop.set()
        await self._ended.wait()

    def close(self) -> None:
        """Cancel the generation and wait, blocking, until the turn's thread has ended (at exit:
        that thread runs torch, which must not be running when the interpreter finalizes)."""
        self._stop.set()
        self._turn_thread.join()

    def __del__(self) -> None:
        self._stop.set()

    @property
    def reply(self) -> Reply | None:
        """The finished reply, or None while the stream is still running."""
        return self._stream.reply


def _relay(
    stream: ReplyStream,
    loop: asyncio.AbstractEventLoop,
    pieces: asyncio.Queue[str | BaseException | None],
    stop: threading.Event,
    ended: asyncio.Event,
) -> None:
    """Run the turn in this thread and pass its pieces to the loop (a function of its own, so the
    thread holds no reference to the `AsyncReplyStream` and dropping that stream stops the turn)."""
    item: str | BaseException | None = None
    try:
        for piece in stream:
            if stop.is_set():
                break
            loop.call_soon_threadsafe(pieces.put_nowait, piece)
    except BaseException as error:  # noqa: BLE001 - raised to the reader in the loop
        item = error
    finally:
        stream.close()
    try:
        loop.call_soon_threadsafe(pieces.put_nowait, item)
        loop.call_soon_threadsafe(ended.set)
    except RuntimeError:
        pass  # the loop is closed: nobody is reading any more
