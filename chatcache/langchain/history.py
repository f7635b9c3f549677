"""`SessionChatHistory`: a LangChain chat history kept in chatcache's session tier.

Each message is a row of the session's messages in the `SessionStore` database (SQLite by
default, any SQLAlchemy URL), so a `RunnableWithMessageHistory` chain continues a
conversation across processes. What `CachedChatModel` takes is kept: text messages, AI
messages' tool calls and tool results, each row holding the text the model reads and, in its
meta, the LangChain message whole (ids, names, status), which is what reading gives back.
Anything else is a `ValueError`, as for `CachedChatModel`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, message_to_dict, messages_from_dict

from chatcache import written
from chatcache.storage import SessionStore, UnknownSessionError

from .messages import converted

_MESSAGE = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


class SessionChatHistory(BaseChatMessageHistory):
    """The messages of one session in the session tier.

    Args:
        session_id: the session (created on the first message).
        store: a `SessionStore`, a SQLAlchemy URL, or None for the data directory's database.
        user_id: owner recorded on a new session.
        bot: bot name recorded on a new session.
        count_tokens: counts a message's tokens for the record (e.g. `model.get_num_tokens`);
            by default its words stand in, as a history has no tokenizer of its own.
    """

    def __init__(
        self,
        session_id: str,
        store: SessionStore | str | None = None,
        user_id: str = "local",
        bot: str = "langchain",
        count_tokens: Callable[[str], int] | None = None,
    ) -> None:
        self.session_id = session_id
        self.store = store if isinstance(store, SessionStore) else SessionStore(store) if store else SessionStore.open()
        self.user_id = user_id
        self.bot = bot
        self._count_tokens = count_tokens or (lambda text: len(text.split()))

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        try:
            stored = self.store.messages(self.session_id)
        except UnknownSessionError:
            return []
        return [
            messages_from_dict([m.meta["langchain"]])[0] if m.meta and "langchain" in m.meta else _MESSAGE[m.role.value](content=m.content)
            for m in stored
        ]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        # Checked all before any is written; stored as the documented tool format writes them,
        # the message whole beside it.
        rows = [(text.role, text.content, message_to_dict(m)) for m in messages for text in written([converted(m)])]
        self.store.get_or_create_session(self.session_id, user_id=self.user_id, bot=self.bot)
        for role, text, whole in rows:
            self.store.append_message(
                self.session_id, role, text, token_count=self._count_tokens(text), meta={"langchain": whole}
            )

    def clear(self) -> None:
        try:
            self.store.delete_session(self.session_id)
        except UnknownSessionError:
            pass
