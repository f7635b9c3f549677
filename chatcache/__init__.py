"""chatcache: conversational chatbots on local Hugging Face models, with a hierarchical cache."""

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
from .reply import Reply, ReplyStream, TurnStats
from .residency import MemoryConfig
from .token_tier import TokenTierStats

__all__ = [
    "AnswerCacheConfig",
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
