"""Tool calling and structured output on the tiny model, whose random weights write noise:
every call and every object that comes back well-formed does so because the decoder holds the
reply to its schema."""

from __future__ import annotations

import json
from typing import Literal, Optional

import jsonschema
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from chatcache.langchain import CachedChatModel, SessionChatHistory
from chatcache.model.loading import load_embedder
from chatcache.model.format_matcher import FormatError, ReplyFormats
from chatcache.steering.hcac import sentence_embed
from chatcache.steering.tool_router import ToolRouter
from chatcache.model.tools import CallSyntax, Tool, ToolCall, call_format, calls_text, parse_calls, written

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tiny_model(build_tiny, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The tiny model with room for the tools prompt (its 400-token vocabulary spells it long)."""
    from chatcache import load_chat_model

    return load_chat_model(str(build_tiny(tmp_path_factory.mktemp("tiny-wide"), max_positions=4096)), device="cpu")


@tool
def get_weather(location: Literal["Oslo", "Rome", "Lima"], days: int) -> str:
    """Get the weather forecast at a location for a number of days."""
    return "sunny"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# Strings are bounded here: the random model's byte soup takes a token or more a character, so
# the budget's own bound (`within_budget`, sized for text) would not fit it.
class Person(BaseModel):
    """A person."""

    name: str = Field(description="their name", max_length=12)
    age: int
    nickname: Optional[str] = Field(default=None, max_length=8)  # noqa: UP045 - the Optional form is what LangChain users write


class PersonDict(TypedDict):
    name: Literal["Ada", "Bob"]
    age: int


def _args_schema(named: object) -> dict:
    return named.tool_call_schema.model_json_schema()  # type: ignore[attr-defined, no-any-return]


@pytest.mark.parametrize("choice", ["any", "get_weather", "add", True, {"type": "function", "function": {"name": "add"}}])
def test_forced_calls_are_well_formed_calls_of_the_chosen_tools(lc_model, choice) -> None:  # type: ignore[no-untyped-def]
    model = lc_model(max_tokens=200).bind_tools([get_weather, add], tool_choice=choice)
    for question in ["What's the weather in Oslo for 3 days?", "What is 2 + 40?", "Hello"]:
        reply = model.invoke(question)
        assert len(reply.tool_calls) == 1 and not reply.invalid_tool_calls, reply
        call = reply.tool_calls[0]
        allowed = {"get_weather", "add"} if choice in ("any", True) else {"add" if isinstance(choice, dict) else choice}
        assert call["name"] in allowed and call["id"].startswith("call_")
        jsonschema.validate(call["args"], _args_schema({"get_weather": get_weather, "add": add}[call["name"]]))


def test_parallel_calls_are_allowed_on_request_only(lc_model) -> None:  # type: ignore[no-untyped-def]
    single = lc_model(max_tokens=200).bind_tools([add], tool_choice="any")
    assert {len(single.invoke(f"add {n} and {n}").tool_calls) for n in range(3)} == {1}
    tokenizer = lc_model().engine.chat_model.tokenizer
    formats = ReplyFormats(tokenizer, {tokenizer.eos_token_id})
    two_calls = tokenizer.encode(calls_text([ToolCall("add", {"a": 1, "b": 2}), ToolCall("add", {"a": 3, "b": 4})]))
    tools = [Tool("add", "Add two integers.", _args_schema(add))]
    for parallel, allowed in ((True, True), (False, False)):
        matcher = formats.matcher(call_format(tools, "any", parallel))
        try:
            for token in two_calls:
                matcher.accept(token)
        except FormatError:
            assert not allowed
        else:
            assert allowed


def test_stream_gives_tool_call_chunks_that_add_up_to_the_invoke_calls(lc_model) -> None:  # type: ignore[no-untyped-def]
    model = lc_model(max_tokens=200).bind_tools([get_weather], tool_choice="any")
    invoked = model.invoke("Weather in Rome?")
    full: AIMessageChunk | None = None
    for chunk in model.stream("Weather in Rome?"):
        full = chunk if full is None else full + chunk
    assert full is not None and full.tool_call_chunks
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [(c["name"], c["args"]) for c in invoked.tool_calls]


def test_none_and_auto_leave_text_replies_as_text(lc_model) -> None:  # type: ignore[no-untyped-def]
    none = lc_model(max_tokens=16).bind_tools([add], tool_choice="none").invoke("Tell me a story")
    assert none.content and not none.tool_calls and not none.invalid_tool_calls
    routed_off = lc_model(max_tokens=16, tool_route_threshold=None).bind_tools([add]).invoke("Tell me a story")
    assert not routed_off.tool_calls and not routed_off.invalid_tool_calls


def test_an_unknown_tool_choice_is_refused(lc_model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="names no bound tool"):
        lc_model().bind_tools([add], tool_choice="subtract")


def test_a_call_cut_by_the_budget_is_an_invalid_call_not_an_error(lc_model) -> None:  # type: ignore[no-untyped-def]
    reply = lc_model(max_tokens=4).bind_tools([add], tool_choice="any").invoke("add 1 and 2")
    assert not reply.tool_calls and reply.invalid_tool_calls and reply.response_metadata["finish_reason"] == "length"


def test_agent_history_with_calls_and_results_renders_in_the_tool_format(lc_model) -> None:  # type: ignore[no-untyped-def]
    model = lc_model(max_tokens=200)
    bound = model.bind_tools([add], tool_choice="any")
    question = HumanMessage("What is 1 + 2?")
    called = bound.invoke([question])
    result = ToolMessage("3", tool_call_id=called.tool_calls[0]["id"], name="add")
    final = model.bind_tools([add], tool_choice="none").invoke([question, called, result])
    assert isinstance(final, AIMessage) and not final.tool_calls
    # The call goes back to the model as the text it generated, so the token tier reuses its KV.
    again = bound.invoke([question, called, result, AIMessage("3"), HumanMessage("And 2 + 2?")])
    assert again.usage_metadata["input_token_details"]["cache_read"] > 0
    assert again.tool_calls


def test_tool_format_round_trips() -> None:
    calls = [ToolCall("add", {"a": 1, "b": 2}), ToolCall("get_weather", {"location": "Zürich", "days": 2})]
    assert parse_calls("Sure. " + calls_text(calls)) == ("Sure. ", calls)
    assert parse_calls("no calls here") == ("no calls here", [])
    with pytest.raises(ValueError, match="cut short"):
        parse_calls('<tool_call>[{"name": "add", "arguments": {"a": 1')
    whole = calls_text(calls[:1])
    for cut in (whole[: whole.index("</")], whole[: whole.index("</") + 2]):  # the budget ends in the closing tag
        assert parse_calls(cut) == ("", calls[:1])
    with pytest.raises(ValueError, match="no closing tag"):
        parse_calls(whole.replace("</tool_call>", "</tool"  + "x>"))


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
@pytest.mark.parametrize("schema", [Person, PersonDict, Person.model_json_schema()], ids=["pydantic", "typeddict", "json"])
def test_structured_output_parses_into_the_schema(lc_model, method, schema) -> None:  # type: ignore[no-untyped-def]
    structured = lc_model(max_tokens=200).with_structured_output(schema, method=method)
    for question in ["Tell me about Ada", "Who is Bob?"]:
        result = structured.invoke(question)
        if schema is Person:
            assert isinstance(result, Person)
        else:  # every method, JSON mode included, holds the reply to the schema's own keys
            assert {"name", "age"} <= set(result) <= {"name", "age", "nickname"}


def test_include_raw_keeps_the_message_and_any_parsing_error(lc_model) -> None:  # type: ignore[no-untyped-def]
    good = lc_model(max_tokens=200).with_structured_output(Person, include_raw=True).invoke("Ada?")
    assert isinstance(good["raw"], AIMessage) and isinstance(good["parsed"], Person) and good["parsing_error"] is None
    cut = lc_model(max_tokens=3).with_structured_output(Person, include_raw=True).invoke("Ada?")
    assert cut["parsed"] is None and cut["parsing_error"] is not None


def test_json_mode_without_a_schema_gives_an_object(lc_model) -> None:  # type: ignore[no-untyped-def]
    reply = lc_model(max_tokens=200).bind(response_format={"type": "json_object"}).invoke("JSON please")
    assert isinstance(json.loads(reply.content), dict)


def test_structured_answers_are_cached_apart_from_text_other_schemas_and_tools(lc_model, toy_embed) -> None:  # type: ignore[no-untyped-def]
    """The answer cache keys include the format and the bound tools: a repeat is served from the
    cache only where the same schema or the same tools are bound, and is then the stored answer."""
    from chatcache import AnswerCacheConfig

    keep_all = AnswerCacheConfig(max_entropy_bits=100.0)  # the random model's answers are all uncertain
    model = lc_model(max_tokens=200, answer_cache=keep_all, embedder=toy_embed)
    question = [HumanMessage("Tell me about Ada")]
    variants = {
        "text": model,
        "person": model.with_structured_output(Person, include_raw=True),
        "person dict": model.with_structured_output(PersonDict, include_raw=True),
        "add": model.bind_tools([add], tool_choice="any"),
        "weather": model.bind_tools([get_weather], tool_choice="any"),
    }

    def served(bound) -> tuple[bool, object]:  # type: ignore[no-untyped-def]
        reply = bound.invoke(question)
        message = reply["raw"] if isinstance(reply, dict) else reply
        return message.response_metadata["answer_cache_hit"], message.content or message.tool_calls[0]["args"]

    first = {}
    for name, bound in variants.items():
        hit, first[name] = served(bound)
        assert not hit, f"{name} was served another variant's answer"
    for name, bound in variants.items():
        hit, answer = served(bound)
        assert hit and answer == first[name], name


def test_history_keeps_tool_calls_and_results_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    history = SessionChatHistory("agent", store=f"sqlite:///{tmp_path}/h.db")
    call = AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "call_1", "type": "tool_call"}])
    result = ToolMessage("3", tool_call_id="call_1", name="add", status="error")
    history.add_messages([HumanMessage("1 + 2?"), call, result])
    again = SessionChatHistory("agent", store=f"sqlite:///{tmp_path}/h.db").messages
    assert again[1].tool_calls == call.tool_calls
    assert isinstance(again[2], ToolMessage) and again[2].tool_call_id == "call_1" and again[2].status == "error"


def test_auto_calls_the_tool_a_question_is_about_and_answers_others_in_text(lc_model) -> None:  # type: ignore[no-untyped-def]
    """The router reads meaning with the bundled embedder; the random model alone would decide noise."""
    model = lc_model(max_tokens=200).bind_tools([get_weather, add])
    weather = model.invoke("What will the weather be in Rome for the next 2 days?")
    assert [call["name"] for call in weather.tool_calls] == ["get_weather"]
    summed = model.invoke("Please add 40 and 2.")
    assert [call["name"] for call in summed.tool_calls] == ["add"]
    router = ToolRouter(sentence_embed(load_embedder("bundled")))
    tools = [Tool(t.name, t.description, _args_schema(t)) for t in (get_weather, add)]
    assert router.called("Tell me a joke about cats.", tools) == []  # left to the model
    assert [t.name for t in router.called("What is the weather like in Lima today?", tools)] == ["get_weather"]
    after_result = model.invoke(
        [HumanMessage("Weather in Rome?"), weather, ToolMessage("sunny", tool_call_id=weather.tool_calls[0]["id"])]
    )
    assert isinstance(after_result, AIMessage)  # a tool result is not routed: the model answers or calls


# A chat template with a tool format of its own, Hermes' as Qwen 2.5's template writes it.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}\n<|im_start|>assistant\n"
    "{% for call in message.tool_calls %}{% if not loop.first %}\n{% endif %}"
    '<tool_call>\n{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}\n</tool_call>'
    "{%- endfor %}<|im_end|>"
    "{%- elif message.role == 'tool' %}\n<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>"
    "{%- else %}\n<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{% endif %}"
)


def _add_spec() -> dict:  # type: ignore[type-arg]
    function = convert_to_openai_tool(add, strict=True)["function"]  # as bind_tools converts it
    return {"type": "function", "function": {key: function[key] for key in ("name", "description", "parameters")}}


ADD_SPEC = _add_spec()


def _native_ids(model, messages: list[dict], **extra) -> list[int]:  # type: ignore[no-untyped-def, type-arg]
    """The ids `model`'s own template gives a structured conversation with `add` bound."""
    text = model.tokenizer.apply_chat_template(messages, tools=[ADD_SPEC], tokenize=False, **extra)
    return model.tokenizer.encode(text, add_special_tokens=False)  # type: ignore[no-any-return]


def _tiny_with_template(build_tiny, directory, template: str):  # type: ignore[no-untyped-def]
    """The tiny model, with room for tools, under another chat template."""
    from transformers import AutoTokenizer

    from chatcache import load_chat_model

    build_tiny(directory, max_positions=4096)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(directory)
    return load_chat_model(str(directory), device="cpu")


@pytest.fixture(scope="module")
def hermes_model(build_tiny, tmp_path_factory):  # type: ignore[no-untyped-def]
    return _tiny_with_template(build_tiny, tmp_path_factory.mktemp("tiny-hermes"), HERMES_TEMPLATE)


def test_a_template_with_hermes_tools_lays_out_the_tools_and_the_history_itself(hermes_model, make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    """The model reads the tools in its template's own words, and a history of calls and results
    as its template renders them; the calls still hold to their schemas and reuse the KV."""
    from chatcache import TokenTierConfig
    from chatcache.langchain.messages import to_chatcache
    from chatcache.model.prompt import PromptRenderer, RenderedSegments

    assert PromptRenderer(hermes_model.tokenizer).tool_syntax == CallSyntax("<tool_call>\n", "\n</tool_call>", between="", tool_role=True)  # this template trims the newline between calls
    assert PromptRenderer(tiny_model.tokenizer).tool_syntax is None  # plain ChatML: the documented format
    engine = make_engine(hermes_model, token_tier=TokenTierConfig(spill_dir=None))
    model = CachedChatModel(engine=engine, max_tokens=200).bind_tools([add], tool_choice="any")
    system, question = SystemMessage("You add."), HumanMessage("What is 1 + 2?")
    called = model.invoke([system, question])
    assert called.tool_calls and not called.invalid_tool_calls
    spec = ADD_SPEC

    def native_ids(messages: list[dict], **extra) -> list[int]:  # type: ignore[no-untyped-def]
        return _native_ids(hermes_model, messages, **extra)

    asked = [{"role": "system", "content": "You add."}, {"role": "user", "content": "What is 1 + 2?"}]
    assert called.usage_metadata["input_tokens"] == len(native_ids(asked, add_generation_prompt=True))
    call = called.tool_calls[0]
    result = ToolMessage("3", tool_call_id=call["id"], name="add")
    again = model.invoke([system, question, called, result, HumanMessage("And 2 + 2?")])
    structured = asked + [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": call["args"]}}]},
        {"role": "tool", "content": "3"},
        {"role": "user", "content": "And 2 + 2?"},
    ]
    # Our text for the call and the result renders as the template renders them structured (the
    # engine feeds the call as the ids it was generated as, which may spell it otherwise).
    ours = written(to_chatcache([system, question, called, result, HumanMessage("And 2 + 2?")]), engine.call_syntax)
    assert engine.renderer.with_tools([spec]).conversation_ids(ours, RenderedSegments()) == native_ids(structured, add_generation_prompt=True)
    assert again.usage_metadata["input_token_details"]["cache_read"] > called.usage_metadata["input_tokens"] // 2
    assert again.tool_calls


# A template with a tool format of its own that is not Hermes', written here after Llama 3.1's:
# the tools in the first user message, a call as a bare JSON object with "parameters", one
# call a reply, each result in an `ipython` turn of its own.
LLAMA_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}<|start_header_id|>system<|end_header_id|>\n\n{{ messages[0].content | trim }}<|eot_id|>"
    "{%- set messages = messages[1:] %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, respond with a JSON for a function call with its proper arguments.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n'
    "{% for tool in tools %}{{ tool | tojson }}\n\n{% endfor %}{{ message.content | trim }}<|eot_id|>"
    "{%- elif message.tool_calls %}{% if message.tool_calls | length > 1 %}{{ raise_exception('one call at a time') }}{% endif %}"
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "{{ message.tool_calls[0].function.name }}", '
    '"parameters": {{ message.tool_calls[0].function.arguments | tojson }}}<|eot_id|>'
    "{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ {'output': message.content} | tojson }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content | trim }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def llama_model(build_tiny, tmp_path_factory):  # type: ignore[no-untyped-def]
    return _tiny_with_template(build_tiny, tmp_path_factory.mktemp("tiny-llama-tools"), LLAMA_TEMPLATE)


def test_a_template_with_its_own_call_format_gets_calls_written_its_way(llama_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """A model whose template writes calls otherwise than Hermes is held to, and read back in,
    its own format; the history of calls and results renders as its template renders them."""
    from chatcache import TokenTierConfig
    from chatcache.langchain.messages import to_chatcache
    from chatcache.model.prompt import PromptRenderer, RenderedSegments

    syntax = PromptRenderer(llama_model.tokenizer).tool_syntax
    assert syntax == CallSyntax("", "", "parameters", between=None, tool_role=True)
    engine = make_engine(llama_model, token_tier=TokenTierConfig(spill_dir=None))
    model = CachedChatModel(engine=engine, max_tokens=200).bind_tools([add], tool_choice="any", parallel_tool_calls=True)
    system, question = SystemMessage("You add."), HumanMessage("What is 1 + 2?")
    called = model.invoke([system, question])
    assert len(called.tool_calls) == 1 and not called.invalid_tool_calls  # one call a reply: the template takes no more
    jsonschema.validate(called.tool_calls[0]["args"], _args_schema(add))
    spec = ADD_SPEC

    def native_ids(messages: list[dict], **extra) -> list[int]:  # type: ignore[no-untyped-def]
        return _native_ids(llama_model, messages, **extra)

    asked = [{"role": "system", "content": "You add."}, {"role": "user", "content": "What is 1 + 2?"}]
    assert called.usage_metadata["input_tokens"] == len(native_ids(asked, add_generation_prompt=True))
    call = called.tool_calls[0]
    results = [ToolMessage("3", tool_call_id=call["id"], name="add"), ToolMessage("checked", tool_call_id=call["id"], name="add")]
    history = [system, question, called, *results]
    structured = asked + [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": call["args"]}}]},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "checked"},
    ]
    ours = written(to_chatcache(history), engine.call_syntax)
    assert engine.renderer.with_tools([spec]).conversation_ids(ours, RenderedSegments()) == native_ids(structured, add_generation_prompt=True)
    answered = model.bind_tools([add], tool_choice="none").invoke(history)
    assert isinstance(answered.content, str) and not answered.tool_calls
    assert answered.usage_metadata["input_token_details"]["cache_read"] > called.usage_metadata["input_tokens"] // 2


def test_calls_in_a_bare_json_syntax_parse_and_text_stays_text() -> None:
    bare = CallSyntax("", "", "parameters", between=None)
    call = ToolCall("add", {"a": 1, "b": 2})
    assert calls_text([call], bare) == '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    assert parse_calls(calls_text([call], bare), bare) == ("", [call])
    assert parse_calls("Use {braces} like this.", bare) == ("Use {braces} like this.", [])
    with pytest.raises(ValueError, match="cut short"):
        parse_calls('{"name": "add", "parameters": {"a": 1', bare)
    with pytest.raises(ValueError, match="after a call"):
        parse_calls(calls_text([call, call], CallSyntax("", "", "parameters", between="\n")), bare)


# A template with Mistral's call format (its v3 tokenizer's, as the Mistral 7B v0.3 and Nemo
# templates write it), written here: the tools before the last user message, one reply's calls
# as one JSON list after `[TOOL_CALLS]`, each with an id of nine letters and digits, and each
# result naming the call it answers.
MISTRAL_TEMPLATE = (
    "{%- set system = messages[0].content if messages[0].role == 'system' else none %}"
    "{%- set turns = messages[1:] if system is not none else messages %}"
    "{%- set last_user = turns | selectattr('role', 'equalto', 'user') | list | last %}"
    "{%- for message in turns %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and message is sameas last_user %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{% if system is not none and loop.first %}{{ system }}\n\n{% endif %}{{ message.content }}[/INST]"
    "{%- elif message.tool_calls %}[TOOL_CALLS][{% for call in message.tool_calls %}"
    "{%- if call.id is not defined or call.id | length != 9 %}{{ raise_exception('a call id is nine letters and digits') }}{% endif %}"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments, 'id': call.id} | tojson }}"
    "{%- if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if message.tool_call_id is not defined or message.tool_call_id | length != 9 %}{{ raise_exception('a result names its call') }}{% endif %}"
    "[TOOL_RESULTS]{{ {'content': message.content, 'call_id': message.tool_call_id} | tojson }}[/TOOL_RESULTS]"
    "{%- else %}{{ message.content }}{{ eos_token }}{%- endif %}"
    "{%- endfor %}"
)
MISTRAL_SYNTAX = CallSyntax("[TOOL_CALLS][", "]", between=", ", tool_role=True, id_key="id", joined=True)


@pytest.fixture(scope="module")
def mistral_model(build_tiny, tmp_path_factory):  # type: ignore[no-untyped-def]
    return _tiny_with_template(build_tiny, tmp_path_factory.mktemp("tiny-mistral-tools"), MISTRAL_TEMPLATE)


def test_a_template_with_mistral_calls_gets_lists_of_calls_with_ids(mistral_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """Calls come back as the template writes them (a list, each call with the id the model
    wrote), and a history of calls and results, ids and all, renders as the template renders it:
    also one made elsewhere, whose longer ids are shortened alike in the call and its result."""
    from chatcache import TokenTierConfig
    from chatcache.langchain.messages import to_chatcache
    from chatcache.model.prompt import PromptRenderer, RenderedSegments
    from chatcache.model.tools import call_id

    assert PromptRenderer(mistral_model.tokenizer).tool_syntax == MISTRAL_SYNTAX
    engine = make_engine(mistral_model, token_tier=TokenTierConfig(spill_dir=None))
    model = CachedChatModel(engine=engine, max_tokens=300).bind_tools([add], tool_choice="any")  # one call: the random model would not stop
    system, question = SystemMessage("You add."), HumanMessage("What is 1 + 2?")
    called = model.invoke([system, question])
    assert len(called.tool_calls) == 1 and not called.invalid_tool_calls
    for call in called.tool_calls:
        assert call["id"] is not None and call_id(call["id"]) == call["id"]  # the model's own id, nine letters and digits
        jsonschema.validate(call["args"], _args_schema(add))

    def structured(calls: list[dict], results: list[ToolMessage]) -> list[dict]:  # type: ignore[type-arg]
        return [
            {"role": "system", "content": "You add."},
            {"role": "user", "content": "What is 1 + 2?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "id": call_id(c["id"]), "function": {"name": c["name"], "arguments": c["args"]}} for c in calls
            ]},
            *({"role": "tool", "content": r.content, "tool_call_id": call_id(r.tool_call_id)} for r in results),
        ]  # fmt: skip

    def native_ids(messages: list[dict]) -> list[int]:  # type: ignore[type-arg]
        return _native_ids(mistral_model, messages)

    results = [ToolMessage("3", tool_call_id=call["id"], name="add") for call in called.tool_calls]
    history = [system, question, called, *results]
    ours = written(to_chatcache(history), engine.call_syntax)
    assert engine.renderer.with_tools([ADD_SPEC]).conversation_ids(ours, RenderedSegments()) == native_ids(structured(called.tool_calls, results))
    answered = model.bind_tools([add], tool_choice="none").invoke(history)
    assert isinstance(answered.content, str) and not answered.tool_calls
    assert answered.usage_metadata["input_token_details"]["cache_read"] > called.usage_metadata["input_tokens"] // 2

    elsewhere = AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "call_0123456749abcdef"}])
    result = ToolMessage("3", tool_call_id="call_0123456749abcdef", name="add")
    ours = written(to_chatcache([system, question, elsewhere, result]), engine.call_syntax)
    expected = native_ids(structured(elsewhere.tool_calls, [result]))
    assert engine.renderer.with_tools([ADD_SPEC]).conversation_ids(ours, RenderedSegments()) == expected


def test_calls_in_a_list_syntax_round_trip_and_a_list_cut_inside_a_call_is_refused() -> None:
    calls = [ToolCall("add", {"a": 1, "b": 2}, "a1b2c3d4e"), ToolCall("add", {"a": 3, "b": 4}, "call_0123456749")]
    text = calls_text(calls, MISTRAL_SYNTAX)
    short = calls_text([calls[1]], MISTRAL_SYNTAX)[len("[TOOL_CALLS][") : -1]
    assert text == '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "a1b2c3d4e"}, ' + short + "]"
    head, parsed = parse_calls("Sure. " + text, MISTRAL_SYNTAX)
    assert head == "Sure. " and [(c.name, c.arguments) for c in parsed] == [(c.name, c.arguments) for c in calls]
    assert parsed[0].id == "a1b2c3d4e" and len(parsed[1].id) == 9  # a long id is written shortened
    with pytest.raises(ValueError, match="cut short"):
        parse_calls(text[:-3], MISTRAL_SYNTAX)
    with pytest.raises(ValueError, match="cut short"):  # opened, and cut before its first call
        parse_calls("Sure. [TOOL_CALLS][", MISTRAL_SYNTAX)
    # Cut only in its closing bracket, the list's calls are whole.
    assert [c.arguments for c in parse_calls(text[:-1], MISTRAL_SYNTAX)[1]] == [c.arguments for c in calls]
    with pytest.raises(ValueError, match="after the calls"):
        parse_calls(text + " and more", MISTRAL_SYNTAX)
    one = call_format([Tool("add", "Add.", _args_schema(add))], "any", parallel=True, syntax=MISTRAL_SYNTAX)
    assert one is not None
