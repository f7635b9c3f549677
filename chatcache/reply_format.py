"""Reply formats: a JSON schema, a Lark grammar or a regular expression a reply must follow.

A small model cannot be trusted to write valid JSON, but any model can be made to: at each
step the decoder lets through only the tokens that keep the reply inside the format
(`model/format_matcher.py`), so every reply that ends by itself parses. The grammar engine
is llguidance (PyPI `llguidance`): a Rust library with no dependencies, the one vLLM, SGLang
and llama.cpp use, that computes a token mask in well under a millisecond on a 49k
vocabulary and reads JSON schemas, Lark and regexes directly. Compared before choosing:
xgrammar needs triton (hundreds of MB, GPU-only) on Linux; outlines-core compiles a whole
automaton per schema up front; lm-format-enforcer is pure Python and walks the vocabulary on
every token.

A reply cut short (`max_new_tokens`, a stop string, a cancelled reader) is cut mid-format, as
any reply would be: its finish reason says so.

This module is the format as a value (what `GenerationConfig.reply_format` holds, what cache
keys name, what the OpenAI API's `response_format` asks for); it does not decode. Holding a
model's decoding to a format is the model's job, in `model/format_matcher.py`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import llguidance

from .errors import ConfigError

FormatKind = Literal["json_schema", "lark", "regex"]

# JSON laid out as `json.dumps` writes it, one way only: with free whitespace a small model
# spends its tokens on blank lines (measured on the bundled model: "\n\n,\n\n" between
# every pair). A schema's own "x-guidance" options still take precedence.
JSON_LAYOUT: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ReplyFormat:
    """What a reply must look like. Build one with `json_schema`, `json_object`, `lark` or `regex`.

    Attributes:
        kind: how `source` is read.
        source: the schema (as canonical JSON), the Lark grammar or the regex.
    """

    kind: FormatKind
    source: str

    def __post_init__(self) -> None:
        error = llguidance.LLMatcher.validate_grammar(self.grammar())
        if error:
            raise ConfigError(f"The reply format ({self.kind}) is not valid: {error}")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> ReplyFormat:
        """JSON that validates against `schema` (a JSON Schema as a dict)."""
        if not isinstance(schema, Mapping):
            raise ConfigError(f"A JSON schema is a dict, got {type(schema).__name__}")
        try:
            source = json.dumps(schema, ensure_ascii=False)  # key order kept: properties come in it
        except (TypeError, ValueError) as error:
            raise ConfigError(f"The JSON schema cannot be written as JSON: {error}") from error
        return cls("json_schema", source)

    @classmethod
    def json_object(cls) -> ReplyFormat:
        """Any JSON object (OpenAI's JSON mode)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def lark(cls, grammar: str) -> ReplyFormat:
        """Text that the Lark grammar `grammar` derives from its `start` rule (llguidance's Lark,
        which also takes `%json {schema}` for a JSON part)."""
        return cls("lark", grammar)

    @classmethod
    def regex(cls, pattern: str) -> ReplyFormat:
        """Text that the regular expression `pattern` matches whole."""
        return cls("regex", pattern)

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema, for a `json_schema` format."""
        return json.loads(self.source) if self.kind == "json_schema" else None

    @property
    def key(self) -> str:
        """Names the format in cache keys: an answer made in one format is never served in another."""
        return hashlib.sha256(f"{self.kind}\0{self.source}".encode()).hexdigest()[:16]

    def grammar(self) -> str:
        """The format as llguidance's grammar."""
        if self.kind == "json_schema":
            return str(llguidance.LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_LAYOUT))
        if self.kind == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(self.source))
        return str(llguidance.LLMatcher.grammar_from_regex(self.source))


_ANY_VALUE = ["string", "number", "boolean", "null", "array", "object"]


def from_response_format(response_format: Mapping[str, Any], max_new_tokens: int | None = None) -> ReplyFormat | None:
    """OpenAI's `response_format` (`text`, `json_object`, or `json_schema` with
    `json_schema.schema`) as a reply format; None for text. Given `max_new_tokens`, free strings
    are bounded to fit it (`within_budget`).

    Raises:
        ConfigError: an unknown type, or a `json_schema` without a schema.
    """
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema: Mapping[str, Any] = {"type": "object", "additionalProperties": {"type": _ANY_VALUE}}
    elif kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")  # type: ignore[assignment]
        if not isinstance(schema, Mapping):
            raise ConfigError("response_format of type json_schema needs {'json_schema': {'schema': {...}}}")
    else:
        raise ConfigError(f"Unknown response_format type {kind!r}: use text, json_object or json_schema")
    return ReplyFormat.json_schema(within_budget(schema, max_new_tokens) if max_new_tokens is not None else schema)


MIN_STRING_CHARS = 8
ASSUMED_ITEMS = 4  # how many items a string array without `maxItems` is budgeted for
SAFE_INTEGER = 2**53 - 1
VALUE_CHARS = 7  # around any value: its quotes or brackets and a separator, or a `false` and its separator


def within_budget(schema: Mapping[str, Any], max_new_tokens: int, reserved_tokens: int = 0) -> dict[str, Any]:
    """`schema` with a `maxLength` on each free string, so that a reply in it can close within
    `max_new_tokens` tokens, `reserved_tokens` of which go to text around the JSON (a tool call's
    wrapper).

    Why: a small model under greedy decoding loops inside a JSON string ("a cat is a cat, a cat
    is a cat, ...") until its budget ends, leaving JSON that does not parse. Each string the
    schema leaves unbounded (no `maxLength`, `enum`, `const`, `pattern` or `format`) gets a
    share of the characters the budget leaves after the keys, punctuation, integers and bounded
    strings, at least `MIN_STRING_CHARS`; a string in an array counts once per item it may
    repeat (`maxItems`, else `ASSUMED_ITEMS`). Each unbounded integer keeps to the range every
    JSON reader holds exactly (|n| < 2**53), so its digits cannot run on either. Characters are
    counted a token each: text usually takes fewer, but digits take one each on many tokenizers
    (SmolLM's), and at two characters a token a list of four dates overran its budget. So a
    small budget leaves short strings (8 characters each for a two-string object at 64 tokens;
    104 at the default 256). Every reply the bounded schema allows still validates
    against `schema`.
    """
    bounded = json.loads(json.dumps(schema))
    free: list[dict[str, Any]] = []
    weight = 0  # free strings, counted once per time each may appear
    fixed_chars = 0  # keys, punctuation, integers and strings bounded already

    def walk(node: Any, repeats: int) -> None:
        nonlocal fixed_chars, weight
        if isinstance(node, list):
            for item in node:
                walk(item, repeats)
            return
        if not isinstance(node, dict):
            return
        kinds = node.get("type")
        if kinds is not None:
            fixed_chars += VALUE_CHARS * repeats
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "string" in kinds and not ({"maxLength", "enum", "const", "pattern", "format"} & node.keys()):
            free.append(node)
            weight += repeats
        elif "string" in kinds and isinstance(node.get("maxLength"), int):
            fixed_chars += node["maxLength"] * repeats
        if "integer" in kinds and not ({"enum", "const"} & node.keys()):
            node.setdefault("minimum", -SAFE_INTEGER)
            node.setdefault("maximum", SAFE_INTEGER)
            fixed_chars += max(len(str(node["minimum"])), len(str(node["maximum"]))) * repeats
        properties = node.get("properties")
        for name in properties if isinstance(properties, dict) else {}:
            fixed_chars += (len(name) + 6) * repeats  # quotes, ": ", ", "
        for key, value in node.items():
            items = node.get("maxItems", ASSUMED_ITEMS) if key in ("items", "prefixItems") else 1
            walk(value, repeats * max(1, int(items)))

    walk(bounded, 1)
    if free:
        share = max(MIN_STRING_CHARS, (max_new_tokens - reserved_tokens - fixed_chars) // weight)  # a character a token
        for node in free:
            node["maxLength"] = share
    return bounded  # type: ignore[no-any-return]
