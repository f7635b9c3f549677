"""What the peer drivers share: the job loop on stdin/stdout and the figures of a job. Stdlib only.

The drivers run in the peers' own virtualenvs (see bench/peers.py), where chatcache, numpy and
bench/common.py are not importable; they import this file as a sibling (`import peer_protocol`).
The figures are the ones `converse` reports in bench/concurrency.py, computed the same way:
TTFT from the moment a conversation sends its turn to its first reply token, time per output
token as (reply time after the first token) / (reply tokens - 1), percentiles interpolated
linearly as numpy's are.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass
class Turn:
    """One reply as the peer produced it: when its first token came, how long it took, how long it is."""

    ttft_s: float
    total_s: float
    generated_tokens: int
    prompt_tokens: int
    cached_tokens: int | None = None  # prompt tokens the peer's prefix cache served, where it says


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def figures(conversations: int, turns: list[Turn], wall_s: float) -> dict[str, Any]:
    """The job's figures, keyed as bench.concurrency's `converse` keys them."""
    tokens = sum(t.generated_tokens for t in turns)
    per_token = [(t.total_s - t.ttft_s) / (t.generated_tokens - 1) for t in turns if t.generated_tokens > 1]
    prompt_tokens = sum(t.prompt_tokens for t in turns)
    cached = [t.cached_tokens for t in turns if t.cached_tokens is not None]
    return {
        "conversations": conversations,
        "turns": len(turns),
        "generated_tokens": tokens,
        "wall_s": round(wall_s, 2),
        "tokens_per_s": round(tokens / wall_s, 2),
        "turns_per_s": round(len(turns) / wall_s, 3),
        "ttft_p50_ms": round(percentile([t.ttft_s * 1000 for t in turns], 50), 1),
        "ttft_p99_ms": round(percentile([t.ttft_s * 1000 for t in turns], 99), 1),
        "time_per_output_token_p50_ms": round(percentile(per_token, 50) * 1000, 1),
        "prompt_tokens_mean": round(prompt_tokens / len(turns)) if turns else 0,
        "prompt_share_cached": round(sum(cached) / prompt_tokens, 3) if cached and prompt_tokens else None,
    }


def protocol_stdout() -> TextIO:
    """Keep the real stdout for the protocol and point file descriptor 1 at stderr.

    Call before importing the peer's library: vLLM logs to stdout by default, and C code
    (llama.cpp, vLLM's engine process, which inherits the descriptors) prints there too; one
    stray line would break the JSON stream.
    """
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


def serve(out: TextIO, peer: dict[str, Any], run_job: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Say ready, then answer each job line on stdin with one result line until stdin ends."""
    out.write(json.dumps({"ready": True, "peer": peer}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = {**run_job(json.loads(line)), "peer": peer}
        except Exception as exc:  # noqa: BLE001 - the parent gets the reason instead of a dead pipe
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(result) + "\n")
