"""An answer one process stores is served by every process on the same database, and only in its scope.

Replicas behind a router share one database (SQLite file or PostgreSQL): a second, real process
stores answers while this one, started before them, looks them up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, insert
from sqlalchemy.engine import URL

from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.answer_cache.cache import SYNC_OVERLAP
from chatcache.storage import SessionStore
from chatcache.storage.models import AnswerEntryRow
from tests.conftest import hashing_embed

ROOT = Path(__file__).resolve().parents[2]
TENANT_A = Scope("model@1", "bank", tenant="tenant-a")
TENANT_B = Scope("model@1", "bank", tenant="tenant-b")

STORING_REPLICA = r"""
import sys
from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.storage import SessionStore
from tests.conftest import hashing_embed
url = sys.argv[1]
with SessionStore(url) as store:
    cache = AnswerCache(AnswerCacheConfig(), hashing_embed, store.answers)
    assert cache.store("When are you open?", "9 to 5, Monday to Friday.", Scope("model@1", "bank", tenant="tenant-a"), 1.0, 300)
    assert cache.store("Where is my card?", "It arrives in 5 working days.", Scope("model@1", "bank", tenant="tenant-a"), 1.0, 300)
"""


def _url(store_url: str | URL) -> str:
    return store_url.render_as_string(hide_password=False) if isinstance(store_url, URL) else store_url


def test_an_answer_stored_by_another_process_is_served_here_within_a_second(store_url: str | URL) -> None:
    url = _url(store_url)
    with SessionStore(url) as store:
        here = AnswerCache(AnswerCacheConfig(similarity_threshold=0.7, sync_interval_s=0.25), hashing_embed, store.answers)
        assert here.lookup("When are you open?", TENANT_A) is None  # nothing yet: the other process has not run
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        subprocess.run([sys.executable, "-c", STORING_REPLICA, url], env=env, check=True, timeout=120)
        stored_at = time.monotonic()
        hit = None
        while hit is None and time.monotonic() - stored_at < 1.0:
            hit = here.lookup("when are you open", TENANT_A)
            time.sleep(0.02)
        assert hit is not None and hit.answer == "9 to 5, Monday to Friday.", "served here within a second"
        assert here.lookup("where is my card", TENANT_A) is not None
        assert here.lookup("When are you open?", TENANT_B) is None, "another tenant never sees it"
        assert here.snapshot().synced == 2 and here.snapshot().stores == 0


def test_a_lower_id_committed_after_a_higher_one_is_not_missed(store_url: str | URL) -> None:
    """Ids are handed out before commit: one replica may commit id 20 after another committed id 30."""
    url = _url(store_url)
    with SessionStore(url) as store:
        other = AnswerCache(AnswerCacheConfig(), hashing_embed, store.answers)
        here = AnswerCache(AnswerCacheConfig(sync_interval_s=0), hashing_embed, store.answers)
        for question in ("a b c", "d e f", "g h i", "j k l"):
            other.store(question, f"answer to {question}", TENANT_A, 1.0, 100)
        assert here.sync() == 4
        first = store.answers.added_after(0)[0]
        row = {name: getattr(first, name) for name in first.__dataclass_fields__}
        database = create_engine(url)
        try:
            for entry_id, question in ((30, "m n o"), (30 - SYNC_OVERLAP + 4, "p q r")):  # the later one below the highest seen
                with database.begin() as connection:
                    connection.execute(insert(AnswerEntryRow).values(**{**row, "id": entry_id, "question": question, "normalized": question}))
                assert here.sync() == 1, question
        finally:
            database.dispose()
        assert here.lookup("p q r", TENANT_A) is not None and here.lookup("m n o", TENANT_A) is not None
        assert here.sync() == 0, "each entry is indexed once"


def test_without_a_sync_interval_a_process_keeps_to_what_it_loaded(store_url: str | URL) -> None:
    with SessionStore(_url(store_url)) as store:
        alone = AnswerCache(AnswerCacheConfig(sync_interval_s=0), hashing_embed, store.answers)
        AnswerCache(AnswerCacheConfig(), hashing_embed, store.answers).store("When are you open?", "9 to 5.", TENANT_A, 1.0, 100)
        assert alone.lookup("When are you open?", TENANT_A) is None
