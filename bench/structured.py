"""Tool calls and structured output on the bundled model, with and without decoding held to the
schema: what share comes back valid, and what the constraint costs per token.

The prompts are those of LangChain's standard integration suite (magic_function(3), the weather
in San Francisco, 1 + 2 with the adder, the Unicode customer, the cat joke as JSON) and 50 of
our own: 25 requests for one of five tools, 25 for an object in one of three schemas. Each
prompt runs twice on the same engine, interleaved, with the same messages: free (the tools or
the schema are in the prompt; the reply is parsed) and held to its format (`ReplyFormat`: the
tool-call grammar with `tool_choice="any"`, or the JSON schema, its strings bounded to the
budget as `CachedChatModel` bounds them). A tool call is valid when it parses, names a bound
tool and its arguments validate against that tool's schema (`right_tool_share`: and names the tool
the prompt asks for; `routed` adds the tool router, as `CachedChatModel` does under `auto`); an
object when it parses and validates against its schema. Decode speed is each reply's generated tokens per second after
its first token. Prints JSON, writes `<out>/structured.json` as it goes and `<out>/structured.png`.

    python -m bench.structured [--quick] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

from bench.common import BenchRun, bench_arguments, median

INT = {"type": "integer"}
STR = {"type": "string"}


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A tool spec as `CachedChatModel.bind_tools` makes it (LangChain's strict conversion)."""
    parameters = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {"name": name, "description": description, "parameters": parameters}


TOOLS = {
    "magic_function": _tool("magic_function", "Apply a magic function to an input.", {"input": INT}),
    "get_weather": _tool("get_weather", "Get the weather at a location.", {"location": STR}),
    "my_adder_tool": _tool("my_adder_tool", "Takes two integers and returns their sum.", {"a": INT, "b": INT}),
    "unicode_customer": _tool(
        "unicode_customer",
        "Tool for creating a customer with Unicode name.",
        {"customer_name": STR, "description": STR},
    ),
    "convert_currency": _tool("convert_currency", "Convert an amount from one currency to another.", {"amount": {"type": "number"}, "source": STR, "target": STR}),
    "set_alarm": _tool("set_alarm", "Set an alarm at a time of day.", {"time": STR, "label": STR}),
    "find_restaurant": _tool("find_restaurant", "Find a restaurant of a cuisine in a city.", {"cuisine": STR, "city": STR}),
}
SUITE_TOOL_PROMPTS = [
    ("magic_function", "What is the value of magic_function(3)? Use the tool."),
    ("get_weather", "What is the weather in San Francisco, CA?"),
    ("my_adder_tool", "What is 1 + 2"),
    ("unicode_customer", "Create a customer named '你好啊集团' (Hello Group) - a Chinese technology company"),
]
OWN_TOOL_PROMPTS = [
    ("get_weather", "Is it going to rain in Paris today?"),
    ("get_weather", "What's the temperature in Tokyo right now?"),
    ("get_weather", "Tell me the forecast for Berlin."),
    ("get_weather", "How hot is it in Cairo?"),
    ("get_weather", "Should I bring an umbrella in London?"),
    ("my_adder_tool", "Add 17 and 25."),
    ("my_adder_tool", "What is 100 plus 23?"),
    ("my_adder_tool", "Sum 8 and 9 for me."),
    ("my_adder_tool", "I need 40 + 2."),
    ("my_adder_tool", "Compute 7 + 35."),
    ("convert_currency", "Convert 100 dollars to euros."),
    ("convert_currency", "How many yen is 50 GBP?"),
    ("convert_currency", "Change 20 euros into Swiss francs."),
    ("convert_currency", "What is 1000 USD in CAD?"),
    ("convert_currency", "Exchange 75 pounds to dollars."),
    ("set_alarm", "Wake me up at 7 am."),
    ("set_alarm", "Set an alarm for 6:30 called gym."),
    ("set_alarm", "Remind me at noon to call mum."),
    ("set_alarm", "Alarm at 22:00 for medicine."),
    ("set_alarm", "I need an alarm at 5 in the morning."),
    ("find_restaurant", "Find me a sushi place in Seattle."),
    ("find_restaurant", "Any good Italian restaurants in Boston?"),
    ("find_restaurant", "I want Mexican food in Austin."),
    ("find_restaurant", "Look for a vegan restaurant in Portland."),
    ("find_restaurant", "Where can I eat Thai in Chicago?"),
]
SCHEMAS = {
    "joke": {
        "title": "Joke",
        "type": "object",
        "properties": {
            "setup": {"type": "string", "description": "question to set up a joke"},
            "punchline": {"type": "string", "description": "answer to resolve the joke"},
        },
        "required": ["setup", "punchline"],
        "additionalProperties": False,
    },
    "person": {
        "title": "Person",
        "type": "object",
        "properties": {"name": STR, "age": INT, "city": STR},
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    },
    "event": {
        "title": "Event",
        "type": "object",
        "properties": {"title": STR, "date": STR, "attendees": {"type": "array", "items": STR, "maxItems": 4}},
        "required": ["title", "date", "attendees"],
        "additionalProperties": False,
    },
    "review": {
        "title": "Review",
        "type": "object",
        "properties": {"product": STR, "stars": {"type": "integer", "minimum": 1, "maximum": 5}, "summary": STR},
        "required": ["product", "stars", "summary"],
        "additionalProperties": False,
    },
}
SUITE_SCHEMA_PROMPTS = [
    ("joke", "Tell me a joke about cats."),
    ("joke", "Tell me a joke about cats. Return the result as a JSON with 'setup' and 'punchline' keys. Return nothing other than JSON."),
]
OWN_SCHEMA_PROMPTS = [
    ("person", "Describe Ada Lovelace."),
    ("person", "Make up a person who lives in Lisbon."),
    ("person", "Who is Albert Einstein?"),
    ("person", "Give me a fictional teacher."),
    ("person", "Create a character for a novel set in Rome."),
    ("person", "Describe a 30-year-old chef."),
    ("person", "Invent a football player."),
    ("person", "Tell me about Marie Curie."),
    ("event", "Plan a birthday party for Sam."),
    ("event", "Schedule a team meeting next Monday."),
    ("event", "Create a wedding on June 5 with Ana and Luis."),
    ("event", "Organise a book club evening."),
    ("event", "Set up a dentist appointment on Friday."),
    ("event", "A concert on 2027-03-01 with three friends."),
    ("event", "Arrange a picnic in the park."),
    ("event", "Make a calendar entry for the product launch."),
    ("review", "Review the new phone I bought: great battery, poor camera."),
    ("review", "Write a review of a coffee machine."),
    ("review", "I hated this vacuum cleaner."),
    ("review", "Rate a pair of running shoes."),
    ("review", "Review the hotel we stayed at in Nice."),
    ("review", "A short review of a laptop."),
    ("review", "Summarise a review of a kitchen knife set."),
    ("review", "Give five stars to a bicycle."),
    ("joke", "Tell me a joke about dogs."),
]


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__.split("\n\n")[0])
    bench_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    return parser.parse_args()


def tool_case(engine: Any, name: str, question: str, mode: str, max_new_tokens: int) -> dict[str, Any]:
    """One tool request: `free`, `held` (a call of any bound tool), or `routed` (held, and the
    router's closest tool when it finds one, as `CachedChatModel` does under `auto`)."""
    from chatcache.model.prompt import Message
    from chatcache.reply_format import within_budget
    from chatcache.model.tools import Tool, ToolCall, call_format, calls_text, parse_calls, tools_prompt

    tools = [Tool(spec["name"], spec["description"], spec["parameters"]) for spec in TOOLS.values()]
    reply_format = None
    if mode != "free":
        wrapper = len(engine.renderer.encode_text(calls_text([ToolCall(name, {})])))
        budgeted = [Tool(t.name, t.description, within_budget(t.parameters, max_new_tokens, wrapper)) for t in tools]
        routed = _router(engine).called(question, tools) if mode == "routed" else []
        reply_format = call_format(budgeted, routed[0].name if routed else "any", parallel=False)
    messages = [Message("system", tools_prompt(tools)), Message("user", question)]
    reply = _reply(engine, messages, reply_format, max_new_tokens)
    valid, right = False, False
    try:
        _, calls = parse_calls(reply.text.strip())
        if len(calls) == 1 and calls[0].name in TOOLS:
            jsonschema.validate(calls[0].arguments, TOOLS[calls[0].name]["parameters"])
            valid, right = True, calls[0].name == name
    except (ValueError, jsonschema.ValidationError):
        pass
    return {"valid": valid, "right_tool": right, **_speed(reply), "text": reply.text[:200]}


_ROUTERS: dict[int, Any] = {}


def _router(engine: Any) -> Any:
    from chatcache.model.loading import load_embedder
    from chatcache.steering.hcac import sentence_embed
    from chatcache.steering.tool_router import ToolRouter

    if id(engine) not in _ROUTERS:
        _ROUTERS[id(engine)] = ToolRouter(sentence_embed(load_embedder("bundled")))
    return _ROUTERS[id(engine)]


def schema_case(engine: Any, name: str, question: str, mode: str, max_new_tokens: int) -> dict[str, Any]:
    from chatcache.model.prompt import Message
    from chatcache.reply_format import ReplyFormat, within_budget

    schema = SCHEMAS[name]
    instruction = f"{question}\nReply with only a JSON object that follows this JSON schema: {json.dumps(schema)}"
    reply_format = ReplyFormat.json_schema(within_budget(schema, max_new_tokens)) if mode == "held" else None
    reply = _reply(engine, [Message("user", instruction)], reply_format, max_new_tokens)
    try:
        jsonschema.validate(json.loads(_unfenced(reply.text)), schema)
        valid = True
    except (ValueError, jsonschema.ValidationError):
        valid = False
    return {"valid": valid, **_speed(reply), "text": reply.text[:200]}


def _unfenced(text: str) -> str:
    """The JSON of a free reply, out of a ```json fence if the model wrote one (a fair reading)."""
    text = text.strip()
    if "```" in text:
        inside = text.split("```")[1]
        text = inside.removeprefix("json").strip()
    return text


def _reply(engine: Any, messages: list[Any], reply_format: Any, max_new_tokens: int) -> Any:
    stream = engine.complete(messages, max_new_tokens=max_new_tokens, reply_format=reply_format)
    for _ in stream:
        pass
    return stream.reply


def _speed(reply: Any) -> dict[str, Any]:
    return {"generated_tokens": reply.stats.generated_tokens, "decode_tokens_per_s": round(reply.stats.decode_tokens_per_s, 2)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"cases": len(rows)}
    for mode in [m for m in ("free", "held", "routed") if m in rows[0]]:
        mine = [r[mode] for r in rows]
        out[mode] = {
            "valid_share": round(sum(r["valid"] for r in mine) / len(mine), 3) if mine else 0.0,
            "decode_tokens_per_s_p50": round(median([r["decode_tokens_per_s"] for r in mine if r["generated_tokens"] > 1]), 2),
            "generated_tokens_p50": median([r["generated_tokens"] for r in mine]),
        }
        if mine and "right_tool" in mine[0]:
            out[mode]["right_tool_share"] = round(sum(r["right_tool"] for r in mine) / len(mine), 3)
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g in ("suite tool calls", "own tool calls", "suite structured", "own structured") if g in summary]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for offset, mode in ((-width / 2, "free"), (width / 2, "held")):  # "routed" differs from "held" only in which tool
        xs = [i + offset for i in range(len(groups))]
        left.bar(xs, [summary[g][mode]["valid_share"] for g in groups], width, label=mode)
        right.bar(xs, [summary[g][mode]["decode_tokens_per_s_p50"] for g in groups], width, label=mode)
    left.set(ylabel="valid share", ylim=(0, 1.05))
    right.set(ylabel="decode tokens/s (p50)")
    for axis in (left, right):
        axis.set_xticks(range(len(groups)), groups, fontsize=8)
        axis.legend()
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle("bundled SmolLM2-135M: free replies against replies held to the schema", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    args = parse_options()
    run = BenchRun("structured", args, minutes=(14, 3))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from chatcache import ChatEngine, TokenTierConfig

    tool_modes, schema_modes = ("free", "held", "routed"), ("free", "held")
    groups = {
        "suite tool calls": (tool_case, tool_modes, SUITE_TOOL_PROMPTS),
        "own tool calls": (tool_case, tool_modes, OWN_TOOL_PROMPTS[:5] if args.quick else OWN_TOOL_PROMPTS),
        "suite structured": (schema_case, schema_modes, SUITE_SCHEMA_PROMPTS),
        "own structured": (schema_case, schema_modes, OWN_SCHEMA_PROMPTS[:5] if args.quick else OWN_SCHEMA_PROMPTS),
    }
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-structured-") as scratch:
        engine = ChatEngine(store=f"sqlite:///{scratch}/s.db", token_tier=TokenTierConfig(spill_dir=None))
        run.section("setup", {"model": "bundled SmolLM2-135M-Instruct, fp32, greedy", "max_new_tokens": args.max_new_tokens})
        for group, (case, modes, prompts) in groups.items():
            rows = []
            for name, question in prompts:
                # Interleaved, each mode in turn on one engine: all see the same load.
                rows.append({"expected": name, "question": question, **{
                    mode: case(engine, name, question, mode, args.max_new_tokens) for mode in modes
                }})  # fmt: skip
                summary[group] = summarize(rows)
                run.section("groups", summary)
            run.section(f"cases: {group}", rows)
        engine.close()
    plot_path = Path(args.out) / "structured.png"
    plot(summary, plot_path)
    run.finish(plot=str(plot_path))


if __name__ == "__main__":
    main()
