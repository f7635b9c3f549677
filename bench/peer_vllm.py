"""vLLM's CPU build as a peer of bench.concurrency: its async engine, one asyncio task per conversation.

Runs in `.venv-peers/vllm` (see bench/peers.py), stdlib and vllm only. Loads the model once
(float32, prefix caching on), says ready, then answers jobs on stdin: all of a job's
conversations at once, each a closed loop that sends its next user turn when its reply ends,
its history (system, user, assistant, ...) rendered by the model's chat template every turn as
vLLM's chat API does; greedy, stopping at end of turn or `max_new_tokens`. vLLM batches the
requests that are in flight and reuses the KV of the prefix blocks it has seen; each job starts
with its prefix cache emptied and the system prompt run once (a 4-token warm-up turn).

    .venv-peers/vllm/bin/python bench/peer_vllm.py --model <safetensors dir>   (jobs on stdin)

Settings come from the environment when it sets them, else the defaults below (recorded
with every result): VLLM_CPU_KVCACHE_SPACE (GiB of KV cache), VLLM_CPU_OMP_THREADS_BIND.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from typing import Any

import peer_protocol

# Threads: vLLM's own "auto" binding, which on 2 cores runs the model on one OpenMP thread and
# keeps the other core for its engine process (it polls). Binding both cores to the model
# ("0-1") shares them with that process and, like any spinning OpenMP pool on a busy machine,
# collapses when anything else runs (see bench/README.md).
DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}
ENGINE = {"dtype": "float32", "enable_prefix_caching": True, "max_model_len": 4096, "max_num_seqs": 32, "seed": 0}


class VllmPeer:
    def __init__(self, model: str) -> None:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM

        self.loop = asyncio.new_event_loop()
        self.sampling = SamplingParams
        self.engine = self.loop.run_until_complete(self._start(AsyncLLM, AsyncEngineArgs(model=model, disable_log_stats=True, **ENGINE)))
        self.request_ids = itertools.count()

    @staticmethod
    async def _start(engine_class: Any, args: Any) -> Any:
        return engine_class.from_engine_args(args)

    def describe(self) -> dict[str, Any]:
        import vllm

        settings = {**ENGINE, **{k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")}}
        settings["VLLM_CPU_NUM_OF_RESERVED_CPU"] = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "vLLM's default")
        return {"name": "vllm", "package": "vllm-cpu", "version": vllm.__version__, "settings": settings, "serial": False}

    def run_job(self, job: dict[str, Any]) -> dict[str, Any]:
        return self.loop.run_until_complete(self._run(job))

    async def _run(self, job: dict[str, Any]) -> dict[str, Any]:
        # Each job starts with only the system prompt cached, as chatcache's new sessions at each
        # N do: no earlier job's conversations (the N=8 job repeats the N=1 job's first one).
        await self.engine.reset_prefix_cache()
        await self._reply([{"role": "system", "content": job["system_prompt"]}, {"role": "user", "content": "Hello"}], 4)
        turns: list[peer_protocol.Turn] = []

        async def converse(user_turns: list[str]) -> None:
            messages = [{"role": "system", "content": job["system_prompt"]}]
            for text in user_turns:
                messages.append({"role": "user", "content": text})
                reply, turn = await self._reply(messages, job["max_new_tokens"])
                messages.append({"role": "assistant", "content": reply})
                turns.append(turn)

        started = time.perf_counter()
        await asyncio.gather(*(converse(c) for c in job["conversations"]))
        return peer_protocol.figures(len(job["conversations"]), turns, time.perf_counter() - started)

    async def _reply(self, messages: list[dict[str, str]], max_new_tokens: int) -> tuple[str, peer_protocol.Turn]:
        from vllm.renderers import ChatParams
        from vllm.sampling_params import RequestOutputKind

        sent = time.perf_counter()
        # Rendered and tokenized as vLLM's chat endpoint does it, so that time counts in TTFT too.
        chat = ChatParams(chat_template_kwargs={"add_generation_prompt": True})  # what the endpoint passes by default
        _, (prompt,) = await self.engine.renderer.render_chat_async([messages], chat)
        params = self.sampling(temperature=0.0, max_tokens=max_new_tokens, output_kind=RequestOutputKind.DELTA)
        pieces: list[str] = []
        tokens, first, cached = 0, 0.0, None
        async for output in self.engine.generate(prompt, params, request_id=str(next(self.request_ids))):
            completion = output.outputs[0]
            if completion.token_ids and not tokens:
                first = time.perf_counter()
            tokens += len(completion.token_ids)
            pieces.append(completion.text)
            cached = output.num_cached_tokens if output.num_cached_tokens is not None else cached
        done = time.perf_counter()
        turn = peer_protocol.Turn(first - sent, done - sent, tokens, len(prompt["prompt_token_ids"]), cached)
        return "".join(pieces), turn

    def close(self) -> None:
        self.engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face model directory (safetensors)")
    args = parser.parse_args()
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    out = peer_protocol.protocol_stdout()
    started = time.perf_counter()
    peer = VllmPeer(args.model)
    description = {**peer.describe(), "model": args.model, "load_s": round(time.perf_counter() - started, 1)}
    print(f"peer_vllm: ready in {description['load_s']} s", file=sys.stderr, flush=True)
    try:
        peer_protocol.serve(out, description, peer.run_job)
    finally:
        peer.close()


if __name__ == "__main__":
    main()
