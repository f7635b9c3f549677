"""The chat app's widgets, one per module."""

from .cache_panel import CachePanel
from .chat_log import ChatLog
from .message import ChatMessage
from .prompt_input import PromptInput
from .session_list import SessionList

__all__ = ["CachePanel", "ChatLog", "ChatMessage", "PromptInput", "SessionList"]
