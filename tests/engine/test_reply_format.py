"""Replies held to a JSON schema, a Lark grammar or a regex.

The tiny model's weights are random, so what it writes free is noise: every reply held to a
format that parses and validates does so because of the decoder, not the model.
"""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest

from chatcache import ConfigError, GenerationConfig, TokenTierConfig
from chatcache.reply_format import ReplyFormat, within_budget

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}
FLAGS = {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4}


@pytest.fixture
def engine(tiny_model, make_engine):  # type: ignore[no-untyped-def]
    return make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=None))


@pytest.mark.parametrize("schema", [PERSON, FLAGS], ids=["object", "array"])
def test_every_reply_ends_valid_against_its_schema(engine, schema) -> None:  # type: ignore[no-untyped-def]
    reply_format = ReplyFormat.json_schema(schema)
    for turn in range(6):
        reply = engine.chat(f"s{turn % 2}", f"question {turn} about things", reply_format=reply_format, max_new_tokens=120)
        assert reply.stats.finish_reason == "eos", reply.text
        jsonschema.validate(json.loads(reply.text), schema)


def test_free_replies_of_the_same_model_are_not_json(engine) -> None:  # type: ignore[no-untyped-def]
    """The control: without a format the random model writes no valid reply in the schema."""
    valid = 0
    for turn in range(4):
        text = engine.chat(f"free{turn}", f"question {turn} about things", max_new_tokens=60).text
        try:
            jsonschema.validate(json.loads(text), PERSON)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    assert valid == 0


def test_lark_and_regex_formats_hold(engine) -> None:  # type: ignore[no-untyped-def]
    lark = ReplyFormat.lark('start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]{1,3}/\n')
    regex = ReplyFormat.regex(r"[A-Z][a-z]{2,8}( [a-z]{1,6}){0,3}\.")
    for turn in range(4):
        answer = engine.chat(f"l{turn}", f"say {turn}", reply_format=lark, max_new_tokens=20)
        assert re.fullmatch(r"yes|no|maybe [0-9]{1,3}", answer.text), answer.text
        sentence = engine.chat(f"r{turn}", f"say {turn}", reply_format=regex, max_new_tokens=40)
        assert re.fullmatch(r"[A-Z][a-z]{2,8}( [a-z]{1,6}){0,3}\.", sentence.text), sentence.text


@pytest.mark.bundled
def test_a_format_that_allows_any_text_changes_nothing(bundled_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """The mask path alone (any text allowed) gives the reply the unformatted path gives. On the
    bundled model: the tiny one's byte tokens spell invalid UTF-8, which no text format allows."""
    anything = ReplyFormat.regex(r"(?s:.*)")
    engine = make_engine(bundled_model, token_tier=TokenTierConfig(spill_dir=None))
    free = make_engine(bundled_model, token_tier=TokenTierConfig(enabled=False))
    for turn, question in enumerate(["What is the capital of France?", "Name three colours.", "How do I reset my PIN?"]):
        held = engine.chat(f"a{turn}", question, reply_format=anything, max_new_tokens=24)
        alone = free.chat(f"a{turn}", question, max_new_tokens=24)
        assert held.token_ids == alone.token_ids


def test_formatted_and_free_replies_batched_at_once(engine, make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Held and free replies decode in one batch from real threads; each free reply equals the
    same turn answered alone, and each held one validates."""
    reply_format = ReplyFormat.json_schema(PERSON)
    alone = make_engine(tiny_model, token_tier=TokenTierConfig(enabled=False))
    expected = {i: alone.chat(f"t{i}", f"thread {i} asks", max_new_tokens=32).token_ids for i in range(0, 6, 2)}
    results: dict[int, object] = {}
    start = threading.Barrier(6)

    def run(i: int) -> None:
        start.wait()
        held = reply_format if i % 2 else None
        results[i] = engine.chat(f"t{i}", f"thread {i} asks", reply_format=held, max_new_tokens=32 if held is None else 120)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, reply in results.items():
        if i % 2:
            jsonschema.validate(json.loads(reply.text), PERSON)  # type: ignore[attr-defined]
        else:
            assert reply.token_ids == expected[i]  # type: ignore[attr-defined]
    assert tiny_model.scheduler.peak_running >= 2


def test_cut_short_by_the_budget_says_so(engine) -> None:  # type: ignore[no-untyped-def]
    reply = engine.chat("cut", "go", reply_format=ReplyFormat.json_schema(PERSON), max_new_tokens=5)
    assert reply.stats.finish_reason == "length"


def test_bad_formats_are_refused_at_once() -> None:
    with pytest.raises(ConfigError, match="not valid"):
        ReplyFormat.json_schema({"type": "objectx"})
    with pytest.raises(ConfigError, match="not valid"):
        ReplyFormat.lark("start: (")
    with pytest.raises(ConfigError, match="dict"):
        ReplyFormat.json_schema("not a schema")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ReplyFormat"):
        GenerationConfig(reply_format={"type": "object"})  # type: ignore[arg-type]


def test_formats_have_their_own_cache_keys() -> None:
    one, other = ReplyFormat.json_schema(PERSON), ReplyFormat.json_schema(FLAGS)
    assert one.key == ReplyFormat.json_schema(dict(PERSON)).key
    assert len({one.key, other.key, ReplyFormat.regex("a").key, ReplyFormat.lark('start: "a"').key}) == 4


def test_within_budget_bounds_free_strings_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "string"},
            "bounded": {"type": "string", "maxLength": 3},
            "choice": {"type": "string", "enum": ["a", "b"]},
            "nested": {"type": "array", "items": {"type": ["string", "null"]}},
        },
    }
    bounded = within_budget(schema, max_new_tokens=100, reserved_tokens=10)
    assert "maxLength" not in schema["properties"]["free"]  # type: ignore[index]
    props = bounded["properties"]
    assert props["free"]["maxLength"] == props["nested"]["items"]["maxLength"] >= 8
    assert props["bounded"]["maxLength"] == 3 and "maxLength" not in props["choice"]
    # Whatever the bounded schema accepts, the original accepts.
    jsonschema.validate({"free": "x" * props["free"]["maxLength"], "nested": [None, "y"]}, schema)


def test_the_longest_reply_a_bounded_schema_allows_fits_the_budget(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Filled to every bound with digits (a token each on SmolLM's tokenizer; the tiny model's
    400-token vocabulary spends one on nearly every character), the reply still closes within its
    budget: the case of four dates that overran it at two characters a token."""
    schema = {
        "type": "object",
        "properties": {
            "dates": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "code": {"type": "string", "maxLength": 6},
            "count": {"type": "integer"},
            "note": {"type": "string"},
        },
        "required": ["dates", "code", "count", "note"],
    }
    for budget in (150, 200, 400):  # on a smaller one, the minimum lengths alone may not fit
        props = within_budget(schema, max_new_tokens=budget)["properties"]
        longest = {
            "dates": ["1" * props["dates"]["items"]["maxLength"]] * 4,
            "code": "1" * 6,
            "count": props["count"]["minimum"],
            "note": "1" * props["note"]["maxLength"],
        }
        jsonschema.validate(longest, schema)
        assert len(tiny_model.tokenizer.encode(json.dumps(longest), add_special_tokens=False)) <= budget, budget


def test_held_turns_on_the_token_tier_equal_the_uncached_path(engine, make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Later turns reuse the session's KV (the held reply included) and still give what a full
    recompute gives."""
    reply_format = ReplyFormat.json_schema(PERSON)
    uncached = make_engine(tiny_model, token_tier=TokenTierConfig(enabled=False))
    for turn in range(3):
        cached = engine.chat("kv", f"turn {turn} please", reply_format=reply_format, max_new_tokens=120)
        fresh = uncached.chat("kv", f"turn {turn} please", reply_format=reply_format, max_new_tokens=120)
        assert cached.token_ids == fresh.token_ids
        if turn:
            assert cached.stats.reused_tokens > 0


def test_stop_strings_still_stop_a_held_reply(engine) -> None:  # type: ignore[no-untyped-def]
    reply = engine.chat("stop", "go", reply_format=ReplyFormat.json_schema(PERSON), stop=['"age"'], max_new_tokens=120)
    assert reply.stats.finish_reason == "stop" and reply.text.startswith('{"name": "') and '"age"' not in reply.text
