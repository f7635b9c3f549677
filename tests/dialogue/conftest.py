"""Fixtures for the dialogue tests: the shipped bot and a deterministic toy embedder."""

from __future__ import annotations

import pytest

from dialog import BotDefinition, load_bot

@pytest.fixture(scope="session")
def bot() -> BotDefinition:
    return load_bot("customer_service")


@pytest.fixture(scope="session")
def embed(toy_embed):  # type: ignore[no-untyped-def]
    """The root conftest's toy embedder under the name these tests use."""
    return toy_embed
