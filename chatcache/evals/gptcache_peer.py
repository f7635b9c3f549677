"""GPTCache (PyPI `gptcache`) as a peer of `chatcache eval answer-cache` and `eval pairs`, on the same data and vectors.

Its similar-question cache as its README sets one up (`init_similar_cache`): SQLite for the
answers, faiss for the vectors, `SearchDistanceEvaluation` with its defaults and the default
similarity threshold (0.8). Its own embedder (an ONNX model fetched from a hub at run time) does
not load offline, so it is given the same MiniLM vectors chatcache uses: the difference measured
is the cache, not the embedder. Each run over labelled questions is one cache; each pair gets a
fresh one. GPTCache is a dev extra, not a dependency: it is imported only when a run asks for
it, and `available` lets an evaluation say it is missing instead of failing.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

MISSING = "gptcache not installed (pip install -e .[dev])"
_root: list[str] = []


def available() -> bool:
    """Whether GPTCache can be imported (it is in the dev extras only)."""
    return importlib.util.find_spec("gptcache") is not None


def _directory() -> str:
    """A new folder for one cache's files. They stay until the process exits: every GPTCache
    registers an exit hook that writes its faiss index, and hooks run last-registered first, so
    the folders' removal, registered before any cache, runs after all of them."""
    if not _root:
        _root.append(tempfile.mkdtemp(prefix="chatcache-gptcache-"))
        atexit.register(shutil.rmtree, _root[0], True)
    return tempfile.mkdtemp(dir=_root[0])


class _Vectors:
    """GPTCache's embedding interface over vectors computed beforehand."""

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors
        self.dimension = len(next(iter(vectors.values())))

    def to_embeddings(self, text: str, **_: Any) -> np.ndarray:
        return np.asarray(self.vectors[text], dtype="float32")


def _cache(directory: str, vectors: _Vectors) -> Any:
    from gptcache import Cache
    from gptcache.adapter.api import init_similar_cache
    from gptcache.manager import CacheBase, VectorBase, get_data_manager
    from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

    cache = Cache()
    data = get_data_manager(
        CacheBase("sqlite", sql_url=f"sqlite:///{directory}/answers.db"),
        VectorBase("faiss", dimension=vectors.dimension, index_path=f"{directory}/faiss.index"),
        max_size=1_000_000,
    )
    init_similar_cache(cache_obj=cache, embedding=vectors, data_manager=data, evaluation=SearchDistanceEvaluation())
    return cache


def served_answers(stored: Sequence[tuple[str, str]], asked: Sequence[str], vectors: dict[str, np.ndarray]) -> list[str | None]:
    """One GPTCache warmed with `stored` (question, answer) rows, then asked each of `asked`."""
    from gptcache.adapter.api import get, put

    cache = _cache(_directory(), _Vectors(vectors))
    for question, answer in stored:
        put(question, answer, cache_obj=cache)
    return [get(question, cache_obj=cache) for question in asked]


def pair_hits(pairs: Sequence[tuple[str, str]], vectors: dict[str, np.ndarray]) -> list[bool]:
    """Whether a fresh GPTCache holding each pair's first text serves it for the second."""
    return [served_answers([(first, "answer")], [second], vectors)[0] is not None for first, second in pairs]
