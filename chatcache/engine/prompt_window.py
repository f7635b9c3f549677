"""The prompt inside the context window: what a turn's model is shown, and what cannot fit.

A session's prompt is the system prompt and the turns that fit with the reply's room, the
oldest whole turns dropped first; once dropped they stay dropped (the window's start is kept
with the conversation), so the prompt's start stays stable and the token tier, or a remote
server's prefix cache, keeps reusing it. A conversation the caller keeps is taken whole, or
refused. Nothing here touches a tier: laying out only renders token ids.
"""

from __future__ import annotations

from ..errors import ContextWindowError
from ..model.prompt import Message, Prompt, PromptRenderer, RenderedSegments
from ..tiers.conversations import Conversation
from .turn_record import Turn


class PromptWindow:
    """Lays out a turn's prompt within `context_window` tokens, prompt and reply together.

    Args:
        renderer: renders messages into token ids (the model's chat template).
        context_window: prompt plus reply limit, in tokens.
        system_ids: the system prompt's ids, for the messages of a refusal.
    """

    def __init__(self, renderer: PromptRenderer, context_window: int, system_ids: list[int]) -> None:
        self.renderer = renderer
        self.context_window = context_window
        self.system_ids = system_ids

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
        """The prompt: a session's turns that fit, or the given conversation whole.

        Raises:
            ContextWindowError: a given conversation does not fit (a session's drops old turns).
        """
        if turn.given is None:
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
