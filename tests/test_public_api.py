"""The public names: what `from chatcache import *` gives, and that it covers everything
`ChatEngine` takes, so no one has to import from a submodule to configure an engine."""

from __future__ import annotations

import inspect
import typing

import chatcache

PUBLIC = {
    "AnswerCacheConfig", "AsyncReplyStream", "BotDefinition", "ChatCacheError", "ChatEngine", "ChatModel",
    "ConfigError", "CorruptDatabaseError", "DriftConfig", "GenerationConfig", "InvalidIdError",
    "InvalidMessageError", "MemoryConfig", "Message", "ModelNotFoundError", "RemoteModel", "RemoteModelError", "Reply", "ReplyFormat", "ReplyStream",
    "SessionClosedError", "SessionStore", "StageThresholds", "StorageError", "TokenTier", "TokenTierConfig",
    "TokenTierStats", "ToolCall", "TurnStats", "TurnTierConfig", "UnknownSessionError", "connect_remote_model", "default_data_dir",
    "load_chat_model", "load_embedder",
}  # fmt: skip


def test_the_public_names_are_these_and_each_resolves() -> None:
    assert set(chatcache.__all__) == PUBLIC, "a public name was added or removed: update PUBLIC and the README"
    assert len(chatcache.__all__) == len(PUBLIC)
    for name in chatcache.__all__:
        assert getattr(chatcache, name) is not None


def _classes(annotation: object) -> set[type]:
    """This project's classes an annotation names, through unions and generics."""
    args = typing.get_args(annotation)
    if args:
        return {c for arg in args for c in _classes(arg)}
    if isinstance(annotation, type) and annotation.__module__.split(".")[0] == "chatcache":
        return {annotation}
    return set()


def test_everything_chat_engine_takes_is_public() -> None:
    from chatcache.steering.hcac import Embed

    hints = typing.get_type_hints(chatcache.ChatEngine.__init__, localns={"Embed": Embed})
    taken = {c for name, hint in hints.items() if name != "return" for c in _classes(hint)}
    assert len(taken) >= 8, f"too few classes found in ChatEngine's signature: {taken}"
    missing = {c.__name__ for c in taken if getattr(chatcache, c.__name__, None) is not c}
    assert not missing, f"ChatEngine takes these, but chatcache does not export them: {missing}"
    parameters = inspect.signature(chatcache.ChatEngine).parameters
    assert {"model", "store", "bot", "token_tier", "turn_tier", "memory", "answer_cache", "drift"} <= set(parameters)
