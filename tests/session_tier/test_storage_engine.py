"""Where the database lives, how SQLite is tuned, and how bad configuration is reported."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from chatcache.storage import SessionStore, StorageConfigError
from chatcache.storage.engine import DB_FILENAME, create_storage_engine, default_data_dir, sqlite_url


def test_sqlite_connections_use_wal_foreign_keys_and_the_busy_timeout(tmp_path: Path) -> None:
    engine = create_storage_engine(sqlite_url(tmp_path), busy_timeout=2.5)
    try:
        with engine.connect() as conn:
            pragma = conn.exec_driver_sql
            assert pragma("PRAGMA journal_mode").scalar() == "wal"
            assert pragma("PRAGMA foreign_keys").scalar() == 1
            assert pragma("PRAGMA busy_timeout").scalar() == 2500
            assert pragma("PRAGMA synchronous").scalar() == 1  # NORMAL
    finally:
        engine.dispose()


def test_the_store_leaves_its_file_in_wal_mode(tmp_path: Path) -> None:
    SessionStore.open(tmp_path).close()

    # journal_mode=WAL is stored in the file itself, so a plain connection sees it.
    with closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_open_puts_chatcache_db_in_the_given_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "nested" / "data"

    with SessionStore.open(data_dir) as store:
        store.create_session("s1", "ada", "travel")

    assert store.location == str(data_dir / DB_FILENAME)
    assert (data_dir / DB_FILENAME).is_file()


def test_the_data_dir_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATCACHE_DATA_DIR", str(tmp_path / "from-env"))

    SessionStore.open().close()

    assert (tmp_path / "from-env" / DB_FILENAME).is_file()


def test_without_the_environment_the_data_dir_is_under_local_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHATCACHE_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))

    assert default_data_dir() == tmp_path / ".local" / "share" / "chatcache"


def test_any_sqlalchemy_url_works(tmp_path: Path) -> None:
    with SessionStore(f"sqlite:///{tmp_path / 'custom.db'}") as store:
        store.create_session("s1", "ada", "travel")
        assert store.get_session("s1").bot == "travel"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("not a url", "malformed database URL"),
        ("nosuchdb://localhost/chat", "unusable database URL"),
        ("sqlite:////definitely/missing/dir/chat.db", "cannot open database"),
    ],
)
def test_a_broken_url_is_a_config_error(url: str, reason: str) -> None:
    with pytest.raises(StorageConfigError, match=reason):
        SessionStore(url)


def test_a_missing_driver_is_a_config_error_that_hides_the_password() -> None:
    # No PostgreSQL driver is installed in the test environment.
    with pytest.raises(StorageConfigError, match="postgresql") as caught:
        SessionStore("postgresql+psycopg2://chat:s3cret@localhost/chat")

    assert "s3cret" not in str(caught.value)


def test_a_data_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")

    with pytest.raises(StorageConfigError, match="data directory"):
        SessionStore.open(blocker / "data")
