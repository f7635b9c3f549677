"""One turn, top to bottom (`TurnPipeline.run`), carried through named steps by one `Turn` record.

- **receive**: the message is checked against the context window, then recorded in the
  session tier, once, on arrival: whatever happens next, the user's words are not lost. A turn
  that a server's admission control refuses (the client is told to retry) takes its message
  back, so a refused turn changes nothing.
- **understand**: the dialogue layer and drift detection read the turn and steer the tiers
  (`steering/hcac.py`); the answer cache's scope follows. Returns what it read.
- **serve**: the flow's own question, its action's response, a cached answer, or the model on
  the session's KV from the token tier, prefilling only what it lacks (`model_runner.py`), on a
  prompt laid out (**plan**) from the system prompt with confirmed facts and the turns that fit.
- **commit**: the reply, dialogue state, prompt window and facts in one write.

A failed turn keeps the user's message in the record and changes nothing else; a cancelled
one keeps what was said. A conversation the caller keeps (`run_given`: LangChain's way, an
OpenAI-style request) goes through understand and serve and records nothing.

The served reply reaches the caller through a holder list, not a return value: a reader that
stops reading closes the generator, and a closed generator's return value is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from chatcache.dialog import ActionContext, ActionOutcome, Actions

from ..answer_cache import CacheHit
from ..answer_cache.answering import AnswerScope, CachedAnswers
from ..config import GenerationConfig
from ..errors import ContextWindowError
from ..model.prompt import Message, Prompt, PromptRenderer, RenderedSegments, ReplyIds
from ..model.remote import RemoteRunner
from ..model.text_stream import token_pieces
from ..model_runner import ModelRunner
from ..reply import Reply, TurnStats
from ..steering.hcac import ContextCoordinator, TurnContext
from ..steering.session_memory import SessionMemory
from ..tiers.conversations import Conversation
from ..tiers.token_tier import TokenTier
from .sessions import Sessions

Admit = Callable[[int, bool, float], None]
"""Admission control for one turn: called with the prompt tokens the model would have to
prefill, whether the token tier has the memory for the turn now (else it would wait for a
running turn to end) and the seconds a restore of the session's KV from disk would take,
before the model runs; it raises to refuse the turn (the server's 429)."""


@dataclass
class Turn:
    """One user turn as it flows through the steps; each step fills in what it decided."""

    session_id: str  # also the token tier's entry: the session, or the given conversation's key
    params: GenerationConfig
    started: float
    user: Message
    given: bool = False  # the caller keeps the conversation (`complete`): nothing is recorded
    prefix: list[int] | None = None  # the shared system-prompt ids to start from (default: the engine's)
    renderer: PromptRenderer | None = None  # lays out a given conversation (default: the engine's; one with tools)
    bot: str | None = None  # the answer cache's bot fingerprint (default: the engine's)
    admit: Admit | None = None
    created_session: bool = False  # this turn created its session (one refused deletes it again)
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


@dataclass(frozen=True)
class Understanding:
    """What the understand step read: the dialogue's and drift's verdict, and the answer cache's scope."""

    context: TurnContext
    scope: AnswerScope | None


class TurnPipeline:
    """The steps of a turn over the engine's parts; one pipeline serves every session of an engine."""

    def __init__(
        self,
        *,
        renderer: PromptRenderer,
        context_window: int,
        system_ids: list[int],
        system_prompt: str | None,
        sessions: Sessions,
        runner: ModelRunner | RemoteRunner,
        token_tier: TokenTier | None,
        coordinator: ContextCoordinator | None,
        answers: CachedAnswers | None,
        actions: Actions | None,
        tenant: str,
        prefetch: bool,
    ) -> None:
        """With `prefetch` (and an answer cache), the likely next question of a session is
        answered in the background while no user turn runs (`prefetch`)."""
        self.renderer = renderer
        self.context_window = context_window
        self.system_ids = system_ids
        self._bare_system = Message("system", system_prompt) if system_prompt else None
        self.sessions = sessions
        self.runner = runner
        self.token_tier = token_tier
        self.coordinator = coordinator
        self.answers = answers
        self.actions = actions
        self.tenant = tenant
        self.reply_ids = ReplyIds()  # our replies as `complete` callers send them back
        self._running = 0  # user turns running now: prefetch waits for none
        self._running_lock = threading.Lock()
        self.prefetcher = answers.prefetcher(sessions.store, self.prefetch, lambda: self.busy) if prefetch and answers else None

    @property
    def busy(self) -> bool:
        """Whether a user turn is running (prefetch stays out of its way)."""
        return self._running > 0

    def counted(self, pieces: Generator[str, None, None]) -> Generator[str, None, None]:
        """`pieces`, with the pipeline marked busy while they run."""
        with self._running_lock:
            self._running += 1
        try:
            yield from pieces
        finally:
            with self._running_lock:
                self._running -= 1

    # -- a session's turn --------------------------------------------------------------

    def run(self, session_id: str, text: str, params: GenerationConfig, holder: list[Reply], admit: Admit | None) -> Generator[str, None, None]:
        """One turn of a session, through its steps in order: receive, understand, serve, commit."""
        turn = Turn(session_id, params, time.perf_counter(), Message("user", text), admit=admit)
        # Checked before the session is opened, so an oversized first message creates nothing; a
        # new session's system message is the bot's prompt alone (it has no facts yet).
        self.check_fits(self._bare_system, turn.user, params.max_new_tokens)
        with self.sessions.hold(session_id, create=True) as memory, self.sessions.conversations.turn(memory.conversation) as rebuilt:
            conversation = memory.conversation
            if rebuilt:  # another process answered turns since: what this one derived from the old copy is stale
                memory.forget_topic()
            try:
                if conversation.system != self._bare_system:  # the session's facts lengthen the system message
                    self.check_fits(conversation.system, turn.user, params.max_new_tokens)
                turn.created_session = conversation.created_empty
                turn.user_seq = self.sessions.conversations.record_user(conversation, text, len(self.renderer.encode_text(text)))
                understood = self.understand(conversation, turn, memory)
                turn.context, turn.scope = understood.context, understood.scope
                try:
                    yield from self.serve(conversation, turn)
                except GeneratorExit:
                    pass  # the reader stopped: the model's reply keeps what was generated
                if turn.reply is not None:
                    self.commit(memory, turn)
            finally:
                if not turn.committed:  # what the turn changed in memory was never stored
                    self.sessions.forget(session_id)  # rebuilt from the record, its drift topic from the stored turns
                    self.sessions.conversations.discard_if_created_empty(conversation)
            if turn.committed or (turn.context.awaiting_agent and turn.user_seq == conversation.last_seq):
                holder.append(self.reply_of(turn))

    def run_given(self, conversation: Conversation, turn: Turn, holder: list[Reply]) -> Generator[str, None, None]:
        """A turn on a conversation the caller keeps: understand and serve, with nothing to record."""
        with self.sessions.hold_kv(turn.session_id):  # one turn at a time on the key's KV
            turn.user_seq = conversation.last_seq + 1
            understood = self.understand(conversation, turn, None)
            turn.context, turn.scope = understood.context, understood.scope
            try:
                yield from self.serve(conversation, turn)
            except GeneratorExit:
                pass  # the reader stopped: the model's reply keeps what was generated
        reply = turn.reply
        if reply is None:
            return
        if reply.generated_ids and turn.stats.finish_reason != "stop":  # a reply cut at a stop string is not its ids' text
            self.reply_ids.remember(reply.content, reply.generated_ids)
        holder.append(self.reply_of(turn))

    # -- the steps -----------------------------------------------------------------------

    def understand(self, conversation: Conversation, turn: Turn, memory: SessionMemory | None) -> Understanding:
        """The dialogue layer and drift detection read the turn (and steer the session's
        `memory`; a given conversation has none); the answer cache's scope follows."""
        context = TurnContext()
        if self.coordinator is not None and memory is not None:  # the dialogue state lives in a session
            context = self.coordinator.before_reply(memory, turn.text, turn.id)
        turn.stats.drift, turn.stats.drift_undone, turn.stats.promoted = context.drift, context.reset_undone, context.promoted
        scope = None
        if self.answers is not None:
            reply_format = turn.params.reply_format
            scope = self.answers.scope(conversation, context, turn.text, bot=turn.bot, reply_format=reply_format.key if reply_format else "")
        return Understanding(context, scope)

    def serve(self, conversation: Conversation, turn: Turn) -> Generator[str, None, None]:
        """The reply: the flow's own question, its action's response, a cached answer, or the
        model on the session's KV; left in `turn.reply` (see the module's docstring for why)."""
        stats, params = turn.stats, turn.params
        if turn.context.awaiting_agent:  # handed off: the message waits for the person, nobody replies now
            stats.tier, stats.finish_reason, stats.ttft_s = "agent", "handed_off", time.perf_counter() - turn.started
            return
        if turn.context.action is not None and self.actions is not None and turn.context.intent is not None:
            # The flow acts: the bot's code runs, and its response template is the reply.
            slots = {str(k): str(v) for k, v in conversation.dialogue.slots.items()} if conversation.dialogue else {}
            who = ActionContext(self.tenant, self.sessions.conversations.user_id, turn.session_id, turn.id)
            turn.action = self.actions.perform(turn.context.intent, slots, who)
            stats.tier, stats.finish_reason, stats.ttft_s = "action", "action", time.perf_counter() - turn.started
            # What the flow says after the action's reply: the answer to, or offer of, a second request.
            said = "\n\n".join(part for part in (turn.action.reply, turn.context.bot_reply) if part)
            yield said
            turn.reply = Message("assistant", said)
        elif turn.context.bot_reply is not None:
            # The flow needs a slot or a confirmation: the bot's own question is the answer.
            stats.tier, stats.finish_reason, stats.ttft_s = "dialog", "flow", time.perf_counter() - turn.started
            yield turn.context.bot_reply
            turn.reply = Message("assistant", turn.context.bot_reply)
        elif (hit := self._cached(turn)) is not None:
            assert self.answers is not None
            stats.tier, stats.finish_reason, stats.answer_cache_hit = "answer", "cache", True
            stats.ttft_s = time.perf_counter() - turn.started
            yield from token_pieces(self.renderer.tokenizer, hit.answer)  # streamed as a generated answer would be, for UIs and callbacks
            turn.reply = Message("assistant", hit.answer)
            self.answers.maybe_audit(hit, params, lambda: self.plan(conversation, turn))
        else:
            prompt = self.plan(conversation, turn)
            stats.dropped_turns = prompt.dropped_turns
            self._admit(conversation, turn, prompt)
            generated: list[Message] = []
            try:
                yield from self.runner.stream(turn.session_id, prompt, params, stats, turn.started, generated, turn.prefix)
            finally:  # also when the reader stopped: the runner kept what was generated
                if generated:
                    turn.reply = generated[0]
            if self.answers is not None and turn.scope is not None and generated:
                self.answers.store(turn.text, generated[0], turn.scope, turn.context, stats, params, turn.started)

    def _admit(self, conversation: Conversation, turn: Turn, prompt: Prompt) -> None:
        """A server's admission control decides on a model turn on a local model; a refused turn
        takes back its recorded message and gives back the memory it held (`TokenTier.reserve`,
        so that turns let in together never wait for each other's memory)."""
        tier = self.token_tier
        if turn.admit is None or tier is None:
            return
        held = tier.reserve(turn.session_id, len(prompt.ids) + turn.params.max_new_tokens)
        prefix = self.system_ids if turn.prefix is None else turn.prefix
        try:
            turn.admit(len(prompt.ids) - tier.reusable(turn.session_id, prompt.ids, prefix), held, tier.restore_estimate(turn.session_id))
        except BaseException:
            if held:
                tier.release(turn.session_id)
            if not turn.given:
                self.sessions.conversations.withdraw_user(conversation, turn.user_seq, turn.created_session)
            raise

    def _cached(self, turn: Turn) -> CacheHit | None:
        """The answer cache's answer for the turn, looked up only once no flow or action answers it."""
        if self.answers is None or turn.scope is None:
            return None
        return self.answers.lookup(turn.text, turn.scope, turn.context, turn.params)

    def commit(self, memory: SessionMemory, turn: Turn) -> None:
        """Store the reply and everything the turn changed, in one write; then the in-memory follow-ups."""
        assert turn.reply is not None
        conversation, context = memory.conversation, turn.context
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
        self.sessions.conversations.commit(conversation, turn.user, turn.user_seq, turn.reply, meta)
        turn.committed = True
        if self.prefetcher is not None:
            previous = memory.entries.get("last_question")
            current = (turn.text, context.intent)
            memory.entries.put("last_question", current)
            self.prefetcher.after_turn(turn.session_id, [previous, current] if previous else [current])

    def reply_of(self, turn: Turn) -> Reply:
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

    # -- the prompt ----------------------------------------------------------------------

    def check_fits(self, system: Message | None, user: Message, max_new_tokens: int) -> None:
        """Refuse a message that cannot fit the context window even with no history.

        Raises:
            ContextWindowError: it does not fit.
        """
        alone = self.renderer.conversation_ids([*([system] if system else []), user], RenderedSegments())
        if len(alone) > self.context_window - max_new_tokens:
            raise ContextWindowError(
                f"The message is {len(alone) - len(self.system_ids)} tokens; with the system prompt "
                f"({len(self.system_ids)} tokens) and {max_new_tokens} reply tokens it exceeds the "
                f"context window of {self.context_window}. Shorten it or lower max_new_tokens."
            )

    def plan(self, conversation: Conversation, turn: Turn) -> Prompt:
        """The prompt: a session's turns that fit, or the given conversation whole."""
        if not turn.given:
            laid_out, start = self.layout(conversation, turn.user, turn.params.max_new_tokens, conversation.segments)
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

    def layout(self, conversation: Conversation, user: Message, max_new_tokens: int, memo: RenderedSegments) -> tuple[Prompt, int]:
        """The conversation plus `user`, dropping the oldest whole turns that do not fit, and
        the window start that leaves; it changes nothing but `memo`, the rendered segments.

        A turn keeps the start (`plan`): dropped turns stay dropped on later turns, so the
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

    # -- the next turn, ahead of time ----------------------------------------------------

    def prefetch(self, session_id: str, question: str, should_stop: Callable[[], bool]) -> bool:
        """ACPC: answer `question` into the answer cache as the session's next turn would ask it,
        from the same steps: the scope `understand` gives a turn that no flow steers, the prompt
        `plan` lays out, the model on a copy of the session's KV. The session itself is left as
        it is (its dialogue, window and KV). False if skipped or stopped.
        """
        assert self.answers is not None and isinstance(self.runner, ModelRunner)  # the engine refuses prefetch on a remote model
        memory = self.sessions.open(session_id, create=False)
        if not memory.lock.acquire(blocking=False):
            return False  # the session is in a turn: its own answer comes first
        try:
            conversation = memory.conversation
            where = self.answers.scope(conversation, TurnContext(), question)
            if where is None or not where.storable or self.answers.cache.contains(question, where.scope):
                return False
            params = GenerationConfig()
            memo = RenderedSegments([list(segment) for segment in conversation.segments.ids])
            prompt, start = self.layout(conversation, Message("user", question), params.max_new_tokens, memo)
            if start != conversation.context_start:
                return False  # the turn would drop old turns, and how many depends on its own max_new_tokens
        finally:
            memory.lock.release()
        started = time.perf_counter()
        completion = self.runner.complete(prompt.ids, self.runner.token_tier.copy_for(session_id, prompt.ids), params, should_stop)
        return completion is not None and self.answers.store_prefetched(question, completion, where, started)
