"""An audit one process records is counted by every process on the same database, once.

Replicas share one database: a second cache on the same file, a real second process, and
threads recording at once while another reads must all end at the same, exact tallies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine, insert
from sqlalchemy.engine import URL

from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.storage import SessionStore
from chatcache.storage.database import SYNC_OVERLAP
from chatcache.storage.models import AnswerAuditRow
from tests.conftest import hashing_embed

ROOT = Path(__file__).resolve().parents[2]
BANK = Scope("model@1", "bank", tenant="tenant-a")

AUDITING_REPLICA = r"""
import sys
from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.storage import SessionStore
from tests.conftest import hashing_embed
with SessionStore(sys.argv[1]) as store:
    cache = AnswerCache(AnswerCacheConfig(similarity_threshold=0.7), hashing_embed, store.answers, audits=store.answer_audits)
    scope = Scope("model@1", "bank", tenant="tenant-a")
    exact = cache.lookup("When are you open?", scope)
    near = cache.lookup("when are you open today", scope)
    assert exact is not None and exact.exact and near is not None and not near.exact
    cache.record_audit(exact, agreed=True)
    cache.record_audit(near, agreed=False)
    cache.record_audit(near, agreed=False)
"""


def _url(store_url: str | URL) -> str:
    return store_url.render_as_string(hide_password=False) if isinstance(store_url, URL) else store_url


def _cache(store: SessionStore) -> AnswerCache:
    return AnswerCache(AnswerCacheConfig(similarity_threshold=0.7, sync_interval_s=0), hashing_embed, store.answers, audits=store.answer_audits)


def test_an_audit_recorded_by_one_cache_is_counted_by_the_other_after_sync(store_url: str | URL) -> None:
    with SessionStore(_url(store_url)) as store:
        one, other = _cache(store), _cache(store)
        one.store("When are you open?", "9 to 5.", BANK, 1.0, 100)
        other.sync()
        hit = other.lookup("when are you open today", BANK)
        assert hit is not None and not hit.exact
        other.record_audit(hit, agreed=False)
        assert one.bound_status().audits == 0, "not before it looks at the table"
        one.sync()
        seen = one.bound_status()
        assert (seen.audits, seen.audit_errors, seen.semantic_audits, seen.semantic_audit_errors) == (1, 1, 1, 1)
        one.sync()
        assert one.bound_status().audits == 1, "each audit is counted once"
        assert other.bound_status() == seen
        assert (one.snapshot().audits, other.snapshot().audits) == (0, 1)


def test_audits_recorded_by_another_process_are_counted_here(store_url: str | URL) -> None:
    url = _url(store_url)
    with SessionStore(url) as store:
        here = _cache(store)
        here.store("When are you open?", "9 to 5, Monday to Friday.", BANK, 1.0, 300)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        subprocess.run([sys.executable, "-c", AUDITING_REPLICA, url], env=env, check=True, timeout=120)
        assert here.bound_status().audits == 0
        assert here.sync() == 0  # no new entries: the other process only audited
        status = here.bound_status()
        assert (status.audits, status.audit_errors, status.semantic_audits, status.semantic_audit_errors) == (3, 2, 2, 2)


def test_audits_recorded_at_once_by_threads_of_two_caches_are_each_counted_once(store_url: str | URL) -> None:
    """Four threads record while a fifth keeps reading the table into the first cache: every
    cache ends at the exact total, none counted twice or missed."""
    with SessionStore(_url(store_url)) as store:
        first, second = _cache(store), _cache(store)
        first.store("When are you open?", "9 to 5.", BANK, 1.0, 100)
        second.sync()
        hits = [cache.lookup("When are you open?", BANK) for cache in (first, second)]
        per_thread, done = 15, threading.Event()
        errors: list[BaseException] = []

        def audit(cache: AnswerCache, index: int) -> None:
            hit = hits[0] if cache is first else hits[1]
            assert hit is not None
            try:
                for turn in range(per_thread):
                    cache.record_audit(hit, agreed=(index + turn) % 3 != 0)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        def keep_reading() -> None:
            while not done.is_set():
                first.sync()

        reader = threading.Thread(target=keep_reading)
        reader.start()
        writers = [threading.Thread(target=audit, args=(cache, i)) for i, cache in enumerate((first, second, first, second))]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        done.set()
        reader.join()
        assert not errors
        wrong = sum((index + turn) % 3 == 0 for index in range(4) for turn in range(per_thread))
        for cache in (first, second):
            cache.sync()
            status = cache.bound_status()
            assert (status.audits, status.audit_errors) == (4 * per_thread, wrong)
        assert len(store.answer_audits.added_after(0)) == 4 * per_thread


def test_a_lower_audit_id_committed_after_a_higher_one_is_not_missed(store_url: str | URL) -> None:
    """Ids are handed out before commit: one replica may commit audit 20 after another committed 30."""
    url = _url(store_url)
    with SessionStore(url) as store:
        here = _cache(store)
        row = {"scope": BANK.key(), "entry_id": 1, "exact": False, "similarity": 0.9, "agreed": False,
               "audited_at": datetime(2026, 1, 1, tzinfo=timezone.utc)}  # fmt: skip
        database = create_engine(url)
        try:
            for audit_id in (30, 30 - SYNC_OVERLAP + 4):  # the later one below the highest seen
                with database.begin() as connection:
                    connection.execute(insert(AnswerAuditRow).values(id=audit_id, **row))
                here.sync()
                assert here.bound_status().audits == (1 if audit_id == 30 else 2)
        finally:
            database.dispose()
        here.sync()
        assert here.bound_status().audit_errors == 2, "each audit is counted once"
