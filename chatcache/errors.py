"""Errors a chatcache user can act on.

Every error says what was wrong and what to do; none of them leaves a session half-changed.
Session errors come from the session tier (`storage`) and are re-exported here.
"""

from chatcache.storage.errors import (
    CorruptDatabaseError,
    InvalidIdError,
    SessionClosedError,
    StorageError,
    UnknownSessionError,
)

__all__ = [
    "ChatCacheError",
    "ConfigError",
    "ContextWindowError",
    "CorruptDatabaseError",
    "InvalidIdError",
    "InvalidMessageError",
    "ModelNotFoundError",
    "RemoteModelError",
    "SessionClosedError",
    "StorageError",
    "UnknownSessionError",
]


class ChatCacheError(Exception):
    """Base class of every error chatcache raises on purpose."""


class ModelNotFoundError(ChatCacheError, ValueError):
    """A chat model or embedder name that resolves to nothing loadable."""


class InvalidMessageError(ChatCacheError, ValueError):
    """A user message that cannot be answered: empty, longer than the context window, or
    holding a character no database can store (a NUL, a lone surrogate)."""


class ContextWindowError(InvalidMessageError):
    """A message or conversation that cannot fit the model's context window (the token counts say by how much)."""


class ConfigError(ChatCacheError, ValueError):
    """An engine setting that can never work, caught at construction."""


class RemoteModelError(ChatCacheError, RuntimeError):
    """A model served elsewhere could not be reached, or refused a request; the message has its
    address and what it answered. A turn it fails keeps the user's message, as any failed turn does."""
