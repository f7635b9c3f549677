"""A live `chatcache serve` app on loopback, on the tiny model, for the HTTP tests, and headless
Chromium for the pages' tests.

Each server runs uvicorn in a thread on a free port with its own SQLite database; clients talk
to it over real sockets, as an OpenAI client or a browser would. Without Chromium the browser
tests fail rather than skip: CI installs it (.ci/chromium.sh), so a skip would hide a page
nobody tested.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

from chatcache.serving import BackgroundServer, ServeSettings, create_app, served_model_id

KEY_A = "key-tenant-a-0123456749"
KEY_B = "key-tenant-b-0123456749"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DESKTOP = (1280, 800)
PHONE = (390, 844)  # a phone's CSS pixels (an iPhone 12 to 15)


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


@pytest.fixture
def browsers() -> Iterator[Callable[[], WebDriver]]:
    """Opens headless Chromium windows, as many as a test needs (a customer and two agents); all
    are closed at the end."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"The web page tests need headless Chromium; missing: {', '.join(missing)}. Install it with "
            "`DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver` (or `bash .ci/chromium.sh`).",
            pytrace=False,
        )
    opened: list[WebDriver] = []

    def open_browser() -> WebDriver:
        options = Options()
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for errors the page would hide
        options.binary_location = str(CHROMIUM)
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={DESKTOP[0]},{DESKTOP[1]}"):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
        opened.append(driver)
        return driver

    try:
        yield open_browser
    finally:
        for driver in opened:
            driver.quit()


@pytest.fixture
def browser(browsers: Callable[[], WebDriver]) -> WebDriver:
    return browsers()


def console_errors(driver: WebDriver, expected: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """The page's script errors, failed requests and refused content (a CSP violation among
    them), less the refusals with an `expected` status (a page asked before its key was typed)."""
    refusals = tuple(f"the server responded with a status of {status}" for status in expected)
    return [
        entry for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and not (refusals and any(refusal in entry["message"] for refusal in refusals))
    ]  # fmt: skip


def snapshot(driver: WebDriver, name: str, size: tuple[int, int]) -> None:
    """With `CHATCACHE_SNAPSHOTS=DIR`, save the page as DIR/NAME.png at `size` (CSS pixels, a
    phone's with touch and its scale); the README's pictures in docs/img/ are made this way."""
    folder = os.environ.get("CHATCACHE_SNAPSHOTS")
    if not folder:
        return
    width, height = size
    phone = size == PHONE
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 2 if phone else 1, "mobile": phone}
    )
    try:
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
