"""Answer-cache benchmark: lookup latency by size, a cached turn against a model turn, memory.

Lookup latency is measured at 1k, 10k and 100k entries in one scope, without the embedding
step (the caller already has the question's vector, as the engine does) and with it (MiniLM
on this machine). Entries use the BANKING77 questions' real embeddings, repeated with a small
perturbation to reach 100k. The served-versus-generated ratio runs the bundled model and the
engine side by side on the same questions.

    python -m bench.answer_cache [--data ../shared/data] [--sizes 1000 10000 100000] [--quick]

About 6 minutes on 2 CPU cores; --quick (2,000 questions embedded, 1k and 10k entries, 100
queries, 3 model turns) about 1 minute. Results are written to bench/out/answer_cache.json as
each section finishes.
"""

from __future__ import annotations

import argparse
import csv
import time
import tracemalloc
from pathlib import Path

import numpy as np

from chatcache import ChatEngine, TokenTierConfig, load_chat_model
from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.steering.hcac import sentence_embed
from chatcache.model.loading import load_embedder

from .common import BenchRun, bench_arguments, median

SCOPE = Scope("bench", "bench")


def banking_questions(data: Path) -> list[tuple[str, str]]:
    with open(data / "banking77" / "train.csv") as rows:
        return [(row["text"], row["category"]) for row in csv.DictReader(rows)]


def filled_cache(size: int, vectors: np.ndarray, embed) -> tuple[AnswerCache, float, float]:  # type: ignore[no-untyped-def]
    """A cache with `size` entries; returns it, the seconds to fill it and bytes per entry."""
    rng = np.random.default_rng(0)
    cache = AnswerCache(AnswerCacheConfig(max_entries=size + 1, max_bytes=1 << 40), embed)
    tracemalloc.start()
    started = time.perf_counter()
    for index in range(size):
        base = vectors[index % len(vectors)]
        vector = base + (rng.normal(0, 0.02, base.shape) if index >= len(vectors) else 0)
        vector = (vector / np.linalg.norm(vector)).astype(np.float32)
        cache.store(f"question {index}", f"answer {index % 77}", SCOPE, 1.0, 300.0, embedding=vector)
    fill_s = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return cache, fill_s, peak / size


def lookup_latencies(cache: AnswerCache, queries: list[str], query_vectors: np.ndarray) -> dict[str, float]:
    without, with_embedding = [], []
    for text, vector in zip(queries, query_vectors):
        started = time.perf_counter()
        cache.lookup(text, SCOPE, embedding=vector)
        without.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        cache.lookup(text, SCOPE)
        with_embedding.append((time.perf_counter() - started) * 1000)
    return {
        "p50_ms_without_embedding": float(np.percentile(without, 50)),
        "p99_ms_without_embedding": float(np.percentile(without, 99)),
        "p50_ms_with_embedding": float(np.percentile(with_embedding, 50)),
        "p99_ms_with_embedding": float(np.percentile(with_embedding, 99)),
    }


def served_vs_generated(questions: list[str]) -> dict[str, float]:
    """Time a turn served from the answer cache against the same turn run on the model."""
    import tempfile

    model = load_chat_model("bundled", device="cpu")
    with tempfile.TemporaryDirectory() as scratch:
        engine = ChatEngine(
            model,
            system_prompt="You are a bank's assistant. Answer in one short sentence.",
            answer_cache=AnswerCacheConfig(max_entropy_bits=100.0),
            store=f"sqlite:///{scratch}/bench.db",
            token_tier=TokenTierConfig(spill_dir=None),
        )
        generated, served = [], []
        for index, question in enumerate(questions):
            first = engine.chat(f"g{index}", question, max_new_tokens=48)
            again = engine.chat(f"s{index}", question, max_new_tokens=48)
            if first.stats.finish_reason == "eos" and again.stats.answer_cache_hit:
                generated.append(first.stats.total_s)
                served.append(again.stats.total_s)
        engine.close()
    return {
        "pairs": len(served),
        "model_turn_median_s": median(generated),
        "cached_turn_median_s": median(served),
        "ratio": median(generated) / median(served),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="entries (default 1k 10k 100k, quick 1k 10k)")
    parser.add_argument("--queries", type=int, default=None, help="timed lookups (default 300, quick 100)")
    args = parser.parse_args()
    args.sizes = args.sizes or ([1000, 10000] if args.quick else [1000, 10000, 100000])
    args.queries = args.queries or (100 if args.quick else 300)
    run = BenchRun("answer_cache", args, minutes=(6, 1))

    embed = sentence_embed(load_embedder("bundled", device="cpu"))
    rows = banking_questions(args.data)[: 2000 if args.quick else None]
    texts = [text for text, _ in rows]
    vectors = embed(texts)
    query_texts = texts[-args.queries :]
    query_vectors = vectors[-args.queries :]
    sizes = {}
    for size in args.sizes:
        cache, fill_s, bytes_per_entry = filled_cache(size, vectors[: -args.queries], embed)
        sizes[str(size)] = {"fill_s": fill_s, "bytes_per_entry": bytes_per_entry, **lookup_latencies(cache, query_texts, query_vectors)}
        run.section("lookup", sizes)
    run.section("served_vs_generated", served_vs_generated(query_texts[: 3 if args.quick else 10]))
    run.finish(targets={"p50_ms_without_embedding_at_100k": 2.0, "p50_ms_with_embedding_at_100k": 15.0, "ratio": 50.0})

if __name__ == "__main__":
    main()
