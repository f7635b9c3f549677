"""The HTTP service: OpenAI's chat completions, a sessions API, metrics, and the web chat page.

One request, top to bottom: authenticate (the API key names the tenant) and take the key's
rate token; pick the tenant's engine and the turn (a session the server keeps, or a message
list the client keeps); run it on the engine with admission control as its `admit` hook, which
refuses (429) a turn that needs the model and cannot start within the TTFT SLO before anything
is recorded; then answer, whole or as server-sent `chat.completion.chunk` events, and observe
the turn in the metrics. Every error a client can cause is a 4xx in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from storage import (
    LeaseLostError,
    SessionBusyError,
    SessionClosedError,
    SessionExistsError,
    StaleVersionError,
    StorageBusyError,
    StorageError,
    UnknownSessionError,
)

from ..config import TokenTierConfig, default_data_dir
from ..engine import ChatEngine, conversation_key
from ..errors import ChatCacheError, InvalidMessageError
from ..model.loading import ChatModel, load_chat_model, load_embedder
from ..reply import AsyncReplyStream, Reply, ReplyStream
from ..steering.hcac import Embed, sentence_embed
from . import schemas
from .admission import AdmissionControl, Overloaded, Ticket
from .keys import ApiKeys, TokenBucket
from .metrics import ServerMetrics
from .settings import ServeSettings
from .tenants import TenantEngines, client_id, stored_id

log = logging.getLogger("chatcache.serve")
DEFAULT_SYSTEM_PROMPT = "You are a helpful, concise assistant."


class ApiError(Exception):
    """A request the server refuses, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.headers = status, kind, code, headers or {}


def _error_body(message: str, kind: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def api_error(error: BaseException) -> ApiError:
    """The 4xx (or 503) a client gets for `error`; anything else is a bug (500)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, Overloaded):
        retry = str(math.ceil(error.retry_after_s))
        return ApiError(429, f"{error} Retry after {retry} s.", "rate_limit_exceeded", error.reason, {"Retry-After": retry})
    if isinstance(error, UnknownSessionError):
        return ApiError(404, "No such session.", "not_found_error", "session_not_found")
    if isinstance(error, SessionClosedError):
        return ApiError(409, "This session has ended; start a new one.", "conflict_error", "session_ended")
    if isinstance(error, (SessionExistsError, SessionBusyError)):
        return ApiError(409, str(error), "conflict_error", "session_conflict")
    if isinstance(error, (StorageBusyError, LeaseLostError, StaleVersionError)):
        return ApiError(503, f"{error} Try again.", "service_unavailable", "storage_busy", {"Retry-After": "1"})
    if isinstance(error, (ChatCacheError, StorageError, ValueError)):
        code = "context_length_exceeded" if "context window" in str(error) else "invalid_request"
        return ApiError(400, str(error), "invalid_request_error", code)
    raise error


@dataclass
class Server:
    """Everything one running server owns; built at startup, closed at shutdown."""

    settings: ServeSettings
    keys: ApiKeys
    chat_model: ChatModel
    model_id: str
    tenants: TenantEngines
    admission: AdmissionControl
    metrics: ServerMetrics
    bucket: TokenBucket | None
    owns_model: bool
    _busy: set[str] = field(default_factory=set)
    _busy_lock: threading.Lock = field(default_factory=threading.Lock)

    def authenticate(self, authorization: str | None) -> tuple[str, str]:
        """The request's tenant and the key that names it, after its rate token was taken."""
        key = authorization.removeprefix("Bearer ").strip() if authorization else None
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            self.metrics.rejections.labels("auth").inc()
            raise ApiError(401, "A valid API key is required: send 'Authorization: Bearer KEY'.", "authentication_error", "invalid_api_key", {"WWW-Authenticate": "Bearer"})
        limiter_key = key or tenant
        if self.bucket is not None and (wait := self.bucket.take(limiter_key)) > 0:
            self.metrics.rejections.labels("rate").inc()
            raise api_error(Overloaded("rate", wait, "This key is over its request rate."))
        return tenant, limiter_key

    def hold_session(self, stored: str) -> Callable[[], None]:
        """Under the `reject` policy, claim the session for one turn (409 while another runs)."""
        if self.settings.busy_session != "reject":
            return lambda: None
        with self._busy_lock:
            if stored in self._busy:
                self.metrics.rejections.labels("session_busy").inc()
                raise ApiError(409, "This session's previous turn is still running.", "conflict_error", "session_busy")
            self._busy.add(stored)

        def release() -> None:
            with self._busy_lock:
                self._busy.discard(stored)

        return release

    def close(self) -> None:
        self.tenants.close()
        if self.owns_model:
            self.chat_model.close()


def build_server(settings: ServeSettings, chat_model: ChatModel | None = None, embedder: str | Embed = "bundled") -> Server:
    """Load the model (unless given), open the database, and make the shared parts every tenant's engine uses."""
    from storage import SessionStore

    keys = settings.keys()
    owns_model = chat_model is None
    model = chat_model or load_chat_model(settings.model)
    store = SessionStore(settings.db) if settings.db else SessionStore.open(default_data_dir())
    token_tier = ChatEngine.build_token_tier(model, TokenTierConfig(spill_dir=default_data_dir() / "kv"))
    needs_embedder = settings.answer_cache or settings.drift or settings.bot is not None
    embed = embedder if callable(embedder) or not needs_embedder else sentence_embed(load_embedder(embedder))
    system_prompt = settings.system_prompt or (None if settings.bot else DEFAULT_SYSTEM_PROMPT)

    def engine_of(tenant: str) -> ChatEngine:
        return ChatEngine(
            model, system_prompt=system_prompt, answer_cache=settings.answer_cache, drift=settings.drift,
            token_tier=token_tier, store=store, bot=settings.bot, user_id=tenant, embedder=embed, tenant=tenant,
        )  # fmt: skip

    tenants = TenantEngines(engine_of, store, token_tier)
    admission = AdmissionControl(model.scheduler, settings.ttft_slo, settings.max_queue)
    metrics = ServerMetrics(model.scheduler, token_tier, tenants.engines, lambda: admission.waiting)
    bucket = TokenBucket(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None
    return Server(settings, keys, model, served_model_id(model.name), tenants, admission, metrics, bucket, owns_model)


def served_model_id(name: str) -> str:
    """The id `/v1/models` lists: the bundled model's own name, a local directory's name, or the hub id."""
    if name == "bundled":
        return "SmolLM2-135M-Instruct"
    path = Path(name)
    return path.name if path.is_dir() else name


def create_app(settings: ServeSettings, chat_model: ChatModel | None = None, embedder: str | Embed = "bundled") -> FastAPI:
    """The FastAPI app; the model loads and the database opens when it starts (its lifespan)."""
    holder: list[Server] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server = await asyncio.to_thread(build_server, settings, chat_model, embedder)
        holder.append(server)
        app.state.server = server  # for operators' and tests' introspection
        await asyncio.to_thread(_warm_up, server)
        try:
            yield
        finally:
            await asyncio.to_thread(server.close)

    app = FastAPI(title="chatcache", version="0.1.0", lifespan=lifespan, max_body_size=settings.max_body_bytes)

    def server() -> Server:
        if not holder:
            raise ApiError(503, "The server is starting.", "service_unavailable", "starting", {"Retry-After": "5"})
        return holder[0]

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(_error_body(str(error), error.kind, error.code), error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in error.errors())
        return JSONResponse(_error_body(f"Invalid request: {problems}", "invalid_request_error", "invalid_request"), 400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse(_error_body(str(error.detail), "invalid_request_error", None), error.status_code, headers=error.headers)

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Alive: the process answers."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Ready: the model is loaded and the session database answers."""
        if not holder:
            return JSONResponse({"status": "starting"}, 503)
        try:
            await asyncio.to_thread(holder[0].tenants.store.count_sessions)
        except StorageError as error:
            return JSONResponse({"status": "database unreachable", "detail": str(error)}, 503)
        return JSONResponse({"status": "ready", "model": holder[0].model_id})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server().metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(authorization: str | None = Header(None)) -> dict[str, Any]:
        s = server()
        s.authenticate(authorization)
        return {"object": "list", "data": [{"id": s.model_id, "object": "model", "created": 0, "owned_by": "chatcache"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: schemas.ChatCompletionRequest,
        authorization: str | None = Header(None),
        x_session_id: str | None = Header(None),
    ) -> JSONResponse | StreamingResponse:
        s = server()
        tenant, _ = s.authenticate(authorization)
        if body.model not in (s.model_id, s.settings.model):
            raise ApiError(404, f"The model {body.model!r} does not exist; this server serves {s.model_id!r}.", "not_found_error", "model_not_found")
        engine = s.tenants(tenant)
        options = body.options(s.settings.max_tokens)
        if x_session_id is not None:  # the server keeps the conversation: only the new message comes
            if len(body.messages) != 1 or body.messages[0].role != "user":
                raise ApiError(400, "With X-Session-Id the server keeps the conversation: send only the new user message.", "invalid_request_error", "invalid_request")
            stored = _stored(tenant, x_session_id)
            new = await asyncio.to_thread(_is_new, s, stored)

            def start(ticket: Ticket) -> ReplyStream:
                return engine.stream(stored, body.messages[0].message().content, **options, admit=ticket.admit)

            def refused() -> None:  # a refused first turn leaves no empty session behind
                if new and not s.tenants.store.messages(stored, limit=1):
                    s.tenants.store.delete_session(stored)

            def cache_may_serve() -> bool:
                return engine.may_answer_without_model(body.messages[0].message().content, session_id=stored, temperature=body.temperature)

            return await _answer(s, start, cache_may_serve, body, s.hold_session(stored), x_session_id, refused)
        messages = [m.message() for m in body.messages]
        key = f"{tenant}:{conversation_key(messages)}"  # no KV shared across tenants, even for equal prompts

        def start_given(ticket: Ticket) -> ReplyStream:
            return engine.complete(messages, kv_key=key, **options, admit=ticket.admit)

        def given_may_skip() -> bool:
            return engine.may_answer_without_model(messages[-1].content, messages=messages, temperature=body.temperature)

        return await _answer(s, start_given, given_may_skip, body, lambda: None, None)

    @app.post("/v1/sessions", status_code=201)
    async def create_session(body: schemas.SessionCreate | None = None, authorization: str | None = Header(None)) -> dict[str, Any]:
        s = server()
        tenant, _ = s.authenticate(authorization)
        wanted = (body.id if body else None) or uuid.uuid4().hex
        session = await asyncio.to_thread(_guarded, lambda: s.tenants(tenant).create_session(_stored(tenant, wanted), body.title if body else None))
        return _session_summary(tenant, session)

    @app.get("/v1/sessions")
    async def list_sessions(authorization: str | None = Header(None), handed_off: bool | None = None) -> dict[str, Any]:
        s = server()
        tenant, _ = s.authenticate(authorization)
        sessions = await asyncio.to_thread(_guarded, s.tenants(tenant).sessions)
        rows = [_session_summary(tenant, session) for session in sessions]
        if handed_off is not None:
            rows = [row for row in rows if row["handed_off"] == handed_off]
        return {"object": "list", "data": rows}

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        s = server()
        tenant, _ = s.authenticate(authorization)
        store = s.tenants.store
        stored = _stored(tenant, session_id)

        def read() -> dict[str, Any]:
            session = store.get_session(stored)
            return {
                **_session_summary(tenant, session),
                "messages": [{"role": m.role.value, "content": m.content, **_turn_figures(m.meta)} for m in store.messages(stored)],
                "facts": [{"kind": f.kind.value, "name": f.name, "value": f.value, "confidence": f.confidence} for f in store.facts(stored)],
            }

        return await asyncio.to_thread(_guarded, read)

    @app.post("/v1/sessions/{session_id}/messages", response_model=None)
    async def session_message(
        session_id: str, body: schemas.SessionMessage, authorization: str | None = Header(None)
    ) -> JSONResponse | StreamingResponse:
        s = server()
        tenant, _ = s.authenticate(authorization)
        stored = _stored(tenant, session_id)
        engine = s.tenants(tenant)
        await asyncio.to_thread(_guarded, lambda: s.tenants.store.get_session(stored))  # 404 before anything runs

        def start(ticket: Ticket) -> ReplyStream:
            return engine.stream(stored, body.content, **body.options(s.settings.max_tokens), admit=ticket.admit)

        def cache_may_serve() -> bool:
            return engine.may_answer_without_model(body.content, session_id=stored, temperature=body.temperature)

        return await _answer(s, start, cache_may_serve, body, s.hold_session(stored), session_id)

    @app.delete("/v1/sessions/{session_id}")
    async def end_session(session_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        s = server()
        tenant, _ = s.authenticate(authorization)
        stored = _stored(tenant, session_id)
        engine = s.tenants(tenant)

        def end() -> dict[str, Any]:
            engine.end_session(stored)
            return _session_summary(tenant, engine.store.get_session(stored))

        return await asyncio.to_thread(_guarded, end)

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(resources.files("chatcache.serving").joinpath("static/chat.html").read_text(encoding="utf-8"))

    return app


def _is_new(s: Server, stored: str) -> bool:
    try:
        s.tenants.store.get_session(stored)
    except UnknownSessionError:
        return True
    return False


def _stored(tenant: str, session_id: str) -> str:
    try:
        return stored_id(tenant, session_id)
    except InvalidMessageError as error:
        raise api_error(error) from None


def _guarded(call: Callable[[], Any]) -> Any:
    """Run a session-tier call, its errors as the client's 4xx."""
    try:
        return call()
    except (StorageError, ChatCacheError) as error:
        raise api_error(error) from None


def _session_summary(tenant: str, session: Any) -> dict[str, Any]:
    dialogue = (session.state or {}).get("dialogue") or {}
    state = dialogue.get("state") if isinstance(dialogue, dict) else None
    return {
        "id": client_id(tenant, session.id),
        "object": "session",
        "title": session.title,
        "status": session.status.value,
        "dialogue_state": state,
        "handed_off": state == "HANDED_OFF",
        "created_at": session.created_at.isoformat(),
        "updated_at": session.updated_at.isoformat(),
    }


def _turn_figures(meta: dict[str, Any] | None) -> dict[str, Any]:
    """What a stored reply says about how it was served (the web page's per-turn figures)."""
    if not meta:
        return {}
    served = {k: meta[k] for k in SERVED_FIGURES if k in meta}
    if isinstance(served.get("ttft_s"), float):
        served["ttft_s"] = round(served["ttft_s"], 4)  # as the live figures show it
    if isinstance(meta.get("token_ids"), list):
        served["generated_tokens"] = len(meta["token_ids"])
    return {"served": served}


SERVED_FIGURES = ("tier", "finish_reason", "ttft_s", "intent", "drift", "reused_tokens", "prefilled_tokens", "answer_cache_hit")


async def _answer(
    s: Server,
    start: Callable[[Ticket], ReplyStream],
    may_skip_model: Callable[[], bool],
    body: schemas.Generation,
    release: Callable[[], None],
    session_id: str | None,
    refused: Callable[[], None] = lambda: None,
) -> JSONResponse | StreamingResponse:
    """Run one turn: its errors before the first piece are the response; then the answer, whole or streamed.

    While even a turn with nothing to prefill would be refused, a turn that surely needs the
    model is refused at once, before the engine does any work (its 429 in a few milliseconds);
    one the answer cache may serve goes on, and admission decides once its prefill is known.
    """
    arrived = time.perf_counter()
    refusal = s.admission.saturated()
    if refusal is not None and not await asyncio.to_thread(may_skip_model):
        release()
        s.metrics.rejections.labels(refusal.reason).inc()
        raise api_error(refusal)
    ticket = s.admission.ticket()
    try:
        stream = AsyncReplyStream(start(ticket))
        try:
            first: str | None = await stream.__anext__()
        except StopAsyncIteration:
            first = None
    except BaseException as error:
        ticket.close()
        release()
        if isinstance(error, Overloaded):
            s.metrics.rejections.labels(error.reason).inc()
            await asyncio.to_thread(refused)
        if isinstance(error, asyncio.CancelledError):
            raise
        raise api_error(error) from None
    error_s = ticket.started(time.perf_counter() - arrived)
    cid, model = schemas.completion_id(), s.model_id

    def finish(reply: Reply) -> dict[str, Any]:
        s.metrics.observe_turn(reply, time.perf_counter() - arrived, error_s)
        return schemas.served(reply, session_id, ticket.predicted_s)

    if not body.stream:
        try:
            async for _ in stream:  # the reply's text is what the turn recorded
                pass
        finally:
            release()
        reply = stream.reply
        if reply is None:
            raise ApiError(503, "The turn did not finish.", "service_unavailable", "unfinished")
        return JSONResponse(schemas.completion(cid, model, reply, finish(reply)))

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events() -> AsyncIterator[str]:
        try:
            yield _sse(schemas.chunk(cid, model, {"role": "assistant", "content": ""}))
            if first:
                yield _sse(schemas.chunk(cid, model, {"content": first}))
            async for piece in stream:
                yield _sse(schemas.chunk(cid, model, {"content": piece}))
            reply = stream.reply
            if reply is not None:
                reason = schemas.FINISH_REASONS.get(reply.stats.finish_reason, "stop")
                yield _sse(schemas.chunk(cid, model, {}, reason, chatcache=finish(reply)))
                if include_usage:
                    yield _sse({**schemas.chunk(cid, model, {}), "choices": [], "usage": schemas.usage(reply)})
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:  # the client went away: the turn keeps what was generated
            await stream.aclose()
            raise
        except Exception as error:  # noqa: BLE001 - the status is sent: the error goes in the stream
            log.exception("turn failed mid-stream")
            yield _sse(_error_body(f"The turn failed: {error}", "server_error", None))
            yield "data: [DONE]\n\n"
        finally:
            release()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _warm_up(server: Server) -> None:
    """One short off-the-record answer, so the scheduler has measured its rates before the first client."""
    from ..model.prompt import Message

    engine = server.tenants(next(iter(sorted(server.keys.tenants))))
    for _ in engine.complete([Message("user", "Hello")], kv_key="warm-up", max_new_tokens=4):
        pass
    engine.token_tier.drop("warm-up")

