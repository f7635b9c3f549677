"""One turn over HTTP: admission, the engine's reply stream, and the response, whole or streamed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from chatcache import CallSyntax

from ..answer_cache import BoundStatus
from ..engine import LeastCost
from ..reply import AsyncReplyStream, Reply, ReplyStream
from . import schemas
from .admission import Overloaded, Ticket
from .errors import ApiError, api_error, error_body
from .server import Server

log = logging.getLogger("chatcache.serve")


async def answer_turn(
    s: Server,
    start: Callable[[Ticket], ReplyStream],
    may_skip_model: Callable[[], bool],
    least: LeastCost,
    body: schemas.Generation,
    release: Callable[[], None],
    session_id: str | None,
    bound: Callable[[], BoundStatus | None],
    calls_in: CallSyntax | None = None,
    before_start: Callable[[], Awaitable[None]] | None = None,
) -> JSONResponse | StreamingResponse:
    """Run one turn: its errors before the first piece are the response; then the answer, whole or streamed.

    Where the reply may call tools (written `calls_in`), a reply that opens a call is held to
    its end and sent as its calls (streamed as one `tool_calls` delta per call); any other
    streams as text.

    While even a turn costing the model only the `least` it can (its new message's prefill, its
    conversation's KV) would be refused, a turn that surely needs the model is refused at once,
    before the engine does any work (its 429 in a few milliseconds); one the answer cache may
    serve goes on, and admission decides once its prefill is known. A turn let in at the door keeps its place in the queue meanwhile.
    `before_start` (a check with I/O, such as the session's existence) runs only for a turn let
    in, before the engine starts it; its error is the response as the engine's would be.
    `bound` is the answer cache's error bound once the turn has ended (`ChatEngine.answer_cache_bound`),
    so the reply carries what the audits measured up to and including this turn's.
    """
    arrived = time.perf_counter()
    ticket = s.admission.ticket()
    refusal = ticket.hold(least.prefill_tokens, least.kv_tokens, least.restore_s)
    if refusal is not None and not may_skip_model():  # cheap and without I/O: no thread to wait for
        release()
        s.metrics.rejections.labels(refusal.reason).inc()
        raise api_error(refusal)
    try:
        if before_start is not None:
            await before_start()
        stream = AsyncReplyStream(start(ticket))
        try:
            first: str | None = await stream.__anext__()
        except StopAsyncIteration:  # no text at all: a message left for the person a session was handed to
            first = None
    except BaseException as error:
        ticket.close()
        release()
        if isinstance(error, Overloaded):
            s.metrics.rejections.labels(error.reason).inc()
        if isinstance(error, asyncio.CancelledError):
            raise
        raise api_error(error) from None
    error_s = ticket.started(time.perf_counter() - arrived)
    cid, model = schemas.completion_id(), s.model_id

    def finish(reply: Reply) -> dict[str, Any]:
        s.metrics.observe_turn(reply, time.perf_counter() - arrived, error_s)
        return schemas.served(reply, session_id, ticket.predicted_s, bound())

    if not body.stream:
        try:
            async with stream:  # a client that went away cancels the turn, which lets go of its session
                if first is not None:
                    async for _ in stream:  # the reply's text is what the turn recorded
                        pass
        finally:
            release()
        reply = stream.reply
        if reply is None:
            raise ApiError(503, "The turn did not finish.", "service_unavailable", "unfinished")
        return JSONResponse(schemas.completion(cid, model, reply, finish(reply), calls_in))

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events() -> AsyncIterator[str]:
        try:
            async with stream:  # however it ends (a client that went away cancels it), the turn lets go of its session
                yield sse(schemas.chunk(cid, model, {"role": "assistant", "content": ""}))
                holds_call = calls_in is not None and first is not None and first.startswith(calls_in.first)  # free text never opens so
                if first is not None and not holds_call:
                    yield sse(schemas.chunk(cid, model, {"content": first}))
                if first is not None:
                    async for piece in stream:
                        if not holds_call:
                            yield sse(schemas.chunk(cid, model, {"content": piece}))
                reply = stream.reply
                if reply is not None:
                    message, reason = schemas.reply_message(reply, calls_in if holds_call else None)
                    if holds_call and "tool_calls" in message:
                        for index, call in enumerate(message["tool_calls"]):
                            yield sse(schemas.chunk(cid, model, {"tool_calls": [{"index": index, **call}]}))
                    elif holds_call:  # a call cut short: its text, as it would have streamed
                        yield sse(schemas.chunk(cid, model, {"content": message["content"]}))
                    yield sse(schemas.chunk(cid, model, {}, reason, chatcache=finish(reply)))
                    if include_usage:
                        yield sse({**schemas.chunk(cid, model, {}), "choices": [], "usage": schemas.usage(reply)})
                yield "data: [DONE]\n\n"
        except Exception as error:  # noqa: BLE001 - the status is sent: the error goes in the stream
            log.exception("turn failed mid-stream")
            yield sse(error_body(f"The turn failed: {error}", "server_error", None))
            yield "data: [DONE]\n\n"
        finally:
            release()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
