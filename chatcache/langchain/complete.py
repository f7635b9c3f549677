"""Answer a whole message list (LangChain's way) on the engine's caches, without a session.

`ChatEngine.stream` keeps each session's history itself; LangChain sends the whole
conversation on every call instead. `complete` renders that list with the model's chat
template and hands it to the token tier under a key derived from the conversation's start
(its system and first user message), so the next call, which repeats the same messages plus
one more turn, reuses the KV of the common prefix and prefills only the new tail. The
answer cache, when the engine has one, is consulted and filled with the same scope rules as
the engine's own turns (the bot's system prompt, then every message before the question; nothing
that carries personal data).

A reply we generated is remembered with its exact token ids (`ReplyIds`): when it comes back
as an `assistant` message in the next call it renders to the same ids the KV was computed
for, not to a re-tokenisation of its text that might differ.

This is written as a function over the engine's internals (read-only) so the engine files stay
untouched; it is meant to move into `ChatEngine` as a public `complete` method.
It deliberately does not drop old turns to fit the context window: a conversation that no
longer fits is refused, since the caller owns the history it sends.
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

from ..answer_cache import bot_fingerprint
from ..answer_cache.answering import AnswerScope, CachedAnswers
from ..config import GenerationConfig
from ..tiers.conversations import Conversation, check_storable
from ..errors import InvalidMessageError
from ..steering.hcac import TurnContext
from ..model.prompt import Message, RenderedSegments
from ..reply import Reply, ReplyStream, TurnStats

if TYPE_CHECKING:
    from ..engine import ChatEngine

ROLES = ("system", "user", "assistant")


class ReplyIds:
    """The token ids of recent replies, by their text (bounded, least recently used out)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, text: str, ids: Sequence[int]) -> None:
        with self._lock:
            self._ids[text] = tuple(ids)
            self._ids.move_to_end(text)
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)

    def attach(self, message: Message) -> Message:
        """`message` with the ids it was generated as, when it is one of our replies."""
        if message.role != "assistant" or message.generated_ids is not None:
            return message
        with self._lock:
            ids = self._ids.get(message.content)
        return Message("assistant", message.content, ids) if ids is not None else message


class _KeyLocks:
    """One lock per token-tier key: a key's turns must not overlap (the token tier's rule).

    A lock lives while a turn holds it or waits for it, then goes: conversations come and go,
    and their locks must not pile up.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
        self._guard = threading.Lock()

    def get(self, key: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock


# Per-engine state, dropped with the engine (an id() key could be reused by a later engine).
_state_of: weakref.WeakKeyDictionary[ChatEngine, tuple[ReplyIds, _KeyLocks]] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _state(engine: ChatEngine) -> tuple[ReplyIds, _KeyLocks]:
    with _registry_lock:
        if engine not in _state_of:
            _state_of[engine] = (ReplyIds(), _KeyLocks())
        return _state_of[engine]


def conversation_key(messages: Sequence[Message]) -> str:
    """Token-tier key of a conversation: its system message (if any) and first user message."""
    head: list[Message] = []
    for message in messages:
        head.append(message)
        if message.role == "user":
            break
    raw = "\0".join(f"{m.role}:{m.content}" for m in head)
    return "lc:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


def complete(
    engine: ChatEngine,
    messages: Sequence[Message],
    *,
    kv_key: str | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
) -> ReplyStream:
    """Answer the last user message of `messages`, streaming text pieces.

    Args:
        engine: the engine whose model, token tier and answer cache serve the call.
        messages: the whole conversation, oldest first, ending with a user message; without a
            system message the engine's system prompt (if any) is put first.
        kv_key: the token-tier entry to reuse and update; by default derived from the
            conversation's system and first user message (`conversation_key`).
        max_new_tokens, temperature, top_p, stop, seed: as for `ChatEngine.stream`.

    Returns:
        A `ReplyStream`; its `reply.stats` say how the prompt was served. Nothing is recorded
        in the session tier.

    Raises:
        InvalidMessageError: no messages, an unknown role, a last message that is not the
            user's or is empty (at once), or a conversation that does not fit the context
            window (when iteration starts). Nothing is cached for a failed call.
    """
    params = GenerationConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=tuple([stop] if isinstance(stop, str) else stop or ()),
        seed=seed,
    )
    conversation = _checked(engine, messages)
    key = kv_key or conversation_key(conversation)
    holder: list[Reply] = []
    return ReplyStream(_run(engine, conversation, key, params, holder), lambda: holder[0] if holder else None)


def _checked(engine: ChatEngine, messages: Sequence[Message]) -> list[Message]:
    if not messages:
        raise InvalidMessageError("No messages: send at least one user message.")
    for message in messages:
        if message.role not in ROLES:
            raise InvalidMessageError(f"Unknown role {message.role!r}: use one of {', '.join(ROLES)}.")
        check_storable(message.content, f"A {message.role} message")  # the tokenizer and the answer cache would fail on it later
    if messages[-1].role != "user":
        raise InvalidMessageError(f"The last message must be the user's, not the {messages[-1].role}'s.")
    if not messages[-1].content.strip():
        raise InvalidMessageError("The message is empty: type something to send.")
    conversation = list(messages)
    if conversation[0].role != "system" and engine.system_prompt:
        conversation.insert(0, Message("system", engine.system_prompt))
    return conversation


def _scope(answers: CachedAnswers, conversation: list[Message]) -> AnswerScope | None:
    """The engine's scope rules, on a conversation that brings its own system prompt (the bot)."""
    system = conversation[0] if conversation[0].role == "system" else None
    earlier = conversation[1 if system else 0 : -1]
    held = Conversation("langchain", system=system, turns=list(earlier))
    bot = bot_fingerprint(system.content if system else None)
    return answers.scope(held, TurnContext(), conversation[-1].content, bot=bot)


def _run(
    engine: ChatEngine, conversation: list[Message], key: str, params: GenerationConfig, holder: list[Reply]
) -> Generator[str, None, None]:
    started = time.perf_counter()
    reply_ids, key_locks = _state(engine)
    question = conversation[-1].content
    stats = TurnStats()
    answers = engine.answers
    scope = _scope(answers, conversation) if answers is not None else None
    hit = answers.lookup(question, scope, TurnContext(), params) if answers and scope else None
    if hit is not None:
        stats.tier, stats.finish_reason, stats.answer_cache_hit = "answer", "cache", True
        stats.ttft_s = stats.total_s = time.perf_counter() - started
        yield hit.answer
        holder.append(Reply(key, hit.answer, [], stats))
        return
    rendered = [reply_ids.attach(m) for m in conversation]
    prompt = engine.renderer.conversation_ids(rendered, RenderedSegments())
    if len(prompt) + params.max_new_tokens > engine.context_window:
        raise InvalidMessageError(
            f"The conversation is {len(prompt)} tokens; with {params.max_new_tokens} reply tokens it exceeds "
            f"the context window of {engine.context_window}. Send fewer or shorter messages, or lower max_new_tokens."
        )
    # The conversation's own system message is the shared prefix: other conversations with the
    # same instructions start from its KV.
    system = engine.renderer.system_ids(conversation[0].content) if conversation[0].role == "system" else []
    out: list[Message] = []
    engine.resident.touch(key)  # its KV and heat are let go of like an idle session's
    with key_locks.get(key):
        yield from engine.runner.stream(key, prompt, params, stats, started, out, prefix=system)
    if not out:
        return
    reply = out[0]
    if stats.finish_reason != "stop":  # a reply cut at a stop string is not its ids' text
        reply_ids.remember(reply.content, reply.generated_ids or ())
    if answers is not None and scope is not None:
        answers.store(question, reply, scope, TurnContext(), stats, params, started)
    stats.total_s = time.perf_counter() - started
    stats.kv_bytes = engine.token_tier.resident_bytes()
    holder.append(Reply(key, reply.content, list(reply.generated_ids or ()), stats))
