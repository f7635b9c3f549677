"""LangChain benchmark: TTFT per turn of `CachedChatModel` against `ChatHuggingFace`, side by side.

Both run the same loaded bundled model and tokenizer (SmolLM2-135M-Instruct), greedy, behind
the same ~600-token system prompt, through a 10-turn conversation (the user turns of an SGD
dev dialogue, padded with follow-ups), each model continuing its own conversation as
LangChain does: the whole message list is sent on every turn.
  * CachedChatModel: the token tier reuses the KV of the conversation so far and prefills
    only the new turn;
  * ChatHuggingFace over a HuggingFacePipeline: every turn prefills the whole conversation.
TTFT is the time from the `stream()` call to the first chunk with text, for both (the
pipeline streams through transformers' TextIteratorStreamer). Each model is warmed up once
on an unrelated system prompt first.

    python -m bench.langchain_ttft [--data ../shared/data] [--turns 10] [--max-new-tokens 32] [--threads N] [--out bench/out] [--quick]

About 3 minutes on 2 CPU cores; --quick (5 turns, 16-token replies) about 1 minute. Results
are written to bench/out/langchain_ttft.json as each model's conversation finishes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from chatcache import ChatEngine, TokenTierConfig, load_chat_model
from chatcache.langchain import CachedChatModel

from .common import BenchRun, bench_arguments, schema_system_prompt, sgd_user_turns

FOLLOW_UPS = [
    "Thanks. Can you summarise what we have so far?",
    "Is there anything else I should know?",
    "Please confirm the details once more.",
    "Great, what happens next?",
]


def user_turns(data_dir: Path, turns: int) -> list[str]:
    picked = sgd_user_turns(data_dir, dialogues=1, min_turns=min(turns, 6))
    said = picked[0][1][:turns] if picked else []
    return (said + FOLLOW_UPS * turns)[:turns]


def stream_turn(model: BaseChatModel, messages: list[BaseMessage]) -> tuple[float, str, dict[str, Any]]:
    """TTFT (to the first chunk with text), the reply text and the last chunk's metadata."""
    started = time.perf_counter()
    ttft = float("nan")
    text, metadata = "", {}
    for chunk in model.stream(messages):
        if chunk.content and ttft != ttft:
            ttft = time.perf_counter() - started
        text += str(chunk.content)
        metadata = chunk.response_metadata or metadata
    return ttft, text, metadata


def converse(model: BaseChatModel, system_prompt: str, turns: list[str]) -> list[dict[str, Any]]:
    stream_turn(model, [SystemMessage("You are a warm-up."), HumanMessage("Hi")])
    messages: list[BaseMessage] = [SystemMessage(system_prompt)]
    rows = []
    for number, text in enumerate(turns, start=1):
        messages.append(HumanMessage(text))
        ttft, reply, metadata = stream_turn(model, messages)
        messages.append(AIMessage(reply))
        rows.append({"turn": number, "ttft_s": ttft, "reply": reply, "tier": metadata.get("tier"),
                     "reused_tokens": metadata.get("reused_tokens"), "prefilled_tokens": metadata.get("prefilled_tokens")})
    return rows


def huggingface_chat(chat_model: Any, max_new_tokens: int) -> BaseChatModel:
    from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline
    from transformers import pipeline

    settings = {"max_new_tokens": max_new_tokens, "do_sample": False, "return_full_text": False}
    pipe = pipeline("text-generation", model=chat_model.model, tokenizer=chat_model.tokenizer, **settings)
    llm = HuggingFacePipeline(pipeline=pipe, pipeline_kwargs=settings)
    return ChatHuggingFace(llm=llm, tokenizer=chat_model.tokenizer, model_id=chat_model.name)


def plot(cached: list[dict[str, Any]], baseline: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot([r["turn"] for r in baseline], [r["ttft_s"] * 1000 for r in baseline], "o-", label="ChatHuggingFace (pipeline)")
    axes.plot([r["turn"] for r in cached], [r["ttft_s"] * 1000 for r in cached], "o-", label="CachedChatModel (chatcache)")
    axes.set_yscale("log")
    axes.set_xlabel("turn")
    axes.set_ylabel("time to first token (ms, log)")
    axes.set_title("LangChain, SmolLM2-135M, same weights, whole history sent each turn")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--turns", type=int, default=None, help="conversation turns (default 10, quick 5)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="reply length (default 32, quick 16)")
    parser.add_argument("--system-tokens", type=int, default=600)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    args.turns = args.turns or (5 if args.quick else 10)
    args.max_new_tokens = args.max_new_tokens or (16 if args.quick else 32)
    run = BenchRun("langchain_ttft", args, minutes=(3, 1))
    if args.threads:
        torch.set_num_threads(args.threads)
    chat_model = load_chat_model("bundled")
    system_prompt = schema_system_prompt(args.data, chat_model.tokenizer, args.system_tokens)
    turns = user_turns(args.data, args.turns)
    run.section(
        "setup",
        {
            "model": chat_model.name,
            "device": str(chat_model.device),
            "torch_threads": torch.get_num_threads(),
            "system_prompt_tokens": len(chat_model.tokenizer.encode(system_prompt, add_special_tokens=False)),
            "max_new_tokens": args.max_new_tokens,
            "ttft": "time from stream() to the first chunk with text, both models",
        },
    )
    with tempfile.TemporaryDirectory() as workdir:
        engine = ChatEngine(chat_model, store=f"sqlite:///{workdir}/sessions.db", token_tier=TokenTierConfig())
        cached = converse(CachedChatModel(engine=engine, max_tokens=args.max_new_tokens), system_prompt, turns)
        engine.close()
    run.section("cached_chat_model", [{k: v for k, v in row.items() if k != "reply"} for row in cached])
    baseline = converse(huggingface_chat(chat_model, args.max_new_tokens), system_prompt, turns)
    last_cached, last_baseline = cached[-1]["ttft_s"], baseline[-1]["ttft_s"]
    run.section(
        "turns",
        [
            {"turn": c["turn"], "cached_ttft_s": round(c["ttft_s"], 4), "chat_huggingface_ttft_s": round(b["ttft_s"], 4),
             "cached_tier": c["tier"], "cached_reused_tokens": c["reused_tokens"],
             "cached_prefilled_tokens": c["prefilled_tokens"], "same_reply": c["reply"].strip() == b["reply"].strip()}
            for c, b in zip(cached, baseline)
        ],
    )
    plot(cached, baseline, args.out / "langchain_ttft.png")
    speedup = last_baseline / last_cached
    run.finish(last_turn_speedup=round(speedup, 1), target_met=speedup >= 10, plot=str(args.out / "langchain_ttft.png"))

if __name__ == "__main__":
    main()
