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
import gc
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from chatcache import ChatModel, Embed
from chatcache.dialog import State
from chatcache.storage import ChatSession, SessionClaimedError, SessionStore, StorageError

from ..engine import ChatEngine, Sessions, conversation_key
from ..errors import ChatCacheError, InvalidMessageError
from ..reply import ReplyStream
from . import schemas
from .admission import Ticket
from .errors import ApiError, api_error, error_body
from .server import Server, build_server, warm_up
from .settings import ServeSettings
from .tenants import client_id, stored_id
from .turns import answer_turn


def create_app(settings: ServeSettings, chat_model: ChatModel | None = None, embedder: str | Embed = "bundled") -> FastAPI:
    """The FastAPI app; the model loads and the database opens when it starts (its lifespan)."""
    holder: list[Server] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server = await asyncio.to_thread(build_server, settings, chat_model, embedder)
        holder.append(server)
        app.state.server = server  # for operators' and tests' introspection
        await asyncio.to_thread(warm_up, server)
        freeze_startup_objects()
        try:
            yield
        finally:
            gc.unfreeze()  # collectable again once the server is gone (tests start many in one process)
            await asyncio.to_thread(server.close)

    app = FastAPI(title="chatcache", version="0.1.0", lifespan=lifespan, max_body_size=settings.max_body_bytes)

    def server() -> Server:
        if not holder:
            raise ApiError(503, "The server is starting.", "service_unavailable", "starting", {"Retry-After": "5"})
        return holder[0]

    async def on_session(
        authorization: str | None, session_id: str, call: Callable[[ChatEngine, str, str], dict[str, Any]]
    ) -> dict[str, Any]:
        """Run `call(engine, stored id, tenant)` on the caller's tenant's session, off the event loop."""
        s = server()
        tenant = s.authenticate(authorization)
        stored = _stored(tenant, session_id)
        engine = s.tenants(tenant)
        result: dict[str, Any] = await asyncio.to_thread(_guarded, lambda: call(engine, stored, tenant))
        return result

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error_body(str(error), error.kind, error.code), error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in error.errors())
        return JSONResponse(error_body(f"Invalid request: {problems}", "invalid_request_error", "invalid_request"), 400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail), "invalid_request_error", None), error.status_code, headers=error.headers)

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
        tenant = s.authenticate(authorization)
        if body.model not in (s.model_id, s.settings.model):
            raise ApiError(404, f"The model {body.model!r} does not exist; this server serves {s.model_id!r}.", "not_found_error", "model_not_found")
        engine = s.tenants(tenant)
        options = body.options(s.settings.max_tokens)
        if x_session_id is not None:  # the server keeps the conversation: only the new message comes
            if len(body.messages) != 1 or body.messages[0].role != "user":
                raise ApiError(400, "With X-Session-Id the server keeps the conversation: send only the new user message.", "invalid_request_error", "invalid_request")
            if body.tools:
                raise ApiError(
                    400, "Tool calls and their results live in the conversation the client keeps: send tools without X-Session-Id.",
                    "invalid_request_error", "invalid_request",
                )  # fmt: skip
            stored = _stored(tenant, x_session_id)

            def start(ticket: Ticket) -> ReplyStream:
                return engine.stream(stored, body.messages[0].message().content, **options, admit=ticket.admit)

            def cache_may_serve() -> bool:
                return engine.admission.may_answer_without_model(
                    body.messages[0].message().content, session_id=stored, temperature=body.temperature, reply_format=options["reply_format"]
                )

            least = engine.admission.least_cost(body.messages[0].message().content, stored, options["max_new_tokens"])
            return await answer_turn(s, start, cache_may_serve, least, body, s.hold_session(stored), x_session_id, engine.answer_cache_bound)
        messages = [m.message() for m in body.messages]
        key = f"{tenant}:{conversation_key(messages)}"  # no KV shared across tenants, even for equal prompts
        tool_options = body.tool_options()

        def start_given(ticket: Ticket) -> ReplyStream:
            return engine.complete(messages, kv_key=key, **options, **tool_options, admit=ticket.admit)

        def given_may_skip() -> bool:
            return engine.admission.may_answer_without_model(
                messages[-1].content, messages=messages, temperature=body.temperature, reply_format=options["reply_format"],
                max_new_tokens=options["max_new_tokens"], **tool_options,
            )  # fmt: skip

        least = engine.admission.least_cost(messages[-1].content, key, options["max_new_tokens"])
        calls_in = engine.call_syntax if body.may_call else None
        return await answer_turn(s, start_given, given_may_skip, least, body, lambda: None, None, engine.answer_cache_bound, calls_in)

    @app.post("/v1/sessions", status_code=201)
    async def create_session(body: schemas.SessionCreate | None = None, authorization: str | None = Header(None)) -> dict[str, Any]:
        s = server()
        tenant = s.authenticate(authorization)
        wanted = (body.id if body else None) or uuid.uuid4().hex

        def create() -> dict[str, Any]:
            engine = s.tenants(tenant)
            return _session_summary(tenant, engine.sessions.create(_stored(tenant, wanted), body.title if body else None))

        return await asyncio.to_thread(_guarded, create)

    @app.get("/v1/sessions")
    async def list_sessions(authorization: str | None = Header(None), handed_off: bool | None = None) -> dict[str, Any]:
        s = server()
        tenant = s.authenticate(authorization)
        engine = s.tenants(tenant)
        sessions = await asyncio.to_thread(_guarded, engine.sessions.all)
        rows = [_session_summary(tenant, session) for session in sessions]
        if handed_off is not None:
            rows = [row for row in rows if row["handed_off"] == handed_off]
        return {"object": "list", "data": rows}

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        s = server()
        tenant = s.authenticate(authorization)
        store = s.tenants.store
        stored = _stored(tenant, session_id)

        def read() -> dict[str, Any]:
            summary = _session_summary(tenant, store.get_session(stored))
            messages, facts = store.messages(stored), store.facts(stored)
            return {
                **summary,
                "handoff_summary": Sessions.handoff_summary(messages, facts) if summary["handed_off"] else None,
                "messages": [_message(m) for m in messages],
                "facts": [{"kind": f.kind.value, "name": f.name, "value": f.value, "confidence": f.confidence} for f in facts],
            }

        return await asyncio.to_thread(_guarded, read)

    @app.post("/v1/sessions/{session_id}/messages", response_model=None)
    async def session_message(
        session_id: str, body: schemas.SessionMessage, authorization: str | None = Header(None)
    ) -> JSONResponse | StreamingResponse:
        s = server()
        tenant = s.authenticate(authorization)
        stored = _stored(tenant, session_id)
        engine = s.tenants(tenant)

        async def exists() -> None:
            """404 before the engine runs (which would create the session). Read only once the
            door has let the turn in: one in memory exists, and the database read waits for a
            thread of asyncio's pool, 200-440 ms in the opening burst of 32 clients (16 reads at
            once), which a refusal at the door must not wait for."""
            if not engine.sessions.in_memory(stored):
                await asyncio.to_thread(s.tenants.store.get_session, stored)

        options = body.options(s.settings.max_tokens)

        def start(ticket: Ticket) -> ReplyStream:
            return engine.stream(stored, body.content, **options, admit=ticket.admit)

        def cache_may_serve() -> bool:
            return engine.admission.may_answer_without_model(body.content, session_id=stored, temperature=body.temperature, reply_format=options["reply_format"])

        least = engine.admission.least_cost(body.content, stored, options["max_new_tokens"])
        return await answer_turn(s, start, cache_may_serve, least, body, s.hold_session(stored), session_id, engine.answer_cache_bound, before_start=exists)

    @app.patch("/v1/sessions/{session_id}")
    async def rename_session(session_id: str, body: schemas.SessionRename, authorization: str | None = Header(None)) -> dict[str, Any]:
        """Give a session a title (or null: none), as the app's rename does."""
        def rename(engine: ChatEngine, stored: str, tenant: str) -> dict[str, Any]:
            return _session_summary(tenant, engine.sessions.rename(stored, body.title))

        return await on_session(authorization, session_id, rename)

    # -- a person's side of a handed-off session: only an agent's key ---------------------

    async def as_agent(
        authorization: str | None, session_id: str, said: str | None, call: Callable[[ChatEngine, SessionStore, str, str, str], dict[str, Any]]
    ) -> dict[str, Any]:
        """Run `call(engine, store, stored id, tenant, agent)` for an agent's key (403 for a
        customer's), off the event loop. The agent is the person the key names; `said`, the name
        in the request, only counts on an open server, and must not contradict the key's."""
        s = server()
        caller = s.authenticate_agent(authorization)
        agent = caller.name or said
        if agent is None:
            raise ApiError(400, "Say who you are: `agent` names the person answering.", "invalid_request_error", "agent_name_required")
        if said is not None and said != agent:
            raise ApiError(403, f"This key is {agent}'s: it acts under that name only.", "permission_error", "agent_name_mismatch")
        stored = _stored(caller.tenant, session_id)
        engine = s.tenants(caller.tenant)
        result: dict[str, Any] = await asyncio.to_thread(_guarded, lambda: call(engine, s.tenants.store, stored, caller.tenant, agent))
        return result

    @app.get("/v1/agent/queue")
    async def agent_queue(authorization: str | None = Header(None)) -> dict[str, Any]:
        """The tenant's handed-off sessions, the most recently active first, each with the
        summary a person reads before taking it over and who has claimed it."""
        s = server()
        caller = s.authenticate_agent(authorization)
        tenant, store = caller.tenant, s.tenants.store

        def queue() -> dict[str, Any]:
            rows = []
            for session in s.tenants(tenant).sessions.all():
                summary = _session_summary(tenant, session)
                if summary["handed_off"]:
                    summary["handoff_summary"] = Sessions.handoff_summary(store.messages(session.id), store.facts(session.id))
                    rows.append(summary)
            return {"object": "list", "data": rows, "agent": caller.name}  # the console shows whose key it holds

        return await asyncio.to_thread(_guarded, queue)

    @app.post("/v1/sessions/{session_id}/claim")
    async def claim(session_id: str, body: schemas.AgentClaim, authorization: str | None = Header(None)) -> dict[str, Any]:
        """A person takes a handed-off session over; a second one is told who has it (409)."""
        def take(engine: ChatEngine, store: SessionStore, stored: str, tenant: str, agent: str) -> dict[str, Any]:
            if Sessions.dialogue_state(store.get_session(stored)) != State.HANDED_OFF:
                raise ApiError(400, "This session is not handed off to a person; the bot answers it.", "invalid_request_error", "not_handed_off")
            return _session_summary(tenant, store.claim_session(stored, agent))

        return await as_agent(authorization, session_id, body.agent, take)

    @app.post("/v1/sessions/{session_id}/agent", status_code=201)
    async def agent_message(session_id: str, body: schemas.AgentMessage, authorization: str | None = Header(None)) -> dict[str, Any]:
        """A person's reply in a session the bot handed off to them; replying claims the
        session, so a person who has not claimed it cannot answer over the one who has."""
        def reply(engine: ChatEngine, store: SessionStore, stored: str, tenant: str, agent: str) -> dict[str, Any]:
            if Sessions.dialogue_state(store.get_session(stored)) == State.HANDED_OFF:
                store.claim_session(stored, agent)
            engine.sessions.agent_reply(stored, body.content, agent)  # refuses a session not handed off
            return {"session_id": session_id, "role": "assistant", "content": body.content, "agent": agent}

        return await as_agent(authorization, session_id, body.agent, reply)

    @app.post("/v1/sessions/{session_id}/hand-back")
    async def hand_back(session_id: str, body: schemas.AgentClaim, authorization: str | None = Header(None)) -> dict[str, Any]:
        """The person who has the session hands it back to the bot, and the claim goes."""
        def back(engine: ChatEngine, store: SessionStore, stored: str, tenant: str, agent: str) -> dict[str, Any]:
            holder = store.get_session(stored).claimed_by
            if holder is not None and holder != agent:
                raise api_error(SessionClaimedError(session_id, holder))
            engine.sessions.hand_back(stored)
            store.release_claim(stored)
            return _session_summary(tenant, engine.sessions.get(stored))

        return await as_agent(authorization, session_id, body.agent, back)

    @app.delete("/v1/sessions/{session_id}")
    async def end_session(session_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        def end(engine: ChatEngine, stored: str, tenant: str) -> dict[str, Any]:
            engine.sessions.end(stored)
            return _session_summary(tenant, engine.sessions.get(stored))

        return await on_session(authorization, session_id, end)

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return _page("chat.html")

    @app.get("/agent", response_class=HTMLResponse)
    async def agent_console() -> HTMLResponse:
        """The agents' console; the page is public, what it shows needs an agent's key."""
        return _page("agent.html")

    @app.get("/static/{name}")
    async def static_file(name: str) -> Response:
        """The pages' shared script and style sheet; only the files listed in `STATIC` exist."""
        if name not in STATIC:
            raise ApiError(404, "No such file.", "not_found_error", None)
        return Response(_static(name), media_type=STATIC[name])

    return app


_JS, _CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"
STATIC = {"chat.css": _CSS, "markdown.js": _JS, "common.js": _JS, "chat.js": _JS, "agent.js": _JS}
"""The files under /static/: a fixed list, so no path a client sends reaches the file system."""

# What the pages may load: their own scripts and styles, nothing inline, no other origin. A
# message that got past the Markdown renderer as markup still could not run a script.
PAGE_POLICY = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"


def _static(name: str) -> str:
    return resources.files("chatcache.serving").joinpath("static", name).read_text(encoding="utf-8")


def _page(name: str) -> HTMLResponse:
    return HTMLResponse(_static(name), headers={"Content-Security-Policy": PAGE_POLICY, "X-Content-Type-Options": "nosniff"})


def freeze_startup_objects() -> None:
    """Move every object alive after the model load and warm-up out of the garbage collector's
    scans (`gc.freeze`), after collecting what start-up left behind.

    The loaded model, torch, transformers and the rest hold about 590,000 tracked objects, and
    a full (generation 2) collection walks them all while holding the GIL: measured under
    `bench.serve_load`'s 32 clients, one took 320-420 ms, which stalled the event loop and so
    every 429 in flight (12 of the slowest in one run). Frozen, they are never scanned again;
    the later full collections walk only what serving allocates. A frozen object that becomes
    cyclic garbage is never freed, which start-up objects that live as long as the server are
    not."""
    gc.collect()
    gc.freeze()


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


def _session_summary(tenant: str, session: ChatSession) -> dict[str, Any]:
    state = Sessions.dialogue_state(session)
    return {
        "id": client_id(tenant, session.id),
        "object": "session",
        "title": session.title,
        "status": session.status.value,
        "dialogue_state": state.value if state is not None else None,
        "handed_off": state == State.HANDED_OFF,
        "claimed_by": session.claimed_by,
        "created_at": session.created_at.isoformat(),
        "updated_at": session.updated_at.isoformat(),
    }


def _message(message: Any) -> dict[str, Any]:
    shown = {"role": message.role.value, "content": message.content, **_turn_figures(message.meta)}
    if (message.meta or {}).get("agent"):
        shown["agent"] = message.meta["agent"]  # a person wrote it, not the bot
    return shown


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
