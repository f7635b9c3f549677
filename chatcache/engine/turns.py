"""One turn, top to bottom (`TurnPipeline.run`): named steps over one `Turn` record, each
returning what it decided.

- **receive**: a session's message is checked against the context window, then recorded in
  the session tier, once, on arrival: whatever happens next, the user's words are not lost. A
  turn that a server's admission control refuses (the client is told to retry) takes its
  message back, so a refused turn changes nothing. A conversation the caller keeps (LangChain's
  way, an OpenAI-style request) is taken as given: nothing of it is recorded.
- **understand**: the dialogue layer, then drift detection (which reads the dialogue's intent),
  read the turn and steer the tiers (`steering/hcac.py`); the answer cache's scope follows.
- **serve**: the flow's own question, its action's response, a cached answer, or the model on
  the session's KV from the token tier, prefilling only what it lacks (`model_runner.py`), on a
  prompt laid out (**plan**) from the system prompt with confirmed facts and the turns that fit.
- **commit**: the reply, dialogue state, prompt window and facts in one write (of a given
  conversation, only the ids our reply was generated as, for when the caller sends it back).

A failed turn keeps the user's message in the record and changes nothing else; a cancelled
one keeps what the model said.

The turn yields the reply's pieces and returns the caller's `Reply`. A reader who stops reading
closes it, which Python delivers as `GeneratorExit` at the piece being handed out: the turn
catches it there, commits what was said and still returns the reply (`ReplyStream` keeps it).
Only the outermost generator can: one closed inside a `yield from` loses its return value, so
the serve step hands its reply over in what it returns (`Served`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager

from chatcache.dialog import ActionContext, ActionOutcome, Actions

from ..answer_cache import AnswerScope, CacheHit
from ..answer_cache.answering import CachedAnswers
from ..config import GenerationConfig
from ..model.prompt import Message, Prompt, PromptRenderer, RenderedSegments, ReplyIds
from ..model.remote import RemoteRunner
from ..model.text_stream import token_pieces
from ..model_runner import ModelRunner
from ..reply import Reply, ReplyStream
from ..steering.hcac import ContextCoordinator, TurnContext
from ..tiers.conversations import Conversation
from ..tiers.token_tier import TokenTier
from ..worker_threads import close_at_exit
from .prompt_window import PromptWindow
from .sessions import Sessions
from .turn_record import Received, Served, Turn, Understanding


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
        self.window = PromptWindow(renderer, context_window, system_ids)
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

    def stream(self, turn: Turn) -> ReplyStream:
        """The turn as its caller reads it, closed at exit if still open (its KV checked in while
        torch can still run).

        Raises:
            ConfigError: a decoding setting the remote model can never follow (at once).
        """
        if isinstance(self.runner, RemoteRunner):
            self.runner.check(turn.params)
        stream = ReplyStream(self.run(turn), self.sessions.memory.abandon_stream_after_s)
        close_at_exit(stream)
        return stream

    def close(self) -> None:
        """Stop prefetching."""
        if self.prefetcher is not None:
            self.prefetcher.close()

    # -- the turn ------------------------------------------------------------------------

    def run(self, turn: Turn) -> Generator[str, None, Reply | None]:
        """One turn, through its steps in order: receive, understand, serve, commit. Yields the
        reply's pieces and returns the caller's reply; None where nothing was said (a flow's or a
        cached reply whose reader stopped before its end)."""
        with self._counted(), self.receive(turn) as received:
            understood = self.understand(received, turn)
            served = self.serve(received, turn, understood)
            read_to_end = False
            try:
                yield from served.pieces
                read_to_end = True
            except GeneratorExit:
                pass  # the reader stopped: the model's reply keeps what was generated
            said = served.reply(read_to_end)
            self.commit(received, turn, understood, said, served.action)
        left_for_agent = understood.context.awaiting_agent and received.user_seq == received.conversation.last_seq
        return self.reply_of(turn, understood.context, said, served.action) if said is not None or left_for_agent else None

    @contextmanager
    def _counted(self) -> Iterator[None]:
        """The pipeline marked busy while a turn runs."""
        with self._running_lock:
            self._running += 1
        try:
            yield
        finally:
            with self._running_lock:
                self._running -= 1

    # -- the steps -----------------------------------------------------------------------

    @contextmanager
    def receive(self, turn: Turn) -> Iterator[Received]:
        """The turn's conversation held for it: a session's with its message recorded, its lock
        and its lease held; a given one's KV key locked (one turn at a time on that KV). A
        session's turn that fails forgets what it changed in memory, which was never stored.

        Raises:
            ContextWindowError: the message cannot fit the context window even with no history;
                checked before the session is opened, so an oversized first message creates nothing.
        """
        if turn.given is not None:
            with self.sessions.hold_kv(turn.session_id):
                yield Received(turn.given, None, turn.given.last_seq + 1)
            return
        # A new session's system message is the bot's prompt alone (it has no facts yet).
        self.window.check_fits(self._bare_system, turn.user, turn.params.max_new_tokens)
        with self.sessions.hold(turn.session_id, create=True) as memory, self.sessions.conversations.turn(memory.conversation) as rebuilt:
            conversation = memory.conversation
            if rebuilt:  # another process answered turns since: what this one derived from the old copy is stale
                memory.forget_topic()
            try:
                if conversation.system != self._bare_system:  # the session's facts lengthen the system message
                    self.window.check_fits(conversation.system, turn.user, turn.params.max_new_tokens)
                created = conversation.created_empty
                user_seq = self.sessions.conversations.record_user(conversation, turn.text, len(self.renderer.encode_text(turn.text)))
                yield Received(conversation, memory, user_seq, created)
            except BaseException:
                self.sessions.forget(turn.session_id)  # rebuilt from the record, its drift topic from the stored turns
                self.sessions.conversations.discard_if_created_empty(conversation)
                raise

    def understand(self, received: Received, turn: Turn) -> Understanding:
        """The dialogue layer and drift detection read the turn (and steer the session's memory;
        a given conversation has none); the answer cache's scope follows."""
        context = TurnContext()
        if self.coordinator is not None and received.memory is not None:  # the dialogue state lives in a session
            context = self.coordinator.before_reply(received.memory, turn.text, received.turn_id)
        scope = None
        if self.answers is not None:
            reply_format = turn.params.reply_format
            scope = self.answers.scope(received.conversation, context, turn.text, bot=turn.bot, reply_format=reply_format.key if reply_format else "")
        return Understanding(context, scope)

    def serve(self, received: Received, turn: Turn, understood: Understanding) -> Served:
        """Who answers: the flow's own question, its action's response, a cached answer, or the
        model on the session's KV; the answer's pieces are made as the turn reads them."""
        stats, context, conversation = turn.stats, understood.context, received.conversation
        if context.awaiting_agent:  # handed off: the message waits for the person, nobody replies now
            stats.tier, stats.finish_reason, stats.ttft_s = "agent", "handed_off", time.perf_counter() - turn.started
            return Served(iter(()))
        if context.action is not None and self.actions is not None and context.intent is not None:
            # The flow acts: the bot's code runs, and its response template is the reply.
            slots = {str(k): str(v) for k, v in conversation.dialogue.slots.items()} if conversation.dialogue else {}
            who = ActionContext(self.tenant, self.sessions.conversations.user_id, turn.session_id, received.turn_id)
            action = self.actions.perform(context.intent, slots, who)
            stats.tier, stats.finish_reason, stats.ttft_s = "action", "action", time.perf_counter() - turn.started
            # What the flow says after the action's reply: the answer to, or offer of, a second request.
            said = "\n\n".join(part for part in (action.reply, context.bot_reply) if part)
            return Served(iter([said]), said, action=action)
        if context.bot_reply is not None:
            # The flow needs a slot or a confirmation: the bot's own question is the answer.
            stats.tier, stats.finish_reason, stats.ttft_s = "dialog", "flow", time.perf_counter() - turn.started
            return Served(iter([context.bot_reply]), context.bot_reply)
        if (hit := self._cached(turn, understood)) is not None:
            stats.tier, stats.finish_reason, stats.answer_cache_hit = "answer", "cache", True
            stats.ttft_s = time.perf_counter() - turn.started
            return Served(self._cached_pieces(hit, conversation, turn), hit.answer)
        prompt = self.window.plan(conversation, turn)
        stats.dropped_turns = prompt.dropped_turns
        self._admit(received, turn, prompt)
        generated: list[Message] = []
        return Served(self._generated_pieces(turn, understood, prompt, generated), generated=generated)

    def _cached(self, turn: Turn, understood: Understanding) -> CacheHit | None:
        """The answer cache's answer for the turn, looked up only once no flow or action answers it."""
        if self.answers is None or understood.scope is None:
            return None
        return self.answers.lookup(turn.text, understood.scope, understood.context, turn.params)

    def _cached_pieces(self, hit: CacheHit, conversation: Conversation, turn: Turn) -> Generator[str, None, None]:
        """A cached answer streamed as a generated one would be (for UIs and callbacks); a sample
        of those read to the end is audited against the model."""
        assert self.answers is not None
        yield from token_pieces(self.renderer.tokenizer, hit.answer)
        self.answers.maybe_audit(hit, turn.params, lambda: self.window.plan(conversation, turn))

    def _generated_pieces(self, turn: Turn, understood: Understanding, prompt: Prompt, generated: list[Message]) -> Generator[str, None, None]:
        """The model's reply on the turn's KV, handed over in `generated`; a local model's drafted
        from the cached answers near the question; one it ended itself may be stored in the answer cache."""
        if isinstance(self.runner, ModelRunner):
            answers = self._near_answers(turn, understood) if self.runner.drafting else []
            yield from self.runner.stream(turn.session_id, prompt, turn.params, turn.stats, turn.started, generated, turn.prefix, answers)
        else:  # a server decodes as it will: drafts are its own business
            yield from self.runner.stream(turn.session_id, prompt, turn.params, turn.stats, turn.started, generated, turn.prefix)
        if self.answers is not None and understood.scope is not None and generated:
            self.answers.store(turn.text, generated[0], understood.scope, understood.context, turn.stats, turn.params, turn.started)

    def _near_answers(self, turn: Turn, understood: Understanding) -> list[str]:
        """Cached answers near the turn's question in its scope (none without one), which the
        cache did not serve, for the model to draft its reply from."""
        if self.answers is None or understood.scope is None:
            return []
        return self.answers.near(turn.text, understood.scope, understood.context)

    def _admit(self, received: Received, turn: Turn, prompt: Prompt) -> None:
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
            if turn.given is None:
                self.sessions.conversations.withdraw_user(received.conversation, received.user_seq, received.created_session)
            raise

    def commit(self, received: Received, turn: Turn, understood: Understanding, said: Message | None, action: ActionOutcome | None) -> None:
        """Store the reply and everything the turn changed, in one write; then the in-memory
        follow-ups. A session's turn that said nothing forgets what it changed in memory; of a
        given conversation only the ids our reply was generated as are kept, for when it is sent back."""
        memory, context = received.memory, understood.context
        if memory is None:
            if said is not None and said.generated_ids and turn.stats.finish_reason != "stop":  # a reply cut at a stop string is not its ids' text
                self.reply_ids.remember(said.content, said.generated_ids)
            return
        if said is None:
            self.sessions.forget(turn.session_id)  # rebuilt from the record, its drift topic from the stored turns
            return
        conversation = memory.conversation
        if self.coordinator is not None:
            self.coordinator.after_reply(conversation, context, received.turn_id)
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
            "action": action.as_dict() if action is not None else None,
        }
        self.sessions.conversations.commit(conversation, turn.user, received.user_seq, said, meta)
        if self.prefetcher is not None:
            previous = memory.entries.get("last_question")
            current = (turn.text, context.intent)
            memory.entries.put("last_question", current)
            self.prefetcher.after_turn(turn.session_id, [previous, current] if previous else [current])

    def reply_of(self, turn: Turn, context: TurnContext, said: Message | None, action: ActionOutcome | None) -> Reply:
        """The caller's reply; empty for a message left for the person a session was handed to."""
        stats = turn.stats
        stats.total_s = time.perf_counter() - turn.started
        stats.kv_bytes = self.token_tier.resident_bytes() if self.token_tier is not None else 0
        stats.drift, stats.drift_undone, stats.promoted = context.drift, context.reset_undone, context.promoted
        return Reply(
            turn.session_id,
            said.content if said is not None else "",
            list(said.generated_ids or ()) if said is not None else [],
            stats,
            intent=context.intent,
            confidence=context.confidence,
            dialogue_state=context.dialogue_state,
            action=action,
        )

    # -- the next turn, ahead of time ----------------------------------------------------

    def answer_scope(self, session_id: str, question: str) -> AnswerScope | None:
        """Where `understand` would put `question` as the session's next turn, were no flow to
        steer it (`CachedAnswers.scope`); None without an answer cache or for a turn it never
        keeps. Waits for a turn running on the session; records nothing.

        Raises:
            UnknownSessionError: no such session.
        """
        if self.answers is None:
            return None
        with self.sessions.hold(session_id, create=False) as memory:
            return self.answers.scope(memory.conversation, TurnContext(), question)

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
            prompt, start = self.window.layout(conversation, Message("user", question), params.max_new_tokens, memo)
            if start != conversation.context_start:
                return False  # the turn would drop old turns, and how many depends on its own max_new_tokens
        finally:
            memory.lock.release()
        started = time.perf_counter()
        completion = self.runner.complete(prompt.ids, self.runner.token_tier.copy_for(session_id, prompt.ids), params, should_stop)
        return completion is not None and self.answers.store_prefetched(question, completion, where, started)
