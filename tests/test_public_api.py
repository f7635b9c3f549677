"""The public names: what `from chatcache import *` gives, and that it covers everything
`ChatEngine` takes and hands out, so no one has to import from a submodule to configure an
engine or to read what it returns (the server, LangChain and the apps may not: pyproject.toml's
import contracts)."""

from __future__ import annotations

import inspect
import typing

import chatcache

PUBLIC = {
    "AnswerCacheConfig", "AsyncReplyStream", "BotDefinition", "ChatCacheError", "ChatEngine", "ChatModel",
    "ConfigError", "CorruptDatabaseError", "DriftConfig", "GenerationConfig", "InvalidIdError",
    "InvalidMessageError", "MemoryConfig", "Message", "ModelNotFoundError", "RemoteModel", "RemoteModelError", "Reply", "ReplyFormat", "ReplyStream",
    "SessionClosedError", "SessionKV", "SessionStore", "StageThresholds", "StorageError", "TokenTier", "TokenTierConfig",
    "TokenTierStats", "ToolCall", "TurnStats", "TurnTierConfig", "UnknownSessionError", "connect_remote_model", "default_data_dir",
    "load_chat_model", "load_embedder",
    # engines sharing one model: its scheduler, token tier and embedder
    "Embed", "Scheduler", "build_token_tier", "sentence_embed",
    # tool calls in the model's format, and a cached answer replayed as if streamed
    "CHOICE_NAMES", "CallSyntax", "TOOL_ROUTE_THRESHOLD", "ToolChoice", "check_tools", "parse_calls", "token_pieces", "written",
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
    hints = typing.get_type_hints(chatcache.ChatEngine.__init__, localns={"Embed": chatcache.Embed})
    taken = {c for name, hint in hints.items() if name != "return" for c in _classes(hint)}
    assert len(taken) >= 8, f"too few classes found in ChatEngine's signature: {taken}"
    missing = {c.__name__ for c in taken if getattr(chatcache, c.__name__, None) is not c}
    assert not missing, f"ChatEngine takes these, but chatcache does not export them: {missing}"
    parameters = inspect.signature(chatcache.ChatEngine).parameters
    assert {"model", "store", "bot", "token_tier", "turn_tier", "memory", "answer_cache", "drift"} <= set(parameters)


def test_what_an_engine_and_its_model_hand_out_is_public() -> None:
    """The server and LangChain hold these and may import only `chatcache`: the syntax a reply's
    calls are read in, the model's scheduler (admission control reads its rates), the tool
    choices and the router's default threshold `complete` takes."""
    call_syntax = typing.get_type_hints(chatcache.ChatEngine.call_syntax.fget)["return"]
    scheduler = typing.get_type_hints(chatcache.ChatModel.scheduler.fget)["return"]
    assert call_syntax is chatcache.CallSyntax and scheduler is chatcache.Scheduler
    complete = inspect.signature(chatcache.ChatEngine.complete).parameters
    assert complete["tool_route_threshold"].default == chatcache.TOOL_ROUTE_THRESHOLD
    assert set(chatcache.CHOICE_NAMES.values()) == {"auto", "any", "none"}
    assert chatcache.parse_calls('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')[1] == [chatcache.ToolCall("f", {})]
