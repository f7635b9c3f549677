"""What a server's admission control may ask of the engine before a turn runs, cheaply: whether
the turn might be served without the model, and the least it will cost the model.

Both answer from memory alone (the tokenizer, the token tier's bookkeeping, the answer cache's
exact index), so a saturated server can refuse a turn at once instead of queueing it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatcache.dialog import BotDefinition

from ..answer_cache.answering import CachedAnswers
from ..errors import InvalidMessageError
from ..model.prompt import Message, PromptRenderer
from ..model.tools import ToolChoice
from ..reply_format import ReplyFormat
from ..tiers.token_tier import TokenTier
from .given import GivenConversations
from .sessions import Sessions


@dataclass(frozen=True)
class LeastCost:
    """The least one turn will cost the model, known before any of its work (`least_cost`)."""

    prefill_tokens: int  # its message's own: everything before it may be in the KV
    kv_tokens: int  # held while it runs: the KV the conversation has (at least its system prompt), the message and the reply
    restore_s: float  # restoring the conversation's KV from disk, if that is where it is


class AdmissionEstimates:
    """The engine's side of admission control (`chatcache.serving.admission` decides)."""

    def __init__(
        self,
        renderer: PromptRenderer,
        system_ids: list[int],
        token_tier: TokenTier | None,
        bot: BotDefinition | None,
        answers: CachedAnswers | None,
        sessions: Sessions,
        given: GivenConversations,
    ) -> None:
        self._renderer = renderer
        self._system_ids = system_ids
        self._token_tier = token_tier
        self._bot = bot
        self._answers = answers
        self._sessions = sessions
        self._given = given

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
        if self._bot is not None:
            return True
        answers = self._answers
        if answers is None or temperature > 0:
            return False
        if (messages is None or messages[-1].role == "user") and not answers.cache.knows(text):
            return False  # no scope holds the text: no exact hit, whatever the context
        formats = [reply_format.key if reply_format else ""]
        if messages is not None:
            try:
                given, question, bot, formats = self._given.exact_keys(messages, formats[0], tools, tool_choice, parallel_tool_calls, max_new_tokens)
            except (InvalidMessageError, ValueError):
                return True  # the turn itself says what is wrong with it
            return answers.holds_exact(given, question, bot, formats)
        assert session_id is not None
        memory = self._sessions.loaded(session_id)
        if memory is None:
            return False  # reading its scope would take the database; and "some scope holds it" must not leak
        if not memory.lock.acquire(blocking=False):
            return True  # a turn runs on it: this one waits behind it anyway
        try:
            return answers.holds_exact(memory.conversation, text, reply_formats=formats)
        finally:
            memory.lock.release()

    def least_cost(self, text: str, kv_key: str, max_new_tokens: int) -> LeastCost:
        """The least a turn on `text` will cost the model, for the conversation whose KV the token
        tier keeps under `kv_key` (a session id, or a given conversation's key). Cheap (the
        tokenizer and the tier's bookkeeping), so admission control can refuse a turn that surely
        cannot start in time, or surely finds no KV memory, before the engine runs it."""
        new = len(self._renderer.encode_text(text))
        tier = self._token_tier
        if tier is None:  # a remote model: its server keeps the KV
            return LeastCost(new, 0, 0.0)
        held = max(tier.held_tokens(kv_key), len(self._system_ids))  # a conversation starts with the system prompt
        return LeastCost(new, held + new + max_new_tokens, tier.restore_estimate(kv_key))
