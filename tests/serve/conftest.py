"""A live `chatcache serve` app on loopback, on the tiny model, for the HTTP tests.

Each server runs uvicorn in a thread on a free port with its own SQLite database; clients talk
to it over real sockets, as an OpenAI client or a browser would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatcache.serving import BackgroundServer, ServeSettings, create_app, served_model_id

KEY_A = "key-tenant-a-0123456749"
KEY_B = "key-tenant-b-0123456749"


@dataclass
class LiveServer:
    server: BackgroundServer
    model_id: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def app(self) -> Any:
        return self.server.app

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120, **kwargs)

    def stop(self) -> None:
        self.server.stop(60)


@pytest.fixture
def serve(tiny_model, tiny_model_dir: Path, tmp_path: Path, toy_embed) -> Iterator[Callable[..., LiveServer]]:  # type: ignore[no-untyped-def]
    started: list[LiveServer] = []
    counter = itertools.count()

    def start(chat_model: Any = None, embedder: Any = None, **settings: Any) -> LiveServer:
        """A server on the tiny model and the toy embedder, or on the ones given (the bundled models)."""
        settings.setdefault("db", f"sqlite:///{tmp_path}/serve-{next(counter)}.db")
        settings.setdefault("model", chat_model.name if chat_model is not None else str(tiny_model_dir))
        app = create_app(ServeSettings(**settings), chat_model=chat_model or tiny_model, embedder=embedder or toy_embed)
        live = LiveServer(BackgroundServer(app, start_timeout_s=120), served_model_id(settings["model"]))
        started.append(live)
        return live

    yield start
    for live in started:
        live.stop()


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(f"# key tenant\n{KEY_A} tenant-a\n{KEY_B} tenant-b\n")
    return path
