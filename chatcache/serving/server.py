"""What one running server owns: the model, the tenants' engines, admission, metrics, keys.

Built once at startup (`build_server`), before the first request, and closed at shutdown:
the model and the session database are shared by every tenant's engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chatcache import ChatModel, Embed, build_token_tier, load_chat_model, load_embedder, sentence_embed
from chatcache.storage import SessionStore

from ..answer_cache import AnswerCacheConfig
from ..config import TokenTierConfig, default_data_dir
from ..engine import ChatEngine
from .admission import AdmissionControl, Overloaded
from .errors import ApiError, api_error
from .keys import AGENT, ApiKeys, Caller, TokenBucket
from .metrics import ServerMetrics
from .settings import ServeSettings
from .tenants import TenantEngines

DEFAULT_SYSTEM_PROMPT = "You are a helpful, concise assistant."
# Batch sizes the warm-up decodes together besides one alone: predictions at large batches read
# off a measured line from the start (extrapolated from 1 and 4 rows, the first 20-row turns of
# a burst were predicted 0.3-3.1 s and took 4-6 s).
WARM_UP_BATCHES = (4, 16)


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

    def authenticate(self, authorization: str | None) -> str:
        """The request's tenant, after its rate token was taken."""
        return self.caller(authorization).tenant

    def authenticate_agent(self, authorization: str | None) -> Caller:
        """Who makes a request only a person answering handed-off sessions may make.

        Raises:
            ApiError: 401 without a valid key, 403 for a customer's key.
        """
        caller = self.caller(authorization)
        if caller.role != AGENT:
            self.metrics.rejections.labels("role").inc()
            raise ApiError(403, "This needs an agent's API key; a customer's key cannot take over conversations.", "permission_error", "agent_role_required")
        return caller

    def caller(self, authorization: str | None) -> Caller:
        """The request's tenant and role, after its rate token was taken."""
        key = authorization.removeprefix("Bearer ").strip() if authorization else None
        caller = self.keys.caller_of(key)
        if caller is None:
            self.metrics.rejections.labels("auth").inc()
            raise ApiError(401, "A valid API key is required: send 'Authorization: Bearer KEY'.", "authentication_error", "invalid_api_key", {"WWW-Authenticate": "Bearer"})
        limiter_key = key or caller.tenant
        if self.bucket is not None and (wait := self.bucket.take(limiter_key)) > 0:
            self.metrics.rejections.labels("rate").inc()
            raise api_error(Overloaded("rate", wait, "This key is over its request rate."))
        return caller

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
    keys = settings.keys()
    owns_model = chat_model is None
    model = chat_model or load_chat_model(settings.model, precision=settings.precision, compiled_decode=settings.compiled_decode)
    store = SessionStore(settings.db) if settings.db else SessionStore.open(default_data_dir())
    spill = TokenTierConfig(spill_dir=settings.kv_dir or default_data_dir() / "kv", spill_key_file=settings.kv_key_file)
    token_tier = build_token_tier(model, spill)
    needs_embedder = settings.answer_cache or settings.drift or settings.bot is not None
    embed = embedder if callable(embedder) or not needs_embedder else sentence_embed(load_embedder(embedder))
    system_prompt = settings.system_prompt or (None if settings.bot else DEFAULT_SYSTEM_PROMPT)

    answer_cache = (
        AnswerCacheConfig(
            max_error_rate=settings.answer_cache_max_error_rate,
            bound_confidence=settings.answer_cache_confidence,
            audit_rate=settings.answer_cache_audit_rate,
        )
        if settings.answer_cache
        else False
    )

    def engine_of(tenant: str) -> ChatEngine:
        return ChatEngine(
            model, system_prompt=system_prompt, answer_cache=answer_cache, drift=settings.drift,
            token_tier=token_tier, store=store, bot=settings.bot, user_id=tenant, embedder=embed, tenant=tenant,
        )  # fmt: skip

    tenants = TenantEngines(engine_of, store, token_tier)
    admission = AdmissionControl(model.scheduler, settings.ttft_slo, settings.max_queue, token_tier.fits)
    metrics = ServerMetrics(model.scheduler, token_tier, tenants.engines, lambda: admission.waiting)
    bucket = TokenBucket(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None
    return Server(settings, keys, model, served_model_id(model.name), tenants, admission, metrics, bucket, owns_model)


def served_model_id(name: str) -> str:
    """The id `/v1/models` lists: the bundled model's own name, a local directory's name, or the hub id."""
    if name == "bundled":
        return "SmolLM2-135M-Instruct"
    path = Path(name)
    return path.name if path.is_dir() else name


def warm_up(server: Server) -> None:
    """Warm the model up through the first tenant's engine (`ChatEngine.warm_up`) before the
    first client: for a server with a TTFT SLO with decode steps of each of `WARM_UP_BATCHES`
    rows, so the scheduler has measured the step costs of those batch sizes before admission
    control judges the first client against the SLO. Without an SLO admission refuses on queue
    length only, and the batches would only delay the start (12 to 15 s on the bundled model)."""
    engine = server.tenants(sorted(server.keys.tenants)[0])
    engine.warm_up(WARM_UP_BATCHES if server.settings.ttft_slo is not None else ())
