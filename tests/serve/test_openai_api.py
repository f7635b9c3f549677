"""The official OpenAI client, and LangChain's ChatOpenAI, against a live server on loopback."""

from __future__ import annotations

import asyncio

import openai
import pytest

from chatcache import ChatEngine, Message

HELLO = [{"role": "user", "content": "Hello there, how are you?"}]
CONCISE = "You are a concise assistant. Answer in one short sentence."


def test_sync_client_answers_as_the_engine_does_off_the_record(serve, tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [live.model_id]
    completion = client.chat.completions.create(model=live.model_id, messages=HELLO, max_tokens=12)  # type: ignore[arg-type]
    engine: ChatEngine = make_engine(tiny_model, system_prompt="You are a helpful, concise assistant.")
    alone = engine.complete([Message("user", HELLO[0]["content"])], max_new_tokens=12)
    expected = "".join(alone)
    assert completion.choices[0].message.content == expected
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens == len(alone.reply.token_ids)  # type: ignore[union-attr]


def test_streamed_pieces_join_to_the_whole_answer_and_usage_comes_last(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    whole = client.chat.completions.create(model=live.model_id, messages=HELLO, max_tokens=10)  # type: ignore[arg-type]
    chunks = list(
        client.chat.completions.create(
            model=live.model_id, messages=HELLO, max_tokens=10, stream=True, stream_options={"include_usage": True}  # type: ignore[arg-type]
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    # The second identical conversation reuses the first's KV: the token tier serves its prompt.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]


def test_async_client_streams_concurrent_requests(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="unused")

        async def one(text: str) -> str:
            stream = await client.chat.completions.create(
                model=live.model_id, messages=[{"role": "user", "content": text}], max_tokens=8, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        whole = await client.chat.completions.create(model=live.model_id, messages=[{"role": "user", "content": "Tell me a joke"}], max_tokens=8)
        streamed = await asyncio.gather(*(one(t) for t in ["Tell me a joke", "What is the weather", "Book a table"]))
        return [whole.choices[0].message.content or "", *streamed]

    whole, joke, *others = asyncio.run(run())
    assert joke == whole
    assert all(isinstance(o, str) for o in others)


def test_a_session_turn_keeps_the_conversation_and_reuses_its_kv(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", default_headers={"X-Session-Id": "chat-1"})
    first = client.chat.completions.create(model=live.model_id, messages=HELLO, max_tokens=6)  # type: ignore[arg-type]
    second = client.chat.completions.create(model=live.model_id, messages=[{"role": "user", "content": "And then?"}], max_tokens=6)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]  # the history is in the prompt
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]
    extension = second.model_extra["chatcache"]  # type: ignore[index]
    assert extension["session_id"] == "chat-1" and extension["tier"] == "session"
    with live.client() as http:
        messages = http.get("/v1/sessions/chat-1").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[3]["content"] == second.choices[0].message.content


@pytest.mark.bundled
def test_an_answer_from_the_answer_cache_streams_and_says_so(serve, bundled_model) -> None:  # type: ignore[no-untyped-def]
    live = serve(chat_model=bundled_model, answer_cache=True, drift=False, system_prompt=CONCISE)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    generated = list(client.chat.completions.create(model=live.model_id, messages=question, max_tokens=48, stream=True))  # type: ignore[arg-type]
    assert generated[-1].model_extra["chatcache"]["answer_cache_hit"] is False  # type: ignore[index]
    chunks = list(client.chat.completions.create(model=live.model_id, messages=question, max_tokens=48, stream=True))  # type: ignore[arg-type]
    final = chunks[-1].model_extra["chatcache"]  # type: ignore[index]
    assert final["answer_cache_hit"] is True and final["tier"] == "answer"

    def pieces(stream: list) -> list[str]:  # type: ignore[type-arg]
        return [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]

    assert pieces(chunks) == pieces(generated) and len(pieces(chunks)) > 3  # token by token, as it was generated


def test_langchain_chat_openai_talks_to_the_server(serve) -> None:  # type: ignore[no-untyped-def]
    from langchain_openai import ChatOpenAI

    live = serve(answer_cache=False, drift=False)
    chat = ChatOpenAI(base_url=f"{live.url}/v1", api_key="unused", model=live.model_id, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    answer = chat.invoke("Hello there, how are you?")
    streamed = "".join(str(piece.content) for piece in chat.stream("Hello there, how are you?"))
    assert isinstance(answer.content, str) and streamed == answer.content
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_structured_outputs_hold_the_reply_to_the_schema(serve) -> None:  # type: ignore[no-untyped-def]
    """OpenAI's `response_format`, whole and streamed, from the OpenAI client and LangChain's
    ChatOpenAI: the tiny model's random weights write noise, yet every reply validates."""
    import json

    import jsonschema
    from langchain_openai import ChatOpenAI

    live = serve(answer_cache=False, drift=False)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for question in ("Describe Ada.", "Describe Bob."):
        whole = client.chat.completions.create(
            model=live.model_id, messages=[{"role": "user", "content": question}], max_tokens=120, response_format=response_format  # type: ignore[arg-type]
        )
        jsonschema.validate(json.loads(whole.choices[0].message.content or ""), PERSON)
        chunks = client.chat.completions.create(
            model=live.model_id, messages=[{"role": "user", "content": question}], max_tokens=120,  # type: ignore[arg-type]
            response_format=response_format, stream=True,  # type: ignore[arg-type]
        )  # fmt: skip
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    json_object = client.chat.completions.create(
        model=live.model_id, messages=HELLO, max_tokens=120, response_format={"type": "json_object"}  # type: ignore[arg-type]
    )
    assert isinstance(json.loads(json_object.choices[0].message.content or ""), dict)
    chat = ChatOpenAI(base_url=f"{live.url}/v1", api_key="unused", model=live.model_id, max_tokens=120, temperature=0)  # type: ignore[arg-type]
    parsed = chat.with_structured_output({"title": "Person", **PERSON}, method="json_schema").invoke("Describe Ada.")
    jsonschema.validate(parsed, PERSON)
    with pytest.raises(openai.BadRequestError, match="not valid"):
        client.chat.completions.create(
            model=live.model_id, messages=HELLO, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}  # type: ignore[arg-type]
        )
