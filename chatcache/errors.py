"""Errors a chatcache user can act on.

Every error says what was wrong and what to do; none of them leaves a session half-changed.
"""


class ChatCacheError(Exception):
    """Base class of every error chatcache raises on purpose."""


class ModelNotFoundError(ChatCacheError, ValueError):
    """A chat model or embedder name that resolves to nothing loadable."""


class InvalidMessageError(ChatCacheError, ValueError):
    """A user message that cannot be answered: empty, or longer than the context window."""


class UnknownSessionError(ChatCacheError, KeyError):
    """A session id the engine has never seen (or has already ended)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "unknown session"


class ConfigError(ChatCacheError, ValueError):
    """An engine setting that can never work, caught at construction."""
