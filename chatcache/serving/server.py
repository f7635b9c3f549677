"""What one running server owns: the model, the tenants' engines, admission, metrics, keys.

Built once at startup (`build_server`), before the first request, and closed at shutdown:
the model and the session database are shared by every tenant's engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage import SessionStore

from ..config import TokenTierConfig, default_data_dir
from ..engine import ChatEngine
from ..model.loading import ChatModel, load_chat_model, load_embedder
from ..model.prompt import Message
from ..steering.hcac import Embed, sentence_embed
from .admission import AdmissionControl, Overloaded
from .errors import ApiError, api_error
from .keys import ApiKeys, TokenBucket
from .metrics import ServerMetrics
from .settings import ServeSettings
from .tenants import TenantEngines

DEFAULT_SYSTEM_PROMPT = "You are a helpful, concise assistant."
WARM_UP_ROWS = 4  # the warm-up's second step size: the decode cost per row is known from the start


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
        key = authorization.removeprefix("Bearer ").strip() if authorization else None
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            self.metrics.rejections.labels("auth").inc()
            raise ApiError(401, "A valid API key is required: send 'Authorization: Bearer KEY'.", "authentication_error", "invalid_api_key", {"WWW-Authenticate": "Bearer"})
        limiter_key = key or tenant
        if self.bucket is not None and (wait := self.bucket.take(limiter_key)) > 0:
            self.metrics.rejections.labels("rate").inc()
            raise api_error(Overloaded("rate", wait, "This key is over its request rate."))
        return tenant

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
    admission = AdmissionControl(model.scheduler, settings.ttft_slo, settings.max_queue, token_tier.room_for_another)
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
    """Short off-the-record answers, alone and several at once, so the scheduler has measured its
    prefill rate and decode steps of two batch sizes before the first client is admitted."""
    engine = server.tenants(sorted(server.keys.tenants)[0])

    def answer(index: int) -> None:
        # Sampled: the answer cache keeps no sampled reply, so the warm-up leaves nothing behind.
        reply = engine.complete([Message("user", f"Hello {index}")], kv_key=f"warm-up-{index}", max_new_tokens=8, temperature=1.0, seed=index)
        for _ in reply:
            pass
        engine.token_tier.drop(f"warm-up-{index}")

    answer(0)
    together = [threading.Thread(target=answer, args=(i,)) for i in range(1, WARM_UP_ROWS + 1)]
    for thread in together:
        thread.start()
    for thread in together:
        thread.join()
