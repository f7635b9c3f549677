"""The answer cache (DSAC): context-scoped semantic caching of whole answers."""

from .cache import AnswerCache, AnswerCacheStats, CacheHit
from .config import AnswerCacheConfig
from .keys import Scope, bot_fingerprint, follow_up_context, intent_context, normalize
from .lfu import LfuPlus, decay_factor
from .verify import verify

__all__ = [
    "AnswerCache",
    "AnswerCacheConfig",
    "AnswerCacheStats",
    "CacheHit",
    "LfuPlus",
    "Scope",
    "bot_fingerprint",
    "decay_factor",
    "follow_up_context",
    "intent_context",
    "normalize",
    "verify",
]
