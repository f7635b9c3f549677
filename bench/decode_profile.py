"""Where one stream's decode step goes, and what the weight kernels torch offers here can do about it.

The bundled model decodes one token per step, reading every weight once: 135M parameters,
540 MB in fp32. This measures, on the machine it runs on:
  * one decode step of the bundled model (one stream, contexts of 200 and 1,000 tokens) and
    its profile by operator (share of the weight matmuls, attention, the rest);
  * the memory bandwidth a plain copy reaches, and so the step time the fp32 weights alone
    cost at that bandwidth (the floor for fp32, whatever the kernels);
  * the weight-only kernels that would read fewer bytes, on the model's own shapes with one
    row of activations: bf16, int8 (`_weight_int8pack_mm`) and 4-bit groups of 32
    (`_weight_int4pack_mm_for_cpu`, the layout of the GGUF's Q4_1), each against fp32;
  * `torch.compile` of the whole decode step on a static cache (the shape it needs to compile
    once), against the same step in eager mode;
  * the opt-in int8 precision of the bundled model on the CPU (`chatcache.model.int8_precision`:
    every linear layer's product in int8, attention in float64), against the exact fp32 mode,
    interleaved: the decode step, the weights' resident bytes, and what it changes: perplexity
    on SGD dev conversations, the share of positions with the same greedy next token, and the
    share of greedy replies to SGD user turns that are the same token for token;
  * in each mode, and in int8 with fp32 attention, the share of greedy replies on a system
    prompt's reused KV that are the same as a full recompute (the token tier's promise).

    python -m bench.decode_profile [--quick]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache, StaticCache

from chatcache import ChatModel, load_chat_model
from chatcache.config import GenerationConfig
from chatcache.model.intra_op_threads import model_threads, take_intra_op_threads

from .common import BenchRun, bench_arguments, schema_system_prompt, sgd_exchanges, sgd_user_turns

GROUP = 32  # the GGUF's Q4_1 block


def per_call_ms(call: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        call()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats * 1000


def decode_step(model: Any, context: int, repeats: int) -> tuple[float, Callable[[], object]]:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.randint(100, 1000, (1, context)), cache=cache, use_cache=True, logits_to_keep=1)
    token = torch.tensor([[100]])

    def step() -> object:
        with torch.no_grad():
            output = model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-1)  # every step sees the same context length
        return output

    return per_call_ms(step, repeats), step


def compiled_decode(model: Any, context: int, repeats: int) -> dict[str, float]:
    """One static-cache decode step, eager and under `torch.compile`; the first compiled call pays the compile."""
    steps = 2 * (repeats + 3) + 1
    cache = StaticCache(config=model.config, max_cache_len=context + steps)  # attention spans all of it every step
    with torch.no_grad():
        model(input_ids=torch.randint(100, 1000, (1, context)), past_key_values=cache)
    token = torch.tensor([[100]])

    def step_of(forward: Callable[..., Any]) -> Callable[[], object]:
        def step() -> object:
            with torch.no_grad():
                return forward(input_ids=token, past_key_values=cache, logits_to_keep=1)

        return step

    eager_ms = per_call_ms(step_of(model), repeats)
    compiled = step_of(torch.compile(model))
    started = time.perf_counter()
    compiled()
    compile_s = time.perf_counter() - started
    compiled_ms = per_call_ms(compiled, repeats)
    return {"eager_static_ms": round(eager_ms, 1), "compiled_static_ms": round(compiled_ms, 1),
            "speedup": round(eager_ms / compiled_ms, 3), "compile_s": round(compile_s, 1)}  # fmt: skip


def operator_shares(step: Callable[[], object], steps: int) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step()
    totals: dict[str, float] = {}
    for event in profiler.key_averages():
        totals[event.key] = totals.get(event.key, 0.0) + event.self_cpu_time_total
    whole = sum(totals.values())
    matmul = sum(v for k, v in totals.items() if k in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm"))
    attention = sum(v for k, v in totals.items() if "scaled_dot_product" in k)
    return {
        "weight_matmuls": round(matmul / whole, 3),
        "attention": round(attention / whole, 3),
        "everything_else": round(1 - (matmul + attention) / whole, 3),
        "top_operators": {k: round(v / whole, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:8]},
    }


def copy_bandwidth_gb_s(megabytes: int = 512) -> float:
    source = torch.empty(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    seconds = per_call_ms(lambda: target.copy_(source), 5) / 1000
    return 2 * source.numel() * 4 / seconds / 1e9  # read and write


def int4_operands(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Groups of 32 along the input, w = (q - 8) * scale + zero: the GGUF's Q4_1 grid exactly."""
    rows, columns = weight.shape
    groups = weight.reshape(rows, columns // GROUP, GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = ((groups - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(rows, columns)
    scales_zeros = torch.stack([scale.reshape(rows, -1).t(), (low + 8 * scale).reshape(rows, -1).t()], -1).contiguous()
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), scales_zeros


def weight_kernels(model: Any, repeats: int) -> list[dict[str, Any]]:
    """Each distinct linear shape of one layer, one row of activations: fp32 against the weight-only kernels."""
    layer = model.model.layers[0]
    shapes = {
        "q/o (576x576)": layer.self_attn.q_proj.weight,
        "k/v (192x576)": layer.self_attn.k_proj.weight,
        "gate/up (1536x576)": layer.mlp.gate_proj.weight,
        "down (576x1536)": layer.mlp.down_proj.weight,
    }
    rows = []
    for name, weight in shapes.items():
        weight = weight.detach().float().contiguous()
        x = torch.randn(1, weight.shape[1])
        bf16, xb = weight.to(torch.bfloat16), x.to(torch.bfloat16)
        scales = weight.abs().amax(1) / 127
        int8 = (weight / scales[:, None]).round().to(torch.int8)
        packed, scales_zeros = int4_operands(weight)
        fp32_ms = per_call_ms(lambda: torch.nn.functional.linear(x, weight), repeats)
        timings = {
            "bf16": per_call_ms(lambda: torch.nn.functional.linear(xb, bf16), repeats),
            "int8": per_call_ms(lambda: torch.ops.aten._weight_int8pack_mm(x, int8, scales), repeats),
            "int4_group32": per_call_ms(
                lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros), max(3, repeats // 10)
            ),
        }
        rows.append({"shape": name, "fp32_us": round(fp32_ms * 1000, 1), **{f"{k}_speedup": round(fp32_ms / v, 3) for k, v in timings.items()}})
    return rows


def resident_weight_bytes(model: Any) -> int:
    """Bytes of the parameters and buffers the model holds (tied tensors once)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def engine_decode_ms(chat_model: ChatModel, context: int, tokens: int) -> float:
    """Milliseconds a token of one reply decoded by the model's worker (the engine's path), after its first."""
    prompt = torch.randint(100, 1000, (context,)).tolist()
    request = chat_model.scheduler.submit(DynamicCache(config=chat_model.model.config), prompt, GenerationConfig(max_new_tokens=tokens + 1), set())
    tokens_out = iter(request)
    next(tokens_out)
    started = time.perf_counter()
    decoded = sum(1 for _ in tokens_out)
    return (time.perf_counter() - started) / decoded * 1000


def raw_step_ms(model: Any, repeats: int) -> Callable[[int], float]:
    """`decode_step` in this thread on the threads the model's worker has (see `model_threads`)."""

    def measure(context: int) -> float:
        with model_threads():
            return decode_step(model, context, repeats)[0]

    return measure


def interleaved_steps(measures: dict[str, Callable[[int], float]], contexts: tuple[int, ...], rounds: int) -> dict[str, Any]:
    """Decode-step medians of each measure, taken in alternation so that the machine's drift hits all alike."""
    timings: dict[str, dict[int, list[float]]] = {name: {c: [] for c in contexts} for name in measures}
    for _ in range(rounds):
        for context in contexts:
            for name, measure in measures.items():
                timings[name][context].append(measure(context))
    return {
        name: {str(c): round(statistics.median(v), 1) for c, v in by_context.items()} for name, by_context in timings.items()
    }


def template_ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
    """The messages in the model's chat template as token ids (transformers gives a list or an encoding)."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def conversation_ids(chat_model: ChatModel, data: Any, dialogues: int, max_tokens: int = 512) -> list[torch.Tensor]:
    """SGD dev conversations (user and system turns) in the model's chat template, cut at `max_tokens`."""
    conversations = []
    for pairs in sgd_exchanges(data, dialogues, min_turns=2):
        messages = [m for user, system in pairs for m in ({"role": "user", "content": user}, {"role": "assistant", "content": system})]
        conversations.append(torch.tensor([template_ids(chat_model.tokenizer, messages)[:max_tokens]]))
    return conversations


def perplexity_and_agreement(exact: Any, other: Any, conversations: list[torch.Tensor]) -> dict[str, float]:
    """Both models' perplexity on the conversations, and where their greedy next tokens agree."""
    nll = {"exact": 0.0, "int8": 0.0}
    agree = positions = 0
    for ids in conversations:
        with torch.no_grad():
            logits = {"exact": exact(input_ids=ids).logits[0, :-1], "int8": other(input_ids=ids).logits[0, :-1]}
        for name, value in logits.items():
            nll[name] += float(torch.nn.functional.cross_entropy(value, ids[0, 1:], reduction="sum"))
        agree += int((logits["exact"].argmax(-1) == logits["int8"].argmax(-1)).sum())
        positions += ids.shape[1] - 1
    exact_ppl, int8_ppl = (math.exp(nll[name] / positions) for name in ("exact", "int8"))
    return {
        "positions": positions,
        "exact_perplexity": round(exact_ppl, 3),
        "int8_perplexity": round(int8_ppl, 3),
        "perplexity_change": round(int8_ppl / exact_ppl - 1, 4),
        "same_greedy_next_token": round(agree / positions, 4),
    }


def greedy_reply_agreement(exact: ChatModel, other: ChatModel, prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
    """Greedy replies of both modes to the same user turns: how many are the same, and where the others part."""
    same, parted_at = 0, []
    for prompt in prompts:
        ids = torch.tensor([template_ids(exact.tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True)])
        replies = [
            m.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[1] :].tolist() for m in (exact, other)
        ]
        first_difference = next((i for i, (a, b) in enumerate(zip(*replies)) if a != b), None)
        if first_difference is None and len(replies[0]) == len(replies[1]):
            same += 1
        else:
            parted_at.append(first_difference if first_difference is not None else min(map(len, replies)))
    return {
        "replies": len(prompts),
        "max_new_tokens": max_new_tokens,
        "same_reply_share": round(same / len(prompts), 3),
        "first_different_token_median": statistics.median(parted_at) if parted_at else None,
    }


def reuse_agreement(chat_model: ChatModel, system: str, prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
    """Greedy replies on the system prompt's KV computed beforehand, against the same replies computed from nothing."""
    tokenizer, model = chat_model.tokenizer, chat_model.model
    prefix = template_ids(tokenizer, [{"role": "system", "content": system}])
    same = 0
    for prompt in prompts:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        ids = torch.tensor([template_ids(tokenizer, messages, add_generation_prompt=True)])
        assert ids[0, : len(prefix)].tolist() == prefix, "the system turn renders the same alone"
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, : len(prefix)], cache=cache, use_cache=True)
        reused = model.generate(ids, cache=cache, max_new_tokens=max_new_tokens, do_sample=False)
        full = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        same += int(torch.equal(reused, full))
    return {"replies": len(prompts), "prefix_tokens": len(prefix), "same_as_full_recompute": round(same / len(prompts), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    args = parser.parse_args()
    repeats = 10 if args.quick else 40
    run = BenchRun("decode_profile", args, minutes=(8, 4))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    exact = load_chat_model("bundled", device="cpu", precision="exact")
    int8 = load_chat_model("bundled", device="cpu", precision="int8")
    model = exact.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with model_threads():
        steps = {context: decode_step(model, context, repeats)[0] for context in (200, 1000)}
        run.section("decode_step_ms", {str(k): round(v, 1) for k, v in steps.items()})
        run.section("profile_at_200", operator_shares(decode_step(model, 200, 1)[1], repeats))
        bandwidth = copy_bandwidth_gb_s()
        floor_ms = weight_bytes / (bandwidth * 1e9) * 1000
        run.section("bandwidth", {
            "weight_bytes": weight_bytes,
            "copy_gb_s": round(bandwidth, 1),
            "fp32_weights_floor_ms": round(floor_ms, 1),
            "step_to_floor_at_200": round(steps[200] / floor_ms, 2),
        })  # fmt: skip
        run.section("torch_compile_at_200", compiled_decode(model, 200, repeats))
        kernels = weight_kernels(model, repeats * 5)
        run.section("weight_only_kernels", kernels)
    steps_by_mode = interleaved_steps({
        "exact": raw_step_ms(model, repeats),
        "int8": raw_step_ms(int8.model, repeats),
        "engine_exact": lambda context: engine_decode_ms(exact, context, repeats),
        "engine_int8": lambda context: engine_decode_ms(int8, context, repeats),
    }, (200, 1000), rounds=2 if args.quick else 4)  # fmt: skip
    run.section("int8_mode_decode_step_ms", {
        **steps_by_mode,
        "speedup": {c: round(steps_by_mode["exact"][c] / steps_by_mode["int8"][c], 2) for c in steps_by_mode["exact"]},
        "engine_speedup": {c: round(steps_by_mode["engine_exact"][c] / steps_by_mode["engine_int8"][c], 2) for c in steps_by_mode["exact"]},
        "resident_weight_bytes": {"exact": resident_weight_bytes(model), "int8": resident_weight_bytes(int8.model)},
    })  # fmt: skip
    take_intra_op_threads()  # the rest times nothing beside the engine
    conversations = conversation_ids(exact, args.data, 10 if args.quick else 40)
    run.section("int8_mode_quality", perplexity_and_agreement(model, int8.model, conversations))
    prompts = [turns[0] for _, turns in sgd_user_turns(args.data, 10 if args.quick else 40, min_turns=1)]
    run.section("int8_mode_greedy_replies", greedy_reply_agreement(exact, int8, prompts, max_new_tokens=32))
    system = schema_system_prompt(args.data, exact.tokenizer, 300)
    int8_fp32_attention = copy.deepcopy(int8.model)
    int8_fp32_attention.set_attn_implementation("sdpa")
    modes = {**{mode.precision: mode for mode in (exact, int8)}, "int8_with_fp32_attention": replace(int8, model=int8_fp32_attention)}
    run.section("reused_prefix_against_full_recompute", {
        name: reuse_agreement(mode, system, prompts, max_new_tokens=32) for name, mode in modes.items()
    })  # fmt: skip
    run.finish(
        int8_single_stream_speedup_at_200=round(steps_by_mode["exact"]["200"] / steps_by_mode["int8"]["200"], 2),
        single_stream_tokens_per_s=round(1000 / steps[200], 1),
        best_weight_only_speedup=max(max(r[k] for k in r if k.endswith("_speedup")) for r in kernels),
        torch_threads=torch.get_num_threads(),
    )


if __name__ == "__main__":
    main()
