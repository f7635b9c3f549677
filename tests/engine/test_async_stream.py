"""`astream`: turns read from asyncio tasks run at once on the model's worker, reply as they do
alone, and a reader that is cancelled keeps what was generated, as a closed `stream` does."""

from __future__ import annotations

import asyncio

import pytest

from chatcache import ChatModel, InvalidMessageError, TokenTierConfig

SYSTEM = "You are a test bot. Answer briefly."
QUESTIONS = ["Hello there", "Book a table for two", "What is the weather like in Paris?", "Tell me a joke"]


async def _read(stream) -> str:  # type: ignore[no-untyped-def]
    return "".join([piece async for piece in stream])


def test_turns_from_asyncio_tasks_batch_and_reply_as_alone(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    model = ChatModel(tiny_model.name, tiny_model.model, tiny_model.tokenizer, tiny_model.identity)
    engine = make_engine(model, system_prompt=SYSTEM)

    async def main() -> list[list[int]]:
        streams = [engine.astream(f"s{i}", text, max_new_tokens=10) for i, text in enumerate(QUESTIONS)]
        texts = await asyncio.gather(*(_read(stream) for stream in streams))
        assert all(s.reply is not None and s.reply.text == text for s, text in zip(streams, texts))
        return [s.reply.token_ids for s in streams]  # type: ignore[union-attr]

    together = asyncio.run(main())
    assert model.scheduler.peak_running > 1  # the loop was never blocked: the turns decoded together
    model.close()
    alone = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    assert together == [alone.chat(f"alone-{i}", text, max_new_tokens=10).token_ids for i, text in enumerate(QUESTIONS)]


def test_a_cancelled_reader_keeps_what_was_generated(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM)
    received: list[str] = []

    async def main() -> None:
        stream = engine.astream("s", QUESTIONS[0], max_new_tokens=200)

        async def read() -> None:
            async for piece in stream:
                received.append(piece)

        task = asyncio.create_task(read())
        while not received:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()
        assert stream.reply is not None and stream.reply.stats.finish_reason == "cancelled"
        assert stream.reply.text.startswith("".join(received))
        assert len(stream.reply.token_ids) < 200

    asyncio.run(main())
    history = engine.sessions.history("s")
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[1].content.startswith("".join(received))


def test_refused_messages_raise_as_stream_does(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM, context_window=64)

    async def main() -> None:
        with pytest.raises(InvalidMessageError):
            engine.astream("s", "   ")
        with pytest.raises(InvalidMessageError, match="context window"):
            await _read(engine.astream("s", "word " * 200, max_new_tokens=8))

    asyncio.run(main())
    assert engine.sessions.all() == []  # nothing was recorded
