"""Fixtures for the session tier: a store with a fake clock, on SQLite and, when a server is
given in `CHATCACHE_TEST_POSTGRES_URL` (`.ci/run` starts one), on PostgreSQL too.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from chatcache.storage import SessionStore
from chatcache.storage.engine import sqlite_url
from tests.session_tier.fake_clock import FakeClock

POSTGRES_URL = os.environ.get("CHATCACHE_TEST_POSTGRES_URL")
BACKENDS = ["sqlite"] + (["postgresql"] if POSTGRES_URL else [])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    assert POSTGRES_URL is not None
    name = f"chatcache_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str | URL:
    """A fresh database on each backend: a SQLite file in `tmp_path`, or a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    url: str = request.getfixturevalue("postgres_database")
    return url


@pytest.fixture
def store(store_url: str | URL, clock: FakeClock) -> Iterator[SessionStore]:
    with SessionStore(store_url, clock=clock) as opened:
        yield opened
