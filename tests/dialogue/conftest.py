"""Fixtures for the dialogue tests: the shipped bot and a deterministic toy embedder."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from dialog import BotDefinition, load_bot

DIM = 512


def hashing_embed(texts: list[str]) -> np.ndarray:
    """Bag of words hashed into DIM buckets, unit-normalised: shared words mean similarity."""
    rows = np.zeros((len(texts), DIM))
    for i, text in enumerate(texts):
        for word in re.findall(r"[a-z']+", text.lower()):
            rows[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += 1.0
        norm = np.linalg.norm(rows[i])
        if norm:
            rows[i] /= norm
    return rows


@pytest.fixture(scope="session")
def bot() -> BotDefinition:
    return load_bot("customer_service")


@pytest.fixture(scope="session")
def embed():  # type: ignore[no-untyped-def]
    """The toy embedder, as a fixture: test modules cannot import conftest under importlib mode."""
    return hashing_embed
