"""ChatEngine: answers a user turn by turn on a local model (or one served elsewhere, whose
server's prefix cache then plays the token tier), serving what it can from its caches. It
builds its parts and hands each call to the owner of what it asks (the class says which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chatcache.dialog import Actions, BotDefinition, load_bot
from chatcache.storage import SessionStore

from ..answer_cache import AnswerCache, AnswerCacheConfig, BoundStatus, Scope, bot_fingerprint
from ..answer_cache.answering import CachedAnswers
from ..config import GenerationConfig, MemoryConfig, TokenTierConfig, default_data_dir
from ..errors import ConfigError
from ..intents.trained import load_trained
from ..model.loading import ChatModel, load_chat_model, load_embedder
from ..model.prompt import Message, PromptRenderer
from ..model.remote import RemoteModel, connect_remote_model, is_remote
from ..model.tools import CallSyntax, ToolChoice
from ..model_runner import ModelRunner, runner_for
from ..reply import AsyncReplyStream, Reply, ReplyStream
from ..reply_format import ReplyFormat
from ..steering.drift import DriftConfig
from ..steering.hcac import ContextCoordinator, Embed, sentence_embed
from ..steering.tool_router import TOOL_ROUTE_THRESHOLD
from ..tiers.conversations import Conversations
from ..tiers.token_tier import TokenTier, TokenTierStats
from ..tiers.turn_tier import TurnTierConfig
from ..worker_threads import close_at_exit
from .admission import AdmissionEstimates, LeastCost
from .given import GivenConversations, conversation_key
from .sessions import Sessions
from .turn_record import Admit, Turn
from .turns import TurnPipeline

__all__ = ["Admit", "ChatEngine", "LeastCost", "Sessions", "conversation_key"]


class ChatEngine:
    """A chatbot on a local Hugging Face model with a hierarchical cache.

    Args:
        model: "bundled" (SmolLM2-135M-Instruct, offline), a model id, a local path, a loaded
            `ChatModel`; or a model served elsewhere: the address of an OpenAI-compatible API
            (`http://127.0.0.1:8080/v1`, the server's only model) or a `RemoteModel`
            (`connect_remote_model`), on which the server's prefix cache plays the token tier.
        system_prompt: the bot's instructions; their KV is computed once and shared by every session.
            Defaults to the bot's system prompt and knowledge base when a bot is given.
        answer_cache: serve a question asked again in the same context from the answer cache,
            without running the model; True for the defaults or an `AnswerCacheConfig`.
        drift: detect topic changes and drop stale context; True for the defaults or a `DriftConfig`.
        token_tier: KV reuse settings (by default 1 GiB in memory, cold sessions spilled under the
            data dir), or a `TokenTier` engines on the same model share (one memory budget; a
            server's per-tenant engines). A remote model has none.
        context_window: prompt plus reply limit in tokens; defaults to the model's.
        device: where the model runs; defaults to CUDA when available.
        store: the session tier: a `SessionStore`, a SQLAlchemy URL, or None for the SQLite
            file in the data directory. Conversations continue across processes through it.
        bot: a bot definition (YAML path, shipped bot name, or `BotDefinition`): intents, slots
            and flows for the dialogue state machine. Without one the engine is a plain chatbot.
        user_id: the user the sessions belong to.
        embedder: the sentence embedder for intents and drift: "bundled", a model id, a path, or a
            function from texts to unit-normalised rows.
        promote_threshold: intent confidence above which a turn's intent and slots become facts.
        turn_tier: TTL and bound of each session's entries in the in-process turn tier.
        tenant: answers are never shared across tenants.
        prefetch: with the answer cache, answer the likely next question in the background
            while idle (ACPC), learned from the conversations in the session tier (local models only).
        memory: how many sessions, idle for how long, keep their state in memory, and how long
            a reply stream nobody reads keeps its session before it is closed.

    The engine is a front over a few owners, each with one job: `sessions` (a user's sessions,
    hand-off, and what each holds in memory), the turn pipeline (`turns.py`: a turn's steps, for
    a session's turn and for a conversation the caller keeps, which `given.py` reads first), and
    `admission` (what a server's admission control asks before a turn runs).
    """

    def __init__(
        self,
        model: str | ChatModel | RemoteModel = "bundled",
        system_prompt: str | None = None,
        answer_cache: bool | AnswerCacheConfig = False,
        drift: bool | DriftConfig = False,
        token_tier: TokenTierConfig | TokenTier | None = None,
        context_window: int | None = None,
        device: str | None = None,
        store: SessionStore | str | None = None,
        bot: BotDefinition | str | Path | None = None,
        user_id: str = "local",
        embedder: str | Embed = "bundled",
        promote_threshold: float = 0.95,
        turn_tier: TurnTierConfig | None = None,
        tenant: str = "default",
        prefetch: bool = False,
        memory: MemoryConfig | None = None,
    ) -> None:
        if isinstance(model, str):
            model = connect_remote_model(model, context_window=context_window) if is_remote(model) else load_chat_model(model, device=device)
        if isinstance(model, RemoteModel) and (token_tier is not None or prefetch):
            raise ConfigError("A remote model keeps its KV on its server: token_tier and prefetch need a local model.")
        self.chat_model = model
        self.bot = load_bot(bot) if isinstance(bot, (str, Path)) else bot
        self.actions = Actions.load(self.bot) if self.bot is not None else None
        self.system_prompt = system_prompt or (self.bot.instructions if self.bot else None)
        self.renderer = PromptRenderer(self.chat_model.tokenizer)
        self.context_window = min(context_window or self.chat_model.context_window, self.chat_model.context_window)
        self.system_ids = self.renderer.system_ids(self.system_prompt) if self.system_prompt else []  # their KV every session shares
        self.runner = runner_for(model, token_tier, self.system_ids, default_data_dir() / "kv")
        self.token_tier = self.runner.token_tier if isinstance(self.runner, ModelRunner) else None  # a remote model's KV is its server's
        self.store = store if isinstance(store, SessionStore) else SessionStore(store) if store else SessionStore.open(default_data_dir())
        bot_name = Path(bot).stem if isinstance(bot, (str, Path)) else "default" if bot is None else "custom"
        conversations = Conversations(self.store, bot_name, user_id, self.system_prompt, vocab_size=self.chat_model.vocab_size)
        self.embed: Embed | None = None  # the sentence embedder for intents, drift and the answer cache, if they need one
        if drift or self.bot is not None or answer_cache:
            self.embed = embedder if callable(embedder) else sentence_embed(load_embedder(embedder, device=device))
        # The bot's intents are read by the model `chatcache train` stored for exactly its examples, if there is one.
        self.trained_intents = load_trained(self.bot, bot_name) if self.bot is not None else None
        self.coordinator = (
            ContextCoordinator.steering(conversations, self.embed, self.bot, drift, embedder == "bundled", promote_threshold, self.trained_intents)
            if self.embed is not None else None
        )  # fmt: skip
        self.answer_cache: AnswerCache | None = None
        self.answers: CachedAnswers | None = None
        if answer_cache:
            config = answer_cache if isinstance(answer_cache, AnswerCacheConfig) else AnswerCacheConfig()
            assert self.embed is not None
            self.answer_cache = AnswerCache(config, self.embed, self.store.answers, audits=self.store.answer_audits)
            scope = Scope(self.chat_model.identity, bot_fingerprint(self.system_prompt), tenant)
            bot_texts = [self.system_prompt or "", *(self.bot.wording if self.bot else [])]
            self.answers = CachedAnswers(self.answer_cache, scope, self.runner, user_id, bot_texts=bot_texts)
        self.sessions = Sessions(self.store, conversations, self.token_tier, turn_tier or TurnTierConfig(), self.renderer, memory or MemoryConfig())
        self.turns = TurnPipeline(
            renderer=self.renderer, context_window=self.context_window, system_ids=self.system_ids, system_prompt=self.system_prompt,
            sessions=self.sessions, runner=self.runner, token_tier=self.token_tier, coordinator=self.coordinator, answers=self.answers, actions=self.actions, tenant=tenant, prefetch=prefetch,
        )  # fmt: skip
        self.given = GivenConversations(self.renderer, self.system_prompt, self.turns.reply_ids, self.embed)
        self.admission = AdmissionEstimates(self.renderer, self.system_ids, self.token_tier, self.bot, self.answers, self.sessions, self.given)
        close_at_exit(self)  # a script that never closes its engine still spills its KV and closes its database

    @property
    def call_syntax(self) -> CallSyntax:
        """How this model writes tool calls: its chat template's way, else Hermes' (`model/tools.py`)."""
        return self.given.call_syntax

    def chat(self, session_id: str, text: str, **generation: object) -> Reply:
        """Answer `text` in `session_id` (created on first use) and return the whole reply."""
        with self.stream(session_id, text, **generation) as stream:  # type: ignore[arg-type]
            for _ in stream:
                pass
        reply = stream.reply
        assert reply is not None
        return reply

    def stream(
        self,
        session_id: str,
        text: str,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: str | list[str] | tuple[str, ...] | None = None,
        seed: int | None = None,
        admit: Admit | None = None,
        repetition_penalty: float = 1.0,
        reply_format: ReplyFormat | None = None,
    ) -> ReplyStream:
        """Answer `text`, yielding text pieces as tokens are generated; `admit` may refuse a
        turn that needs the model before anything is recorded (see `Admit`). A
        `repetition_penalty` above 1 discourages the reply from repeating itself, and a
        `reply_format` keeps the model's reply in a JSON schema or grammar (`GenerationConfig`).

        Raises:
            InvalidMessageError: empty text or text no database can store (at once), or a
                message that cannot fit the context window (when iteration starts). Nothing is
                recorded either way; a new session is not even created.
            ConfigError: a decoding setting that can never work (at once), such as a Lark
                grammar for a remote model.
        """
        params = GenerationConfig(max_new_tokens, temperature, top_p, _stops(stop), seed, repetition_penalty, reply_format)
        return self.turns.stream(Turn.for_session(session_id, text, params, admit))

    def astream(
        self,
        session_id: str,
        text: str,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: str | list[str] | tuple[str, ...] | None = None,
        seed: int | None = None,
        admit: Admit | None = None,
        repetition_penalty: float = 1.0,
        reply_format: ReplyFormat | None = None,
    ) -> AsyncReplyStream:
        """`stream` for asyncio code: `async for piece in engine.astream(...)`, called inside a
        running event loop; the same errors, raised at once or when iteration starts."""
        return AsyncReplyStream(
            self.stream(session_id, text, max_new_tokens, temperature, top_p, stop, seed, admit, repetition_penalty, reply_format)
        )

    def complete(
        self,
        messages: Sequence[Message],
        kv_key: str | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        admit: Admit | None = None,
        repetition_penalty: float = 1.0,
        reply_format: ReplyFormat | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = False,
        tool_route_threshold: float | None = TOOL_ROUTE_THRESHOLD,
    ) -> ReplyStream:
        """Answer the last user message of a conversation the caller keeps (LangChain's way, or
        an OpenAI-style request), through the same steps as a session's turn but recording nothing.

        The answer cache's scope takes the conversation's own system message as the bot; the
        model runs on the token tier's entry `kv_key`, by default keyed by the conversation's
        start (`conversation_key`), so the next call, which repeats these messages plus a turn,
        prefills only the new tail. Without a system message the engine's system prompt is put
        first. A conversation that does not fit the context window is refused, not cut: the
        caller owns its history.

        With `tools` (OpenAI function specs) the reply is text or calls in the format of
        `chatcache.model.tools` (read them with `parse_calls`), as `tool_choice` allows ("auto",
        "any", "none" or a tool's name); `parallel_tool_calls` lets one reply make several. Under
        "auto", a question at least `tool_route_threshold` close in meaning to a tool is answered
        by a call of it (`ToolRouter`; None leaves it to the model). See `steering/tool_use.py`.

        Raises:
            InvalidMessageError: no messages, an unknown role, text no database can store, a
                last message that is not the user's or is empty (at once), or a conversation
                that does not fit the context window (when iteration starts).
            ConfigError: a malformed tool, a choice that names no bound tool, tools with a
                reply format, or a format a remote model cannot hold a reply to.
        """
        params = GenerationConfig(max_new_tokens, temperature, top_p, _stops(stop), seed, repetition_penalty, reply_format)
        return self.turns.stream(self.given.turn(messages, kv_key, params, admit, tools, tool_choice, parallel_tool_calls, tool_route_threshold))

    def warm_up(self, batch_sizes: Sequence[int] = ()) -> None:
        """Answer once off the record, so that the scheduler has measured its prefill rate and a
        lone row's decode step before the first user's turn; then decode a few steps of each of
        `batch_sizes` rows together (`ModelRunner.decode_batches`), so that it has measured those
        batches' step costs too before a server's admission control predicts waits from them.

        Nothing is left behind: the answer is sampled (the answer cache keeps no sampled reply)
        and every KV made for it is dropped.

        Raises:
            ConfigError: batch sizes on a remote model, whose scheduler is its server's.
        """
        if batch_sizes and not isinstance(self.runner, ModelRunner):
            raise ConfigError("A remote model's scheduler is its server's: only a local model's batches can be warmed up here.")
        with self.complete([Message("user", "Hello")], kv_key="warm-up", max_new_tokens=8, temperature=1.0, seed=0) as reply:
            for _ in reply:
                pass
        if self.token_tier is not None:
            self.token_tier.drop("warm-up")
        if isinstance(self.runner, ModelRunner):
            self.runner.decode_batches(self.renderer.encode_text("Hello, how can I help you today?"), batch_sizes)

    def close(self) -> None:
        """Stop prefetching, spill idle sessions' KV to disk and close the session database.

        The next process on the same data directory continues each conversation from the
        database and restores its KV from disk instead of recomputing it. The model's worker
        goes on serving other engines on the same model (`ChatModel.close` stops it). Closing
        again does nothing more; an engine still open when the interpreter exits is closed then.
        """
        self.turns.close()
        self.sessions.close()

    def __enter__(self) -> ChatEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def kv_stats(self) -> TokenTierStats:
        """The token tier's counters; all zero on a remote model, whose KV is its server's."""
        return self.token_tier.stats() if self.token_tier is not None else TokenTierStats()

    def answer_cache_bound(self) -> BoundStatus | None:
        """The answer cache's error bound and what the audits measured (every replica's), for the
        app's panel and the server's replies; None without an answer cache or without a bound."""
        return self.answers.bound() if self.answers is not None else None


def _stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    return tuple([stop] if isinstance(stop, str) else stop or ())
