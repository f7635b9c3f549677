"""ChatEngine: answers a user turn by turn on a local model (or one served elsewhere, whose
server's prefix cache then plays the token tier), serving what it can from its caches.

One turn, top to bottom (`_run_turn`), carried through named steps by one `Turn` record:
receive (check the message); understand (the dialogue layer and drift detection steer the
tiers, `steering/hcac.py`; the answer cache's scope); serve (the flow's own question, a cached
answer, or the model on the session's KV from the token tier, prefilling only what it lacks,
`model_runner.py`, on a prompt laid out from the system prompt with confirmed facts and the
turns that fit; the user's message is recorded once the reply is decided on, after a server's
admission control let a model turn in); commit (the reply, dialogue state, prompt window and
facts in one write). A turn refused before it was recorded changes nothing; a failed turn
keeps the user's message in the record and changes nothing else; a cancelled one keeps what
was said.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chatcache.dialog import (
    ActionContext,
    ActionOutcome,
    Actions,
    BotDefinition,
    DialogueEvent,
    DialogueState,
    DialogueStateMachine,
    EventType,
    State,
    load_bot,
)
from chatcache.storage import ChatSession, SessionStore

from .answer_cache import AnswerCache, AnswerCacheConfig, BoundStatus, CacheHit, Scope, bot_fingerprint
from .answer_cache.answering import AnswerScope, CachedAnswers
from .config import GenerationConfig, TokenTierConfig, default_data_dir
from .tiers.conversations import Conversation, Conversations, check_storable
from .steering.drift import DriftConfig
from .errors import ConfigError, ContextWindowError, InvalidMessageError
from .model.generation import prefill
from .intents.trained import load_trained
from .steering.hcac import ContextCoordinator, Embed, TurnContext, sentence_embed
from .steering.tool_router import ROUTE_THRESHOLD, ToolRouter
from .steering.tool_use import bind_tools, tool_of
from .model.kv import kv_bytes_per_token
from .model_runner import ModelRunner
from .model.text_stream import token_pieces
from .model.tools import HERMES, CallSyntax, ToolChoice, written
from .model.loading import ChatModel, load_chat_model, load_embedder
from .model.prompt import Message, Prompt, PromptRenderer, RenderedSegments, ReplyIds
from .model.remote import RemoteModel, RemoteRunner, connect_remote_model, is_remote
from .reply_format import ReplyFormat
from .reply import AsyncReplyStream, Reply, ReplyStream, TurnStats
from .tiers.residency import KeyLocks, MemoryConfig, ResidentSessions
from .tiers.token_tier import TokenTier, TokenTierStats
from .tiers.turn_tier import TurnTier, TurnTierConfig
from .worker_threads import close_at_exit

log = logging.getLogger(__name__)


ROLES = ("system", "user", "assistant", "tool")  # a tool message brings one call's result back (`complete`)

Admit = Callable[[int, bool, float], None]
"""Admission control for one turn: called with the prompt tokens the model would have to
prefill, whether the token tier has the memory for the turn now (else it would wait for a
running turn to end) and the seconds a restore of the session's KV from disk would take,
before the turn records anything; it raises to refuse the turn (the server's 429)."""


@dataclass(frozen=True)
class LeastCost:
    """The least one turn will cost the model, known before any of its work (`least_cost`)."""

    prefill_tokens: int  # its message's own: everything before it may be in the KV
    kv_tokens: int  # held while it runs: the KV the conversation has (at least its system prompt), the message and the reply
    restore_s: float  # restoring the conversation's KV from disk, if that is where it is


def conversation_key(messages: Sequence[Message]) -> str:
    """Token-tier key of a conversation the caller keeps: its system message (if any) and first user message."""
    head: list[Message] = []
    for message in messages:
        head.append(message)
        if message.role == "user":
            break
    raw = "\0".join(f"{m.role}:{m.content}" for m in head)
    return "lc:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


def _generation(
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop: str | Sequence[str] | None,
    seed: int | None,
    repetition_penalty: float,
    reply_format: ReplyFormat | None,
) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=tuple([stop] if isinstance(stop, str) else stop or ()),
        seed=seed,
        repetition_penalty=repetition_penalty,
        reply_format=reply_format,
    )


@dataclass
class Turn:
    """One user turn as it flows through the engine's steps; each step fills in what it decided."""

    session_id: str  # also the token tier's entry: the session, or the given conversation's key
    params: GenerationConfig
    started: float
    user: Message
    given: bool = False  # the caller keeps the conversation (`complete`): nothing is recorded
    prefix: list[int] | None = None  # the shared system-prompt ids to start from (default: the engine's)
    renderer: PromptRenderer | None = None  # lays out a given conversation (default: the engine's; one with tools)
    bot: str | None = None  # the answer cache's bot fingerprint (default: the engine's)
    admit: Admit | None = None
    user_seq: int = 0
    context: TurnContext = field(default_factory=TurnContext)
    scope: AnswerScope | None = None
    stats: TurnStats = field(default_factory=TurnStats)
    reply: Message | None = None
    action: ActionOutcome | None = None  # the flow's action this turn performed
    committed: bool = False

    @property
    def text(self) -> str:
        return self.user.content

    @property
    def id(self) -> str:
        """The turn's id (dialogue events, action idempotency): the same for every retry of it."""
        return f"{self.session_id}:{self.user_seq}"


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
        turn_tier: TTL and bounds of the in-process turn tier.
        tenant: answers are never shared across tenants.
        prefetch: with the answer cache, answer the likely next question in the background
            while idle (ACPC), learned from the conversations in the session tier (local models only).
        memory: how many sessions, idle for how long, keep their state in memory, and how long
            a reply stream nobody reads keeps its session before it is closed.
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
            if is_remote(model):
                model = connect_remote_model(model, context_window=context_window)
            else:
                model = load_chat_model(model, device=device)
        if isinstance(model, RemoteModel) and (token_tier is not None or prefetch):
            raise ConfigError("A remote model keeps its KV on its server: token_tier and prefetch need a local model.")
        self.chat_model = model
        self.bot = load_bot(bot) if isinstance(bot, (str, Path)) else bot
        self.actions = Actions.load(self.bot) if self.bot is not None else None
        self.system_prompt = system_prompt or (self.bot.instructions if self.bot else None)
        self.tenant = tenant
        self.renderer = PromptRenderer(self.chat_model.tokenizer)
        self.context_window = min(context_window or self.chat_model.context_window, self.chat_model.context_window)
        self._system_ids = self.renderer.system_ids(self.system_prompt) if self.system_prompt else []
        self.token_tier: TokenTier | None = None  # a remote model's KV is its server's
        self.runner: ModelRunner | RemoteRunner
        if isinstance(model, RemoteModel):
            self.runner = RemoteRunner(model)
        else:
            self.token_tier = (
                token_tier
                if isinstance(token_tier, TokenTier)
                else self.build_token_tier(model, token_tier or TokenTierConfig(spill_dir=default_data_dir() / "kv"))
            )
            self.runner = ModelRunner(model, self.token_tier, self._system_ids)
        if not isinstance(store, SessionStore):
            store = SessionStore(store) if store else SessionStore.open(default_data_dir())
        self.store = store
        bot_name = Path(bot).stem if isinstance(bot, (str, Path)) else "default" if bot is None else "custom"
        vocab_size = self.chat_model.vocab_size  # the ids a stored reply may hold
        self.resident = ResidentSessions(memory or MemoryConfig(), self._unload_session, self.expire_sessions)
        self.conversations = Conversations(
            store, bot_name, user_id, self.system_prompt, vocab_size=vocab_size, on_open=self.resident.touch
        )
        self.turn_tier = TurnTier(turn_tier)
        needs_embedder = bool(drift) or self.bot is not None or bool(answer_cache)
        self._embed = (
            (embedder if callable(embedder) else sentence_embed(load_embedder(embedder, device=device)))
            if needs_embedder
            else None
        )
        # The bot's intents are read by the model `chatcache train` stored for exactly its examples, if there is one.
        self.trained_intents = load_trained(self.bot) if self.bot is not None else None
        if self.trained_intents is not None:
            measured = self.trained_intents.info.measured
            log.info("Intents: read by the model trained on this bot's examples (%s; held-out accuracy %s)", self.trained_intents.info.key, measured.get("accuracy"))
        elif self.bot is not None:
            log.info("Intents: read by nearest examples; `chatcache train %s` trains a model on them (more accurate, calibrated)", bot_name)
        self.coordinator = self._build_coordinator(drift, promote_threshold, learned_drift=embedder == "bundled")
        self.answer_cache = (
            AnswerCache(
                answer_cache if isinstance(answer_cache, AnswerCacheConfig) else AnswerCacheConfig(),
                self._embed,  # type: ignore[arg-type]
                store.answers,
                audits=store.answer_audits,
            )
            if answer_cache
            else None
        )
        self.answers = (
            CachedAnswers(
                self.answer_cache,
                Scope(self.chat_model.identity, bot_fingerprint(self.system_prompt), tenant),
                self.runner,
                self.conversations.user_id,
                bot_texts=self._bot_texts(),
            )
            if self.answer_cache is not None
            else None
        )
        self._reply_ids = ReplyIds()  # our replies as `complete` callers send them back
        self._key_locks = KeyLocks()  # one `complete` turn at a time per token-tier key
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._tool_embed: Embed | None = None  # the tool router's, loaded on the first call with tools
        self.prefetcher = self.answers.prefetcher(store, self._prefetch, lambda: self._busy > 0) if prefetch and self.answers else None
        close_at_exit(self)  # a script that never closes its engine still spills its KV and closes its database

    @property
    def embed(self) -> Embed | None:
        """The sentence embedder the engine loaded (for intents, drift, the answer cache); None when it needs none."""
        return self._embed

    def _bot_texts(self) -> list[str]:
        """The bot's own wording: its system prompt and every intent's description and examples."""
        texts = [self.system_prompt or ""]
        for intent in self.bot.intents if self.bot else []:
            texts += [intent.name.replace("_", " "), intent.description, *intent.examples]
        return texts

    @staticmethod
    def build_token_tier(chat_model: ChatModel, config: TokenTierConfig) -> TokenTier:
        """The token tier of `chat_model`'s KV; one built here can be shared by several engines."""
        hf_model = chat_model.model
        return TokenTier(
            config,
            model_config=hf_model.config,
            bytes_per_token=kv_bytes_per_token(hf_model.config, hf_model.dtype),
            prefill=lambda ids, cache: prefill(hf_model, ids, cache),
            spill_identity=(chat_model.identity, PromptRenderer(chat_model.tokenizer).template_hash),
            device=hf_model.device,
        )

    def _build_coordinator(
        self, drift: bool | DriftConfig, promote_threshold: float, learned_drift: bool
    ) -> ContextCoordinator | None:
        if not drift and self.bot is None:
            return None  # a plain chatbot: nothing to steer
        assert self._embed is not None
        config = drift if isinstance(drift, DriftConfig) else DriftConfig() if drift else None
        if config is not None and not learned_drift:
            config = replace(config, model=None)  # the learned model reads the bundled embedder's vectors only
        return ContextCoordinator(
            self.conversations, self.turn_tier, self._embed, self.bot, config, promote_threshold, self.trained_intents
        )

    # -- public API -------------------------------------------------------------------

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
        params = _generation(max_new_tokens, temperature, top_p, stop, seed, repetition_penalty, reply_format)
        if isinstance(self.runner, RemoteRunner):
            self.runner.check(params)
        if not isinstance(text, str) or not text.strip():
            raise InvalidMessageError("The message is empty: type something to send.")
        check_storable(text)
        holder: list[Reply] = []
        pieces = self._counted(self._run_turn(session_id, text, params, holder, admit))
        stream = ReplyStream(pieces, lambda: holder[0] if holder else None, self.resident.config.abandon_stream_after_s)
        close_at_exit(stream)  # a turn still open at exit checks its KV in while torch can still run
        return stream

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
        tool_route_threshold: float | None = ROUTE_THRESHOLD,
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
        params = _generation(max_new_tokens, temperature, top_p, stop, seed, repetition_penalty, reply_format)
        renderer, told = self.renderer, ""
        if tools:
            if reply_format is not None:
                raise ConfigError("Bind tools or a reply format, not both: a reply is either a call or the formatted answer.")
            route = self._tool_router(tool_route_threshold).called if tool_route_threshold is not None else None
            try:
                bound = bind_tools(
                    self._given(messages), tools, tool_choice, parallel_tool_calls, max_new_tokens, self.renderer, self.system_prompt, route
                )
            except ValueError as error:
                raise ConfigError(str(error)) from None
            messages, renderer, told = bound.messages, bound.renderer, bound.told
            params = replace(params, reply_format=bound.reply_format)
        if isinstance(self.runner, RemoteRunner):
            self.runner.check(params)
        conversation, question = self._given_conversation(messages, kv_key)
        system = conversation.system
        # Tools are part of what the model was told, as the system message is.
        told = (system.content if system else "") + told
        turn = Turn(
            conversation.id, params, time.perf_counter(), question, given=True,
            prefix=renderer.system_ids(system.content) if system else [],
            bot=bot_fingerprint(told or None), admit=admit, renderer=renderer,
        )  # fmt: skip
        holder: list[Reply] = []
        pieces = self._counted(self._run_given(conversation, turn, holder))
        return ReplyStream(pieces, lambda: holder[0] if holder else None, self.resident.config.abandon_stream_after_s)

    def _tool_router(self, threshold: float) -> ToolRouter:
        """A router on the engine's embedder (the bundled one for an engine that loaded none)."""
        with self._busy_lock:
            if self._tool_embed is None:
                self._tool_embed = self._embed or sentence_embed(load_embedder("bundled"))
        return ToolRouter(self._tool_embed, threshold)

    def may_answer_without_model(
        self,
        text: str,
        session_id: str | None = None,
        messages: Sequence[Message] | None = None,
        temperature: float = 0.0,
        reply_format: ReplyFormat | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = False,
        max_new_tokens: int = 256,
    ) -> bool:
        """Whether a turn might be served without the model (a cached answer, a flow's question);
        False only when it surely needs the model. Takes the turn's own settings: an answer is
        kept per reply format and per bound tools.

        Cheap, without the embedder and without I/O, so a saturated server can refuse the others
        at once: an exact repeat of a cached question passes, a paraphrase does not (telling it
        from a miss takes the embedder's time on the model's cores). With a bot every turn may
        pass: any message may start a flow, and only the intent classifier can tell. A session
        this process does not hold in memory does not pass: reading it would take the database.
        The answer is the turn's own scopes' alone, so a refusal never tells a user whether
        another user or tenant asked the same text.
        """
        if self.bot is not None:
            return True
        if self.answers is None or temperature > 0:
            return False
        if (messages is None or messages[-1].role == "user") and not self.answers.cache.knows(text):
            return False  # no scope holds the text: no exact hit, whatever the context
        formats = [reply_format.key if reply_format else ""]
        if messages is not None:
            try:
                given, question = self._given_conversation(messages)
                told = given.system.content if given.system else ""
                if tools:  # whichever choice the router would make: each has its format
                    choices = [tool_choice, *([tool_of(spec).name for spec in tools] if tool_choice == "auto" else [])]
                    laid_out = self._given(messages)
                    bound = [
                        bind_tools(laid_out, tools, choice, parallel_tool_calls, max_new_tokens, self.renderer, self.system_prompt, None)
                        for choice in choices
                    ]
                    given, question = self._given_conversation(bound[0].messages)
                    told = (given.system.content if given.system else "") + bound[0].told
                    formats = [b.reply_format.key if b.reply_format else "" for b in bound]
            except (InvalidMessageError, ValueError):
                return True  # the turn itself says what is wrong with it
            return self.answers.holds_exact(given, question.content, bot_fingerprint(told or None), formats)
        assert session_id is not None
        conversation = self.conversations.loaded(session_id)
        if conversation is None:
            return False  # reading its scope would take the database; and "some scope holds it" must not leak
        if not conversation.lock.acquire(blocking=False):
            return True  # a turn runs on it: this one waits behind it anyway
        try:
            return self.answers.holds_exact(conversation, text, reply_formats=formats)
        finally:
            conversation.lock.release()

    def least_cost(self, text: str, kv_key: str, max_new_tokens: int) -> LeastCost:
        """The least a turn on `text` will cost the model, for the conversation whose KV the token
        tier keeps under `kv_key` (a session id, or a given conversation's key). Cheap (the
        tokenizer and the tier's bookkeeping), so admission control can refuse a turn that surely
        cannot start in time, or surely finds no KV memory, before the engine runs it."""
        new = len(self.renderer.encode_text(text))
        tier = self.token_tier
        if tier is None:  # a remote model: its server keeps the KV
            return LeastCost(new, 0, 0.0)
        held = max(tier.held_tokens(kv_key), len(self._system_ids))  # a conversation starts with the system prompt
        return LeastCost(new, held + new + max_new_tokens, tier.restore_estimate(kv_key))

    def _given_conversation(self, messages: Sequence[Message], kv_key: str | None = None) -> tuple[Conversation, Message]:
        """The caller's conversation before its last (user) message, keyed `kv_key` (default: by
        its start, `conversation_key`), and that message."""
        given = self._given(messages)
        system = given[0] if given[0].role == "system" else None
        conversation = Conversation(kv_key or conversation_key(given), system, turns=given[1 if system else 0 : -1])
        return conversation, given[-1]

    def _given(self, messages: Sequence[Message]) -> list[Message]:
        """The caller's conversation, checked, with the engine's system prompt first if it has none,
        tool calls and results written as the model reads them (`tools.written`), and our own
        earlier replies in it carrying the ids they were generated as."""
        if not messages:
            raise InvalidMessageError("No messages: send at least one user message.")
        for message in messages:
            if message.role not in ROLES:
                raise InvalidMessageError(f"Unknown role {message.role!r}: use one of {', '.join(ROLES)}.")
            if message.tool_calls and message.role != "assistant":
                raise InvalidMessageError(f"Only assistant messages make tool calls, not a {message.role} message.")
            check_storable(message.content, f"A {message.role} message")  # the tokenizer and the answer cache would fail on it later
        if messages[-1].role not in ("user", "tool"):
            raise InvalidMessageError(f"The last message must be the user's or a tool's result, not the {messages[-1].role}'s.")
        if not messages[-1].content.strip():
            raise InvalidMessageError("The message is empty: type something to send.")
        given = [self._reply_ids.attach(m) for m in written(messages, self.call_syntax)]
        if given[0].role != "system" and self.system_prompt:
            given.insert(0, Message("system", self.system_prompt))
        return given

    @property
    def call_syntax(self) -> CallSyntax:
        """How this model writes tool calls: its chat template's way, else Hermes' (`model/tools.py`)."""
        return self.renderer.tool_syntax or HERMES

    def _counted(self, pieces: Generator[str, None, None]) -> Generator[str, None, None]:
        """Mark the engine busy while a user turn runs: prefetch waits, and stops mid-answer."""
        with self._busy_lock:
            self._busy += 1
        try:
            yield from pieces
        finally:
            with self._busy_lock:
                self._busy -= 1

    def history(self, session_id: str) -> list[Message]:
        """The session's answered turns, oldest first, including those out of the prompt window.

        Raises:
            UnknownSessionError: no such session in the session tier.
        """
        return list(self.conversations.read(session_id).turns)

    def create_session(self, session_id: str, title: str | None = None) -> ChatSession:
        """Start a session of this engine's user and bot before its first message.

        Raises:
            SessionExistsError: the id is taken.
        """
        return self.store.create_session(session_id, self.conversations.user_id, self.conversations.bot, title)

    def sessions(self) -> list[ChatSession]:
        """This user's sessions in the session tier, most recently active first."""
        return self.store.list_sessions(user_id=self.conversations.user_id)

    def agent_reply(self, session_id: str, text: str, agent: str) -> None:
        """Record a person's reply in a session handed off to them; the bot stays silent there.

        Raises:
            UnknownSessionError: no such session.
            InvalidMessageError: the session is not handed off, or `text` is empty or not storable.
        """
        if not text.strip():
            raise InvalidMessageError("The reply is empty.")
        check_storable(text, "The agent's reply")
        with self.conversations.hold(session_id, create=False) as conversation, self.conversations.turn(conversation):
            self._check_handed_off(conversation)
            messages = self.store.messages(session_id)
            answered = {m.reply_to for m in messages if m.role.value == "assistant"}
            waiting = [m.seq for m in messages if m.role.value == "user" and m.seq not in answered]
            tokens = len(self.renderer.encode_text(text))
            meta = {"tier": "agent", "agent": agent, "dialogue_state": State.HANDED_OFF.value}
            self.store.append_message(
                session_id, "assistant", text, tokens, meta, reply_to=waiting[-1] if waiting else None, lease=conversation.lease
            )
            self.conversations.forget(session_id)  # rebuilt with the person's turn on the next one

    def hand_back(self, session_id: str) -> None:
        """A person hands a session back to the bot: the dialogue starts over, the history stays.

        Raises:
            UnknownSessionError: no such session.
            InvalidMessageError: the session is not handed off.
        """
        with self.conversations.hold(session_id, create=False) as conversation, self.conversations.turn(conversation):
            machine = DialogueStateMachine.restore(self._check_handed_off(conversation))
            machine.apply(DialogueEvent(EventType.RESET, event_id=f"{session_id}:{conversation.last_seq}:hand-back"))
            conversation.dialogue = machine.snapshot()
            self.conversations.store_state(conversation)
            self.conversations.forget(session_id)
            self._release_topic(session_id)

    @staticmethod
    def _check_handed_off(conversation: Conversation) -> DialogueState:
        """The session's dialogue state, which must be HANDED_OFF."""
        if conversation.dialogue is None or conversation.dialogue.state != State.HANDED_OFF:
            raise InvalidMessageError("This session is not handed off to a person; the bot answers it.")
        return conversation.dialogue

    def end_session(self, session_id: str) -> None:
        """End a session in the session tier and release its turn and token tiers.

        Raises:
            UnknownSessionError: no such session in the session tier.
        """
        self.store.end_session(session_id)
        self.release_session(session_id)

    def release_session(self, session_id: str) -> None:
        """Free what a session holds in memory and on disk (it ended or expired)."""
        self.conversations.forget(session_id)
        if self.token_tier is not None:
            self.token_tier.drop(session_id)
        self._release_topic(session_id)
        self.resident.forget(session_id)

    def _unload_session(self, session_id: str) -> bool:
        """Let go of an idle session's memory (its KV goes to disk); False while a turn holds it."""

        def release() -> None:
            if self.token_tier is not None:
                self.token_tier.unload(session_id)
            self._release_topic(session_id)

        return self.conversations.unload(session_id, release)

    def _release_topic(self, session_id: str) -> None:
        if self.coordinator is not None:
            self.coordinator.release(session_id)  # drift history and turn tier
        else:
            self.turn_tier.invalidate(session_id)

    def expire_sessions(self) -> list[str]:
        """Expire idle sessions in the session tier and release their cache tiers; also drop
        turn-tier entries past their TTL in sessions that go on (periodic upkeep)."""
        expired = self.store.expire_sessions()
        for session_id in expired:
            self.release_session(session_id)
        self.turn_tier.purge_expired()
        return expired

    def close(self) -> None:
        """Stop prefetching, spill idle sessions' KV to disk and close the session database.

        The next process on the same data directory continues each conversation from the
        database and restores its KV from disk instead of recomputing it. The model's worker
        goes on serving other engines on the same model (`ChatModel.close` stops it). Closing
        again does nothing more; an engine still open when the interpreter exits is closed then.
        """
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.token_tier is not None:
            self.token_tier.spill_all()
        self.store.close()

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
        if self.answer_cache is None or self.answer_cache.config.max_error_rate is None:
            return None
        return self.answer_cache.bound_status()

    # -- one turn ---------------------------------------------------------------------

    def _run_turn(
        self, session_id: str, text: str, params: GenerationConfig, holder: list[Reply], admit: Admit | None
    ) -> Generator[str, None, None]:
        """One turn, through its steps in order: receive, understand, serve, commit."""
        turn = Turn(session_id, params, time.perf_counter(), Message("user", text), admit=admit)
        # Checked before the session is opened, so an oversized first message creates nothing (one
        # refused later is deleted again); a new session's system message is the bot's prompt
        # alone (it has no facts yet).
        bare_system = Message("system", self.system_prompt) if self.system_prompt else None
        self._check_fits(bare_system, turn.user, params.max_new_tokens)
        with (
            self.conversations.hold(session_id, create=True) as conversation,
            self.conversations.turn(conversation) as rebuilt,
        ):
            if rebuilt:  # another process answered turns since: what this one derived from the old copy is stale
                self._release_topic(session_id)
            if conversation.system != bare_system:  # the session's facts lengthen the system message
                self._check_fits(conversation.system, turn.user, params.max_new_tokens)
            try:
                self._understand(conversation, turn)
                try:
                    yield from self._serve(conversation, turn)
                except GeneratorExit:
                    pass  # the reader stopped: the model's reply keeps what was generated
                if turn.reply is not None:
                    self._commit(conversation, turn)
            finally:
                if not turn.committed:  # what the turn changed in memory was never stored
                    self.conversations.forget(session_id)
                    self._release_topic(session_id)  # the drift topic resumes from the stored turns
                    self.conversations.discard_if_created_empty(conversation)
            if turn.committed or (turn.context.awaiting_agent and turn.user_seq == conversation.last_seq):
                holder.append(self._reply_of(turn))

    def _run_given(self, conversation: Conversation, turn: Turn, holder: list[Reply]) -> Generator[str, None, None]:
        """A turn on a conversation the caller keeps: understand and serve, with nothing to record."""
        self.resident.touch(turn.session_id)  # its KV and heat are let go of like an idle session's
        with self._key_locks.get(turn.session_id):
            self._understand(conversation, turn)
            try:
                yield from self._serve(conversation, turn)
            except GeneratorExit:
                pass  # the reader stopped: the model's reply keeps what was generated
        reply = turn.reply
        if reply is None:
            return
        if reply.generated_ids and turn.stats.finish_reason != "stop":  # a reply cut at a stop string is not its ids' text
            self._reply_ids.remember(reply.content, reply.generated_ids)
        holder.append(self._reply_of(turn))

    def _record_user(self, conversation: Conversation, turn: Turn) -> None:
        """Record the user's message once the turn is let in, before the reply can fail (the
        turn's first write); a conversation the caller keeps records nothing."""
        if turn.given:
            return
        tokens = len(self.renderer.encode_text(turn.text))
        turn.user_seq = self.conversations.record_user(conversation, turn.text, tokens)

    def _understand(self, conversation: Conversation, turn: Turn) -> None:
        """The dialogue layer and drift detection read the turn; the answer cache's scope follows."""
        turn.user_seq = conversation.last_seq + 1  # the seq its message gets: the lease keeps others out
        if self.coordinator is not None and not turn.given:  # the dialogue state lives in a session
            turn.context = self.coordinator.before_reply(conversation, turn.text, turn.id)
        turn.stats.drift, turn.stats.drift_undone, turn.stats.promoted = turn.context.drift, turn.context.reset_undone, turn.context.promoted
        if self.answers is not None:
            reply_format = turn.params.reply_format
            turn.scope = self.answers.scope(
                conversation, turn.context, turn.text, bot=turn.bot, reply_format=reply_format.key if reply_format else ""
            )

    def _serve(self, conversation: Conversation, turn: Turn) -> Generator[str, None, None]:
        """The reply: the flow's own question, its action's response, a cached answer, or the
        model on the session's KV."""
        stats, params = turn.stats, turn.params
        if turn.context.awaiting_agent:  # handed off: the message waits for the person, nobody replies now
            self._record_user(conversation, turn)
            stats.tier, stats.finish_reason, stats.ttft_s = "agent", "handed_off", time.perf_counter() - turn.started
            return
        if turn.context.action is not None and self.actions is not None and turn.context.intent is not None:
            # The flow acts: the bot's code runs, and its response template is the reply.
            self._record_user(conversation, turn)
            slots = {str(k): str(v) for k, v in conversation.dialogue.slots.items()} if conversation.dialogue else {}
            who = ActionContext(self.tenant, self.conversations.user_id, turn.session_id, turn.id)
            turn.action = self.actions.perform(turn.context.intent, slots, who)
            stats.tier, stats.finish_reason, stats.ttft_s = "action", "action", time.perf_counter() - turn.started
            # What the flow says after the action's reply: the answer to, or offer of, a second request.
            said = "\n\n".join(part for part in (turn.action.reply, turn.context.bot_reply) if part)
            yield said
            turn.reply = Message("assistant", said)
        elif turn.context.bot_reply is not None:
            # The flow needs a slot or a confirmation: the bot's own question is the answer.
            self._record_user(conversation, turn)
            stats.tier, stats.finish_reason, stats.ttft_s = "dialog", "flow", time.perf_counter() - turn.started
            yield turn.context.bot_reply
            turn.reply = Message("assistant", turn.context.bot_reply)
        elif (hit := self._cached(turn)) is not None:
            assert self.answers is not None
            self._record_user(conversation, turn)  # served even when the model is saturated: it costs no model time
            stats.tier, stats.finish_reason, stats.answer_cache_hit = "answer", "cache", True
            stats.ttft_s = time.perf_counter() - turn.started
            yield from token_pieces(self.renderer.tokenizer, hit.answer)  # streamed as a generated answer would be, for UIs and callbacks
            turn.reply = Message("assistant", hit.answer)
            self.answers.maybe_audit(hit, params, lambda: self._plan(conversation, turn))
        else:
            prompt = self._plan(conversation, turn)
            stats.dropped_turns = prompt.dropped_turns
            held = self._hold_memory(turn, prompt)
            try:
                self._admit(turn, prompt, held)
                self._record_user(conversation, turn)
            except BaseException:
                if held and self.token_tier is not None:
                    self.token_tier.release(turn.session_id)
                raise
            generated: list[Message] = []
            try:
                yield from self.runner.stream(turn.session_id, prompt, params, stats, turn.started, generated, turn.prefix)
            finally:  # also when the reader stopped: the runner kept what was generated
                if generated:
                    turn.reply = generated[0]
            if self.answers is not None and turn.scope is not None and generated:
                self.answers.store(turn.text, generated[0], turn.scope, turn.context, stats, params, turn.started)

    def _hold_memory(self, turn: Turn, prompt: Prompt) -> bool:
        """For a turn a server admits on a local model: whether the token tier now holds its
        memory until its checkout (`TokenTier.reserve`), so that turns let in together never
        wait for each other's memory; the caller releases it if the turn never runs."""
        if turn.admit is None or self.token_tier is None:
            return False
        return self.token_tier.reserve(turn.session_id, len(prompt.ids) + turn.params.max_new_tokens)

    def _admit(self, turn: Turn, prompt: Prompt, held: bool) -> None:
        """A server's admission control decides on a turn for a local model; it raises to refuse it."""
        tier = self.token_tier
        if turn.admit is None or tier is None:
            return
        prefix = self._system_ids if turn.prefix is None else turn.prefix
        turn.admit(len(prompt.ids) - tier.reusable(turn.session_id, prompt.ids, prefix), held, tier.restore_estimate(turn.session_id))

    def _cached(self, turn: Turn) -> CacheHit | None:
        """The answer cache's answer for the turn, looked up only once no flow or action answers it."""
        if self.answers is None or turn.scope is None:
            return None
        return self.answers.lookup(turn.text, turn.scope, turn.context, turn.params)

    def _commit(self, conversation: Conversation, turn: Turn) -> None:
        """Store the reply and everything the turn changed, in one write; then the in-memory follow-ups."""
        assert turn.reply is not None
        context = turn.context
        if self.coordinator is not None:
            self.coordinator.after_reply(conversation, context, turn.id)
        meta = {
            "tier": turn.stats.tier,
            "finish_reason": turn.stats.finish_reason,
            "ttft_s": turn.stats.ttft_s,
            "reused_tokens": turn.stats.reused_tokens,
            "prefilled_tokens": turn.stats.prefilled_tokens,
            "answer_cache_hit": turn.stats.answer_cache_hit,
            "intent": context.intent,
            "drift": context.drift,
            "dialogue_state": context.dialogue_state,
            "action": turn.action.as_dict() if turn.action is not None else None,
        }
        self.conversations.commit(conversation, turn.user, turn.user_seq, turn.reply, meta)
        turn.committed = True
        if self.prefetcher is not None:
            previous = self.turn_tier.get(turn.session_id, "last_question")
            current = (turn.text, context.intent)
            self.turn_tier.put(turn.session_id, "last_question", current)
            self.prefetcher.after_turn(turn.session_id, [previous, current] if previous else [current])

    def _reply_of(self, turn: Turn) -> Reply:
        """The caller's reply; empty for a message left for the person a session was handed to."""
        turn.stats.total_s = time.perf_counter() - turn.started
        turn.stats.kv_bytes = self.token_tier.resident_bytes() if self.token_tier is not None else 0
        context = turn.context
        return Reply(
            turn.session_id,
            turn.reply.content if turn.reply is not None else "",
            list(turn.reply.generated_ids or ()) if turn.reply is not None else [],
            turn.stats,
            intent=context.intent,
            confidence=context.confidence,
            dialogue_state=context.dialogue_state,
            action=turn.action,
        )

    def _check_fits(self, system: Message | None, user: Message, max_new_tokens: int) -> None:
        """Refuse a message that cannot fit the context window even with no history."""
        alone = self.renderer.conversation_ids([*([system] if system else []), user], RenderedSegments())
        if len(alone) > self.context_window - max_new_tokens:
            raise ContextWindowError(
                f"The message is {len(alone) - len(self._system_ids)} tokens; with the system prompt "
                f"({len(self._system_ids)} tokens) and {max_new_tokens} reply tokens it exceeds the "
                f"context window of {self.context_window}. Shorten it or lower max_new_tokens."
            )

    def _plan(self, conversation: Conversation, turn: Turn) -> Prompt:
        """The prompt: a session's turns that fit, or the given conversation whole."""
        if not turn.given:
            laid_out, start = self._layout_prompt(conversation, turn.user, turn.params.max_new_tokens, conversation.segments)
            conversation.context_start = start  # from now on, and after a restart once the turn commits
            # The user's segment is not memoized: if this turn fails, another message takes its place.
            del conversation.segments.ids[len(conversation.window()) :]
            return laid_out
        messages = [*conversation.window(), turn.user]
        prompt = (turn.renderer or self.renderer).conversation_ids(messages, RenderedSegments())
        if len(prompt) + turn.params.max_new_tokens > self.context_window:
            raise ContextWindowError(
                f"The conversation is {len(prompt)} tokens; with {turn.params.max_new_tokens} reply tokens it exceeds "
                f"the context window of {self.context_window}. Send fewer or shorter messages, or lower max_new_tokens."
            )
        return Prompt(prompt, messages)

    def _layout_prompt(
        self, conversation: Conversation, user: Message, max_new_tokens: int, memo: RenderedSegments
    ) -> tuple[Prompt, int]:
        """The conversation plus `user`, dropping the oldest whole turns that do not fit, and
        the window start that leaves; it changes nothing but `memo`, the rendered segments.

        A turn keeps the start (`_plan`): dropped turns stay dropped on later turns, so the
        prompt's start stays stable and the token tier (or a remote server's prefix cache) keeps
        reusing it. The system prompt is never dropped.
        """
        room = self.context_window - max_new_tokens
        start = conversation.context_start
        while True:
            if start != conversation.context_start:
                memo.ids.clear()
            messages = [*conversation.window(start), user]
            prompt = self.renderer.conversation_ids(messages, memo)
            if len(prompt) <= room:
                return Prompt(prompt, messages, start // 2), start
            start += 2  # one user message and its reply

    def _prefetch(self, session_id: str, question: str, should_stop: Callable[[], bool]) -> bool:
        """ACPC: answer `question` into the answer cache as the session's next turn would ask it,
        from the same steps: the scope `_understand` gives a turn that no flow steers, the prompt
        `_plan` lays out, the model on a copy of the session's KV. The session itself is left as
        it is (its dialogue, window and KV). False if skipped or stopped.
        """
        assert self.answers is not None and isinstance(self.runner, ModelRunner)  # the constructor refuses prefetch on a remote model
        conversation = self.conversations.open(session_id, create=False)
        if not conversation.lock.acquire(blocking=False):
            return False  # the session is in a turn: its own answer comes first
        try:
            where = self.answers.scope(conversation, TurnContext(), question)
            if where is None or not where.storable or self.answers.cache.contains(question, where.scope):
                return False
            params = GenerationConfig()
            memo = RenderedSegments([list(segment) for segment in conversation.segments.ids])
            prompt, start = self._layout_prompt(conversation, Message("user", question), params.max_new_tokens, memo)
            if start != conversation.context_start:
                return False  # the turn would drop old turns, and how many depends on its own max_new_tokens
        finally:
            conversation.lock.release()
        started = time.perf_counter()
        completion = self.runner.complete(prompt.ids, self.runner.token_tier.copy_for(session_id, prompt.ids), params, should_stop)
        return completion is not None and self.answers.store_prefetched(question, completion, where, started)
