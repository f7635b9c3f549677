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
    from .answer_cache import AnswerCacheConfig
    from .config import GenerationConfig, TokenTierConfig, default_data_dir
    from .drift import DriftConfig, StageThresholds
    from .engine import ChatEngine
    from .errors import (
        ChatCacheError,
        ConfigError,
        CorruptDatabaseError,
        InvalidIdError,
        InvalidMessageError,
        ModelNotFoundError,
        SessionClosedError,
        StorageError,
        UnknownSessionError,
    )
    from .models import ChatModel, load_chat_model, load_embedder
    from .prompt import Message
    from .reply import AsyncReplyStream, Reply, ReplyStream, TurnStats
    from .residency import MemoryConfig
    from .token_tier import TokenTierStats

# Each public name and the submodule that defines it.
_EXPORTS = {
    "AnswerCacheConfig": "answer_cache",
    "AsyncReplyStream": "reply",
    "ChatCacheError": "errors",
    "ChatEngine": "engine",
    "ChatModel": "models",
    "ConfigError": "errors",
    "CorruptDatabaseError": "errors",
    "DriftConfig": "drift",
    "GenerationConfig": "config",
    "InvalidIdError": "errors",
    "InvalidMessageError": "errors",
    "MemoryConfig": "residency",
    "Message": "prompt",
    "ModelNotFoundError": "errors",
    "Reply": "reply",
    "ReplyStream": "reply",
    "SessionClosedError": "errors",
    "StageThresholds": "drift",
    "StorageError": "errors",
    "TokenTierConfig": "config",
    "TokenTierStats": "token_tier",
    "TurnStats": "reply",
    "UnknownSessionError": "errors",
    "default_data_dir": "config",
    "load_chat_model": "models",
    "load_embedder": "models",
}

__all__ = [
    "AnswerCacheConfig",
    "AsyncReplyStream",
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
    "Reply",
    "ReplyStream",
    "SessionClosedError",
    "StageThresholds",
    "StorageError",
    "TokenTierConfig",
    "TokenTierStats",
    "TurnStats",
    "UnknownSessionError",
    "default_data_dir",
    "load_chat_model",
    "load_embedder",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
