"""OpenAI tool calling over HTTP, from the official client and LangChain's ChatOpenAI, on the tiny
model: its random weights write noise, so every well-formed call is the decoder's doing."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from chatcache import ChatEngine, Message
from chatcache.model.tools import ToolCall, calls_text, parse_calls

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": False},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast at a location.",
        "parameters": {"type": "object", "properties": {"location": {"enum": ["Oslo", "Rome"]}}, "required": ["location"], "additionalProperties": False},
    },
}
QUESTION = [{"role": "user", "content": "What is 2 + 40?"}]
# Closed objects: the random model would otherwise add properties until its budget ends.


@pytest.fixture(scope="module")
def wide_model(build_tiny, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The tiny model with room for the tools prompt (its 400-token vocabulary spells it long)."""
    from chatcache import load_chat_model

    return load_chat_model(str(build_tiny(tmp_path_factory.mktemp("tiny-wide"), max_positions=4096)), device="cpu")


@pytest.fixture
def live(serve, wide_model):  # type: ignore[no-untyped-def]
    return serve(chat_model=wide_model, answer_cache=False, drift=False)


def _valid(call: object, tools: list[dict]) -> None:  # type: ignore[type-arg]
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    assert call.type == "function" and call.id.startswith("call_")  # type: ignore[attr-defined]
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])  # type: ignore[attr-defined]


def test_a_required_call_comes_back_as_tool_calls_whole_and_streamed(live) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    tools = [ADD, WEATHER]
    whole = client.chat.completions.create(model=live.model_id, messages=QUESTION, tools=tools, tool_choice="required", max_tokens=120)  # type: ignore[arg-type]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls or []) == 1  # one call a reply unless parallel calls are asked for
    _valid(choice.message.tool_calls[0], tools)  # type: ignore[index]
    stream = client.chat.completions.create(
        model=live.model_id, messages=QUESTION, tools=tools, tool_choice="required", max_tokens=120, stream=True  # type: ignore[arg-type]
    )
    chunks = [c for c in stream if c.choices]
    deltas = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [  # type: ignore[union-attr]
        (0, call.function.name, call.function.arguments) for call in choice.message.tool_calls  # type: ignore[union-attr]
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_named_choice_calls_that_tool_and_none_answers_in_text(live) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    named = client.chat.completions.create(
        model=live.model_id, messages=QUESTION, tools=[ADD, WEATHER], max_tokens=120,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    calls = named.choices[0].message.tool_calls or []
    assert [call.function.name for call in calls] == ["get_weather"]  # type: ignore[union-attr]
    _valid(calls[0], [WEATHER])
    text = client.chat.completions.create(model=live.model_id, messages=QUESTION, tools=[ADD], tool_choice="none", max_tokens=12)  # type: ignore[arg-type]
    assert text.choices[0].message.tool_calls is None and text.choices[0].finish_reason in ("stop", "length")


def test_a_conversation_with_calls_and_results_is_what_the_engine_answers(live, wide_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """The calls and results an agent sends back read as the engine's own tool format: the
    server's reply equals the engine's answer to the same conversation, laid out by hand."""
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    called = client.chat.completions.create(model=live.model_id, messages=QUESTION, tools=[ADD], tool_choice="required", max_tokens=200)  # type: ignore[arg-type]
    assert called.choices[0].message.tool_calls, called
    call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
    agent = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
        {"role": "tool", "tool_call_id": call.id, "content": "(checked)"},
    ]
    answered = client.chat.completions.create(model=live.model_id, messages=agent, tools=[ADD], tool_choice="none", max_tokens=16)  # type: ignore[arg-type]
    engine: ChatEngine = make_engine(wide_model, system_prompt="You are a helpful, concise assistant.")
    by_hand = [
        Message("user", QUESTION[0]["content"]),
        Message("assistant", "", tool_calls=(ToolCall(call.function.name, json.loads(call.function.arguments)),)),
        Message("tool", "42"),
        Message("tool", "(checked)"),
    ]
    alone = engine.complete(by_hand, max_new_tokens=16, tools=[ADD], tool_choice="none")
    assert answered.choices[0].message.content == "".join(alone)
    assert answered.usage.prompt_tokens == alone.reply.stats.prompt_tokens  # type: ignore[union-attr]
    # The call went back as the text the model generated, so its KV was reused.
    assert answered.usage.prompt_tokens_details.cached_tokens > called.usage.prompt_tokens  # type: ignore[union-attr]


def test_langchain_chat_openai_binds_tools_against_the_server(live) -> None:  # type: ignore[no-untyped-def]
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=f"{live.url}/v1", api_key="unused", model=live.model_id, max_tokens=120, temperature=0)  # type: ignore[arg-type]
    reply = chat.bind_tools([ADD], tool_choice="add").invoke("What is 2 + 40?")
    assert [call["name"] for call in reply.tool_calls] == ["add"] and not reply.invalid_tool_calls
    jsonschema.validate(reply.tool_calls[0]["args"], ADD["function"]["parameters"])  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "subtract"}}}, "subtract"),
        ({"tools": [ADD], "response_format": {"type": "json_object"}}, "not both"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "name"),
    ],
)
def test_bad_tool_requests_are_400s_that_name_the_problem(live, fields: dict[str, object], needle: str) -> None:  # type: ignore[no-untyped-def]
    with live.client() as http:
        response = http.post("/v1/chat/completions", json={"model": live.model_id, "messages": QUESTION, **fields})
    assert response.status_code == 400, response.text
    assert needle in response.json()["error"]["message"]


def test_results_must_answer_a_call_and_a_session_keeps_no_tools(live) -> None:  # type: ignore[no-untyped-def]
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    unanswered = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_2", "content": "3"}]
    with live.client() as http:
        response = http.post("/v1/chat/completions", json={"model": live.model_id, "messages": unanswered, "tools": [ADD]})
        assert response.status_code == 400 and "call_2" in response.json()["error"]["message"]
        bad_arguments = [*QUESTION, {"role": "assistant", "tool_calls": [{**call, "function": {"name": "add", "arguments": "[1"}}]}, *QUESTION]
        response = http.post("/v1/chat/completions", json={"model": live.model_id, "messages": bad_arguments})
        assert response.status_code == 400 and "not JSON" in response.json()["error"]["message"]
        session = http.post("/v1/chat/completions", json={"model": live.model_id, "messages": QUESTION, "tools": [ADD]}, headers={"X-Session-Id": "s"})
        assert session.status_code == 400 and "without X-Session-Id" in session.json()["error"]["message"]
        assert http.get("/v1/sessions/s").status_code == 404


def test_parse_calls_reads_back_what_the_server_sends() -> None:
    calls = [ToolCall("add", {"a": 1, "b": 2})]
    assert parse_calls(calls_text(calls)) == ("", calls)
