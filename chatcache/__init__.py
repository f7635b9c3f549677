"""chatcache: conversational chatbots on local Hugging Face models, with a hierarchical cache.

The public names are imported on first use, not with the package: importing `chatcache.cli`
must not import transformers (and with it huggingface_hub, which reads HF_HUB_OFFLINE once,
at import), so the `chatcache` command can set its offline default first and can answer
`--help`, `bots` or a wrong `--bot` without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatcache.dialog import BotDefinition
    from chatcache.storage import SessionStore

    from .answer_cache import AnswerCacheConfig
    from .config import GenerationConfig, TokenTierConfig, default_data_dir
    from .steering.drift import DriftConfig, StageThresholds
    from .engine import ChatEngine
    from .errors import (
        ChatCacheError,
        ConfigError,
        CorruptDatabaseError,
        InvalidIdError,
        InvalidMessageError,
        ModelNotFoundError,
        RemoteModelError,
        SessionClosedError,
        StorageError,
        UnknownSessionError,
    )
    from .model.loading import ChatModel, load_chat_model, load_embedder
    from .model.prompt import Message
    from .model.remote import RemoteModel, connect_remote_model
    from .reply_format import ReplyFormat
    from .model.tools import ToolCall
    from .reply import AsyncReplyStream, Reply, ReplyStream, TurnStats
    from .tiers.residency import MemoryConfig
    from .tiers.token_tier import TokenTier, TokenTierStats
    from .tiers.turn_tier import TurnTierConfig

# Each public name and the module that defines it (".x": chatcache.x); `ChatEngine` takes the
# session store and the bot definition from its subpackages storage and dialog.
_EXPORTS = {
    "AnswerCacheConfig": ".answer_cache",
    "AsyncReplyStream": ".reply",
    "ChatCacheError": ".errors",
    "ChatEngine": ".engine",
    "BotDefinition": ".dialog",
    "ChatModel": ".model.loading",
    "ConfigError": ".errors",
    "CorruptDatabaseError": ".errors",
    "DriftConfig": ".steering.drift",
    "GenerationConfig": ".config",
    "InvalidIdError": ".errors",
    "InvalidMessageError": ".errors",
    "MemoryConfig": ".tiers.residency",
    "Message": ".model.prompt",
    "ModelNotFoundError": ".errors",
    "RemoteModel": ".model.remote",
    "RemoteModelError": ".errors",
    "Reply": ".reply",
    "ReplyFormat": ".reply_format",
    "ReplyStream": ".reply",
    "SessionClosedError": ".errors",
    "SessionStore": ".storage",
    "StageThresholds": ".steering.drift",
    "StorageError": ".errors",
    "TokenTier": ".tiers.token_tier",
    "ToolCall": ".model.tools",
    "TokenTierConfig": ".config",
    "TokenTierStats": ".tiers.token_tier",
    "TurnTierConfig": ".tiers.turn_tier",
    "TurnStats": ".reply",
    "UnknownSessionError": ".errors",
    "connect_remote_model": ".model.remote",
    "default_data_dir": ".config",
    "load_chat_model": ".model.loading",
    "load_embedder": ".model.loading",
}

__all__ = [
    "AnswerCacheConfig",
    "AsyncReplyStream",
    "BotDefinition",
    "ChatCacheError",
    "ChatEngine",
    "ChatModel",
    "ConfigError",
    "CorruptDatabaseError",
    "DriftConfig",
    "GenerationConfig",
    "InvalidIdError",
    "InvalidMessageError",
    "MemoryConfig",
    "Message",
    "ModelNotFoundError",
    "RemoteModel",
    "RemoteModelError",
    "Reply",
    "ReplyFormat",
    "ReplyStream",
    "SessionClosedError",
    "SessionStore",
    "StageThresholds",
    "StorageError",
    "TokenTier",
    "TokenTierConfig",
    "TokenTierStats",
    "ToolCall",
    "TurnTierConfig",
    "TurnStats",
    "UnknownSessionError",
    "connect_remote_model",
    "default_data_dir",
    "load_chat_model",
    "load_embedder",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
