"""The engine's side of the answer cache: where an answer is valid, serving, storing, audits, prefetch.

The answer cache itself (`answer_cache/`) knows nothing about conversations or models. This
module decides, per turn, which context an answer belongs to (the scope), which replies may
be stored (finished greedy ones), samples served answers for an audit against the model,
finds the answers near a question it does not serve for the model to draft from, and keeps
what the engine answered in the background for the likely next question (ACPC).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from chatcache.storage import SessionStore

from . import AnswerCache, BoundStatus, CacheHit, Scope
from .keys import AnswerScope, conversation_context, intent_context, normalize
from .personal import any_personal_data
from .verify import stems
from ..config import GenerationConfig
from ..tiers.conversations import Conversation
from ..steering.hcac import TurnContext
from ..model.generation import Completion
from ..model_runner import ModelRunner
from .prefetch import Answer, Prefetcher, TransitionModel
from ..model.prompt import Message, Prompt
from ..model.remote import RemoteRunner
from ..reply import TurnStats

DRAFT_ANSWERS = 3  # nearest cached questions whose answers a model turn drafts from


def answer_scope(
    base: Scope, user_id: str, conversation: Conversation, context: TurnContext, question: str
) -> AnswerScope | None:
    """Where a turn's answer may be found and kept; None: the turn is not cached at all.

    A turn whose question, prompt window, confirmed facts or slots carry personal data is never
    cached: its answer may repeat that data. Otherwise a context-free turn is shared by the
    bot's users, a follow-up only by this user after exactly the same conversation. A confirmed
    cacheable intent is shared by everyone asking it with the same slots, but only an answer the
    model wrote with no earlier turn in its prompt is kept there: the bot says such answers do
    not depend on the conversation, and one written after somebody's conversation could still
    repeat it. (`chatcache eval context` measures these keys on SGD conversations.)
    """
    window = conversation.turns[conversation.context_start :]
    dialogue = conversation.dialogue
    slots = {str(name): str(value) for name, value in dialogue.slots.items()} if dialogue is not None else {}
    told = [m.content for m in window] + [f.value for f in conversation.facts] + [*slots.values(), question]
    if any_personal_data(told):
        return None
    flow_answer = context.cacheable and context.confirmed and context.dialogue_state in ("ACTING", "DONE")
    if flow_answer and context.intent is not None:
        # The facts the model saw are the bot's own confirmed values, checked above; turns are the user's words.
        intent = replace(base, context=intent_context(context.intent, slots))
        return AnswerScope(intent, intent=True, across_users=True, storable=not window)
    if not window and not conversation.facts:
        return AnswerScope(base, intent=False, across_users=True, storable=True)
    seen = [(m.role, m.content) for m in conversation.window()]
    follow_up = replace(base, context=conversation_context(user_id, seen))
    return AnswerScope(follow_up, intent=False, across_users=False, storable=True)


class CachedAnswers:
    """Serves and fills the answer cache for one engine.

    Args:
        cache: the answer cache.
        base: the scope every answer of this engine shares (model, bot, tenant).
        runner: runs the model for audits.
        user_id: the engine's user, whose follow-ups only they share.
        bot_texts: the bot's own wording (its system prompt, its intents' examples): words from
            it in a shared answer are nobody's particulars.
    """

    def __init__(
        self,
        cache: AnswerCache,
        base: Scope,
        runner: ModelRunner | RemoteRunner,
        user_id: str,
        bot_texts: Iterable[str] = (),
    ) -> None:
        self.cache = cache
        self.base = base
        self.runner = runner
        self.user_id = user_id
        self.common_words = frozenset(stem for text in bot_texts for stem in stems(text))
        self._audit_rng = random.Random(0)

    def scope(
        self, conversation: Conversation, context: TurnContext, question: str, bot: str | None = None, reply_format: str = ""
    ) -> AnswerScope | None:
        """Where this turn's answer may be found and kept (`answer_scope`); `bot` replaces the
        engine's bot fingerprint (the LangChain path: a conversation brings its own system
        prompt), and `reply_format` names the format the reply is held to (`ReplyFormat.key`)."""
        base = replace(self.base, bot=bot or self.base.bot, reply_format=reply_format)
        return answer_scope(base, self.user_id, conversation, context, question)

    def holds_exact(self, conversation: Conversation, question: str, bot: str | None = None, reply_formats: Sequence[str] = ("",)) -> bool:
        """Whether this exact question has a live answer where this turn could look, in one of
        the reply formats (`ReplyFormat.key`, "" for free text) the turn may be held to (no
        embedding: admission control asks it of every turn while the model is saturated)."""
        for reply_format in reply_formats:
            where = self.scope(conversation, TurnContext(), question, bot=bot, reply_format=reply_format)
            if where is None:
                continue
            base = replace(self.base, bot=bot or self.base.bot, reply_format=reply_format)
            # A topic change would empty the window: the context-free scope is a candidate too.
            if self.cache.contains(question, where.scope) or self.cache.contains(question, base):
                return True
        return False

    @staticmethod
    def _kept_decoding(params: GenerationConfig) -> bool:
        """Whether answers decoded so are served from and stored in the cache: plain greedy, the
        decoding every stored answer was made with. A sampled reply is meant to vary, and a
        repetition penalty gives other answers."""
        return params.temperature == 0 and params.repetition_penalty == 1.0

    def lookup(self, text: str, where: AnswerScope, context: TurnContext, params: GenerationConfig) -> CacheHit | None:
        """The stored answer for `text` in `where`, if one may be served for this turn."""
        if not self._kept_decoding(params) or context.bot_reply is not None:
            return None
        return self.cache.lookup(
            text,
            where.scope,
            embedding=context.embedding,
            intent_scoped=where.intent,
            across_users=where.across_users,
            common_words=self.common_words,
        )

    def near(self, text: str, where: AnswerScope, context: TurnContext) -> list[str]:
        """Cached answers to questions near `text` in the turn's scope, however near, for the
        model to draft its reply from when the cache does not serve one (`AnswerCache.nearest_answers`).

        Only the turn's own scope is searched, so a follow-up drafts only from its user's
        answers after the same conversation, and a turn that carries personal data has no scope
        (`answer_scope`). A drafted reply is the model's own whatever the drafts (greedy: token
        for token; sampled: in distribution), so a sampled turn drafts from them as a greedy one does.
        """
        return self.cache.nearest_answers(
            text,
            where.scope,
            DRAFT_ANSWERS,
            embedding=context.embedding,
            across_users=where.across_users,
            common_words=self.common_words,
        )

    def store(
        self,
        text: str,
        reply: Message,
        where: AnswerScope,
        context: TurnContext,
        stats: TurnStats,
        params: GenerationConfig,
        started: float,
    ) -> None:
        """Keep a finished greedy answer; the cache itself refuses uncertain (high-entropy) ones."""
        if not self._kept_decoding(params) or stats.finish_reason != "eos" or not where.storable:
            return
        self.cache.store(
            text,
            reply.content,
            where.scope,
            entropy_bits=stats.mean_entropy_bits,
            latency_ms=(time.perf_counter() - started) * 1000,
            embedding=context.embedding,
            intent=context.intent if where.intent else None,
        )

    def bound(self) -> BoundStatus | None:
        """The cache's error bound and what the audits measured (every replica's); None without a bound."""
        return self.cache.bound_status() if self.cache.config.max_error_rate is not None else None

    def maybe_audit(self, hit: CacheHit, params: GenerationConfig, prompt: Callable[[], Prompt]) -> None:
        """For a sample of hits, run the model anyway (from scratch) and record agreement."""
        if self._audit_rng.random() >= self.cache.config.audit_rate:
            return
        completion = self.runner.answer(prompt(), params)
        self.cache.record_audit(hit, normalize(completion.text) == normalize(hit.answer))

    def prefetcher(self, store: SessionStore, answer: Answer, busy: Callable[[], bool]) -> Prefetcher:
        """A background prefetcher whose next-question model is learned from the stored
        conversations; `answer` answers a predicted question (`TurnPipeline.prefetch`)."""
        model = TransitionModel()
        for session in store.list_sessions(limit=1000):
            records = store.messages(session.id)
            turns = []
            for index, record in enumerate(records):
                if record.role == "user":
                    reply = records[index + 1] if index + 1 < len(records) else None
                    turns.append((record.content, ((reply.meta or {}) if reply else {}).get("intent")))
            model.learn(turns)
        return Prefetcher(model, answer, busy)

    def store_prefetched(self, question: str, completion: Completion, where: AnswerScope, started: float) -> bool:
        """Keep an answer made ahead of its question, marked as prefetched, if the model ended it
        (a cut-off answer is not one); whether it was kept."""
        if not completion.ended:
            return False
        return self.cache.store(
            question,
            completion.text,
            where.scope,
            entropy_bits=completion.mean_entropy_bits,
            latency_ms=(time.perf_counter() - started) * 1000,
            prefetched=True,
        )
