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
    from .model.scheduler import Scheduler
    from .model.text_stream import token_pieces
    from .model.tools import CHOICE_NAMES, CallSyntax, ToolCall, ToolChoice, parse_calls, written
    from .model_runner import build_token_tier
    from .reply_format import ReplyFormat
    from .reply import AsyncReplyStream, Reply, ReplyStream, TurnStats
    from .steering.hcac import Embed, sentence_embed
    from .steering.tool_router import TOOL_ROUTE_THRESHOLD
    from .steering.tool_use import check_tools
    from .config import MemoryConfig
    from .tiers.token_tier import SessionKV, TokenTier, TokenTierStats
    from .tiers.turn_tier import TurnTierConfig

# Each public name and the module that defines it (".x": chatcache.x); `ChatEngine` takes the
# session store and the bot definition from its subpackages storage and dialog. Besides what
# configures and runs an engine: what a front (the server, LangChain, the apps) needs beside it,
# sharing a model's scheduler, token tier and embedder between engines, and reading and writing
# tool calls in the model's format.
_EXPORTS = {
    "AnswerCacheConfig": ".answer_cache",
    "AsyncReplyStream": ".reply",
    "CHOICE_NAMES": ".model.tools",
    "CallSyntax": ".model.tools",
    "ChatCacheError": ".errors",
    "ChatEngine": ".engine",
    "BotDefinition": ".dialog",
    "ChatModel": ".model.loading",
    "ConfigError": ".errors",
    "CorruptDatabaseError": ".errors",
    "DriftConfig": ".steering.drift",
    "Embed": ".steering.hcac",
    "GenerationConfig": ".config",
    "InvalidIdError": ".errors",
    "InvalidMessageError": ".errors",
    "MemoryConfig": ".config",
    "Message": ".model.prompt",
    "ModelNotFoundError": ".errors",
    "RemoteModel": ".model.remote",
    "RemoteModelError": ".errors",
    "Reply": ".reply",
    "ReplyFormat": ".reply_format",
    "ReplyStream": ".reply",
    "Scheduler": ".model.scheduler",
    "SessionClosedError": ".errors",
    "SessionKV": ".tiers.token_tier",
    "SessionStore": ".storage",
    "StageThresholds": ".steering.drift",
    "StorageError": ".errors",
    "TOOL_ROUTE_THRESHOLD": ".steering.tool_router",
    "TokenTier": ".tiers.token_tier",
    "ToolCall": ".model.tools",
    "ToolChoice": ".model.tools",
    "TokenTierConfig": ".config",
    "TokenTierStats": ".tiers.token_tier",
    "TurnTierConfig": ".tiers.turn_tier",
    "TurnStats": ".reply",
    "UnknownSessionError": ".errors",
    "build_token_tier": ".model_runner",
    "check_tools": ".steering.tool_use",
    "connect_remote_model": ".model.remote",
    "default_data_dir": ".config",
    "load_chat_model": ".model.loading",
    "load_embedder": ".model.loading",
    "parse_calls": ".model.tools",
    "sentence_embed": ".steering.hcac",
    "token_pieces": ".model.text_stream",
    "written": ".model.tools",
}

__all__ = [
    "AnswerCacheConfig",
    "AsyncReplyStream",
    "BotDefinition",
    "CHOICE_NAMES",
    "CallSyntax",
    "ChatCacheError",
    "ChatEngine",
    "ChatModel",
    "ConfigError",
    "CorruptDatabaseError",
    "DriftConfig",
    "Embed",
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
    "Scheduler",
    "SessionClosedError",
    "SessionKV",
    "SessionStore",
    "StageThresholds",
    "StorageError",
    "TOOL_ROUTE_THRESHOLD",
    "TokenTier",
    "TokenTierConfig",
    "TokenTierStats",
    "ToolCall",
    "ToolChoice",
    "TurnTierConfig",
    "TurnStats",
    "UnknownSessionError",
    "build_token_tier",
    "check_tools",
    "connect_remote_model",
    "default_data_dir",
    "load_chat_model",
    "load_embedder",
    "parse_calls",
    "sentence_embed",
    "token_pieces",
    "written",
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
