"""The answer cache (DSAC): context-scoped semantic caching of whole answers."""

from .audits import BoundStatus
from .cache import AnswerCache, AnswerCacheStats, CacheHit
from .config import AnswerCacheConfig
from .keys import AnswerScope, Scope, bot_fingerprint, conversation_context, intent_context, normalize
from ..tiers.lfu import LfuPlus, decay_factor
from .personal import any_personal_data, carries_personal_data
from .verify import verify

__all__ = [
    "AnswerCache",
    "AnswerCacheConfig",
    "AnswerCacheStats",
    "AnswerScope",
    "BoundStatus",
    "CacheHit",
    "LfuPlus",
    "Scope",
    "any_personal_data",
    "bot_fingerprint",
    "carries_personal_data",
    "conversation_context",
    "decay_factor",
    "intent_context",
    "normalize",
    "verify",
]
