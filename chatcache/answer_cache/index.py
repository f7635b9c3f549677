"""Vector search within one scope, on faiss.

Small scopes use exact inner-product search; past `hnsw_from` live vectors a scope switches to
an HNSW graph, which keeps lookups around a millisecond at 100k entries. Vectors are unit
length, so inner product is cosine similarity. faiss graphs cannot delete, so removed
entries are tombstoned and skipped, and the scope is rebuilt once a quarter of it is dead.
"""

from __future__ import annotations

import faiss
import numpy as np


class VectorIndex:
    """Unit vectors with integer ids, searchable by cosine similarity."""

    def __init__(self, dim: int, hnsw_from: int = 4096, hnsw_m: int = 16) -> None:
        self.dim = dim
        self.hnsw_from = hnsw_from
        self.hnsw_m = hnsw_m
        self._ids: list[int] = []
        self._vectors = np.zeros((64, dim), dtype=np.float32)  # rows [0, len(self._ids)) are used
        self._dead: set[int] = set()  # positions of removed ids
        self._position: dict[int, int] = {}
        self._index: faiss.Index = faiss.IndexFlatIP(dim)

    def __len__(self) -> int:
        return len(self._ids) - len(self._dead)

    def add(self, entry_id: int, vector: np.ndarray) -> None:
        row = np.asarray(vector, dtype=np.float32).reshape(1, self.dim)
        if len(self._ids) == len(self._vectors):  # grow by doubling: adds stay amortised O(1)
            self._vectors = np.vstack([self._vectors, np.zeros_like(self._vectors)])
        self._position[entry_id] = len(self._ids)
        self._vectors[len(self._ids)] = row[0]
        self._ids.append(entry_id)
        self._index.add(row)
        if isinstance(self._index, faiss.IndexFlatIP) and len(self) >= self.hnsw_from:
            self._rebuild()

    def remove(self, entry_id: int) -> None:
        position = self._position.pop(entry_id, None)
        if position is None:
            return
        self._dead.add(position)
        if len(self._dead) > max(64, len(self._ids) // 4):
            self._rebuild()

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to `k` live ids with their cosine similarity, most similar first."""
        if len(self) == 0:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(1, self.dim)
        want = min(len(self._ids), k + len(self._dead))
        scores, positions = self._index.search(query, want)
        found = []
        for score, position in zip(scores[0], positions[0]):
            if position >= 0 and position not in self._dead:
                found.append((self._ids[position], float(score)))
        return found[:k]

    def _rebuild(self) -> None:
        live = [p for p in range(len(self._ids)) if p not in self._dead]
        self._ids = [self._ids[p] for p in live]
        self._vectors = np.vstack([self._vectors[live], np.zeros((64, self.dim), dtype=np.float32)])
        self._position = {entry_id: p for p, entry_id in enumerate(self._ids)}
        self._dead = set()
        if len(self._ids) >= self.hnsw_from:
            graph = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efSearch = 64
            index: faiss.Index = graph
        else:
            index = faiss.IndexFlatIP(self.dim)
        if len(self._ids):
            index.add(self._vectors[: len(self._ids)])
        self._index = index
