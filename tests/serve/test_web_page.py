"""The web chat page in a real browser: send a message, watch the reply stream in, reload, see it again.

Drives Debian's headless Chromium with selenium against a live server on the tiny model. Without
Chromium the test fails rather than skips: CI installs it (.ci/chromium.sh), so a skip would hide
a page nobody tested.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 60  # a turn on the tiny model takes well under a second; the CPU may be shared


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"The web page test needs headless Chromium; missing: {', '.join(missing)}. Install it with "
            "`DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver` (or `bash .ci/chromium.sh`).",
            pytrace=False,
        )
    options = Options()
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for errors the page would hide
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shown(driver: WebDriver) -> list[tuple[str, str]]:
    """The chat log as the page shows it: each line's kind (user, assistant, figures, error) and text."""
    rows: list[WebElement] = driver.find_elements(By.CSS_SELECTOR, "#log > div")
    return [(row.get_attribute("class") or "", row.get_property("textContent") or "") for row in rows]


def session_ready(driver: WebDriver) -> str:
    """The session id once the page has one (its label is set last, after the history shows)."""
    label: str = driver.find_element(By.ID, "session-label").text
    return label.removeprefix("session ")


def turn_finished(driver: WebDriver) -> bool:
    """The reply's last chunk came (its figures line shows) and Send is enabled again."""
    return bool(driver.find_elements(By.CSS_SELECTOR, "#log > .figures")) and driver.find_element(By.ID, "send").is_enabled()


def first_token_ms(served: dict[str, Any]) -> int:
    return math.floor(served["ttft_s"] * 1000 + 0.5)  # JavaScript's Math.round, not Python's half-to-even


def test_a_message_streams_its_reply_and_both_come_back_after_a_reload(serve, browser: WebDriver) -> None:  # type: ignore[no-untyped-def]
    """Typing "hello" and Send shows "You: hello", then "Bot: ..." filling in and a line of figures
    ("served by ...", "first token ... ms"); after a reload the page shows the same two messages, as the
    server recorded them in the session; the browser's console shows no errors."""
    live = serve(max_tokens=16)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(live.url + "/")
    session_id = wait.until(session_ready)
    assert browser.execute_script("return localStorage.getItem('chatcache.session')") == session_id
    assert shown(browser) == []  # a new session: no history

    browser.find_element(By.ID, "message").send_keys("hello")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: any(kind == "turn assistant" and text != "Bot: " for kind, text in shown(d)))  # the reply streams in
    wait.until(turn_finished)
    live_log = shown(browser)
    assert [kind for kind, _ in live_log] == ["turn user", "turn assistant", "figures"], live_log
    assert live_log[0][1] == "You: hello"
    reply = live_log[1][1].removeprefix("Bot: ")
    assert reply.strip()
    live_figures = live_log[2][1]
    assert live_figures.startswith("served by ") and " ms" in live_figures and "tokens reused" in live_figures
    assert browser.find_element(By.ID, "message").get_property("value") == ""

    with live.client() as client:
        record = client.get(f"/v1/sessions/{session_id}").raise_for_status().json()
    messages = record["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hello"), ("assistant", reply)]
    served = messages[1]["served"]
    assert live_figures.startswith(f"served by {served['tier']}")

    browser.refresh()
    assert wait.until(session_ready) == session_id
    wait.until(lambda d: len(shown(d)) == 3)
    history = shown(browser)
    assert history[:2] == [("turn user", "You: hello"), ("turn assistant", "Bot: " + reply)]
    kind, figures = history[2]
    assert kind == "figures"
    assert figures.startswith(f"served by {served['tier']}")
    assert f"first token {first_token_ms(served)} ms" in figures
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []  # no script or request errors
