"""The customer's chat page in a real browser: a message by keyboard alone, the reply streaming in
a bubble, the cache figures behind a toggle, the conversation again after a reload, its title
from the first message, and no HTML from a message ever reaching the page as markup.

Drives Debian's headless Chromium with selenium against a live server on the tiny model.
"""

from __future__ import annotations

import math
import time
from typing import Any

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from .conftest import console_errors

WAIT_S = 60  # a turn on the tiny model takes well under a second; the CPU may be shared


def shown(driver: WebDriver) -> list[tuple[str, str, str]]:
    """The conversation as the page shows it: each message's kind (user, bot, agent), who the
    page says wrote it, and its text (read in one script: the page redraws as it polls)."""
    rows: list[list[str]] = driver.execute_script(
        "return [...document.querySelectorAll('#log > article.msg')].map(m =>"
        " [m.className.replace('msg ', ''), m.querySelector('.who').textContent, m.querySelector('.bubble').textContent]);"
    )
    return [(kind, who, text) for kind, who, text in rows]


def as_rendered(driver: WebDriver, markdown: str) -> str:
    """The text a reply shows once rendered (Markdown's marks are not text)."""
    text: str = driver.execute_script("const d = document.createElement('div'); d.appendChild(renderMarkdown(arguments[0])); return d.textContent;", markdown)
    return text


def figures(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#log > .figures")


def session_ready(driver: WebDriver) -> str:
    """The session id once the page has one (set after the history shows)."""
    return driver.find_element(By.ID, "log").get_attribute("data-session") or ""


def idle(driver: WebDriver) -> bool:
    """No reply streams (Stop is hidden) and Send is enabled again."""
    return not driver.find_element(By.ID, "stop").is_displayed() and driver.find_element(By.ID, "send").is_enabled()


def type_message(driver: WebDriver, text: str) -> None:
    """Type into the message box and press Enter, as a person on a keyboard would."""
    box = driver.find_element(By.ID, "message")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def first_token_ms(served: dict[str, Any]) -> int:
    return math.floor(served["ttft_s"] * 1000 + 0.5)  # JavaScript's Math.round, not Python's half-to-even


def test_a_message_streams_its_reply_and_both_come_back_after_a_reload(serve, browser: WebDriver) -> None:  # type: ignore[no-untyped-def]
    """Typing "hello" and Enter shows it in the customer's bubble, then the assistant's reply
    filling in; the header says "hello", the conversation's title. The figures ("served by ...",
    "first token ... ms") appear only once the Cache figures toggle is pressed. After a reload the
    page shows the same two messages and figures as the server recorded them; the console has no
    errors (a refused inline script would be one)."""
    live = serve(max_tokens=16)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(live.url + "/")
    session_id = wait.until(session_ready)
    assert browser.execute_script("return localStorage.getItem('chatcache.session')") == session_id
    assert shown(browser) == [] and browser.find_element(By.ID, "title").text == "New conversation"

    type_message(browser, "hello")
    wait.until(lambda d: any(kind == "bot" and text for kind, _, text in shown(d)))  # the reply streams in
    wait.until(idle)
    live_log = shown(browser)
    assert [(kind, who) for kind, who, _ in live_log] == [("user", "You"), ("bot", "Assistant")], live_log
    assert live_log[0][2] == "hello" and live_log[1][2].strip()
    assert browser.find_element(By.ID, "title").text == "hello" and browser.title == "hello"
    assert browser.find_element(By.ID, "message").get_property("value") == ""
    assert browser.switch_to.active_element == browser.find_element(By.ID, "message")  # ready for the next one

    (line,) = figures(browser)
    assert not line.is_displayed()
    toggle = browser.find_element(By.ID, "show-figures")
    toggle.click()
    assert line.is_displayed() and toggle.get_attribute("aria-pressed") == "true"
    live_figures = line.text
    assert live_figures.startswith("served by ") and " ms" in live_figures and "tokens reused" in live_figures

    with live.client() as client:
        record = client.get(f"/v1/sessions/{session_id}").raise_for_status().json()
    messages = record["messages"]
    assert record["title"] == "hello"
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hello"), ("assistant", messages[1]["content"])]
    served = messages[1]["served"]
    assert live_figures.startswith(f"served by {served['tier']}") and f"first token {first_token_ms(served)} ms" in live_figures

    browser.find_element(By.ID, "rename").click()  # a person names it otherwise
    wait.until(lambda d: d.switch_to.alert).send_keys("Greetings")
    browser.switch_to.alert.accept()
    wait.until(lambda d: d.find_element(By.ID, "title").text == "Greetings")
    with live.client() as client:
        assert client.get(f"/v1/sessions/{session_id}").json()["title"] == "Greetings"

    browser.refresh()
    assert wait.until(session_ready) == session_id
    wait.until(lambda d: len(shown(d)) == 2)
    assert shown(browser) == live_log and browser.title == "Greetings"
    assert figures(browser)[0].is_displayed()  # the toggle is remembered
    assert console_errors(browser) == []


def test_escape_stops_a_reply_and_what_was_generated_is_kept(serve, browser: WebDriver, tiny_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """While a long reply streams, Escape stops it: Stop goes away, Send comes back, and the page
    shows the reply as the server kept it, cut where it stopped."""
    forward = tiny_model.model.forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # the tiny model, slowed to a person's reading pace, so a reply is still streaming
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_model.model, "forward", slow_forward)
    live = serve(max_tokens=400)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(live.url + "/")
    session_id = wait.until(session_ready)
    type_message(browser, "Tell me a very long story")
    wait.until(lambda d: d.find_element(By.ID, "stop").is_displayed())
    wait.until(lambda d: any(kind == "bot" and text for kind, _, text in shown(d)))
    browser.find_element(By.ID, "message").send_keys(Keys.ESCAPE)
    wait.until(idle)
    with live.client() as client:
        wait.until(lambda _: len(client.get(f"/v1/sessions/{session_id}").json()["messages"]) == 2)
        kept = client.get(f"/v1/sessions/{session_id}").json()["messages"][1]
    assert kept["served"]["generated_tokens"] < 400 and kept["served"]["finish_reason"] != "length"
    wait.until(lambda d: shown(d)[-1][2] == as_rendered(d, kept["content"]))
    assert console_errors(browser) == []


XSS = [
    "<img src=x onerror=\"document.title='pwned'\">",
    "<script>document.title='pwned'</script>",
    "[click me](javascript:document.title='pwned')",
    "[click me]( JaVaScRiPt:document.title='pwned')",
    "[data](data:text/html,<script>alert(1)</script>)",
    "**<b onmouseover=alert(1)>bold</b>**",
]


def test_markdown_renders_as_nodes_and_no_html_from_a_message_becomes_markup(serve, browser: WebDriver) -> None:  # type: ignore[no-untyped-def]
    """The renderer the pages use: bold, lists, code and https links become elements; a message's
    tags show as the text they are, and a javascript: or data: link is not a link. The customer's
    own message with a tag shows as typed."""
    live = serve(max_tokens=4)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(live.url + "/")
    wait.until(session_ready)

    def render(text: str) -> dict[str, Any]:
        result: dict[str, Any] = browser.execute_script(
            "const div = document.createElement('div'); div.appendChild(renderMarkdown(arguments[0]));"
            "return {html: div.innerHTML, text: div.textContent,"
            " tags: [...div.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),"
            " hrefs: [...div.querySelectorAll('a')].map(a => a.getAttribute('href')),"
            " handlers: [...div.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name)).filter(n => n.startsWith('on'))};",
            text,
        )
        return result

    for payload in XSS:
        out = render(payload)
        assert not {"img", "script", "b"} & set(out["tags"]), (payload, out)
        assert all(href.startswith("https:") for href in out["hrefs"]), (payload, out)
        assert out["handlers"] == [], (payload, out)
    assert render(XSS[0])["text"] == XSS[0]  # shown as the text it is
    assert render(XSS[2])["tags"] == ["p"] and render(XSS[2])["text"] == XSS[2]
    rich = render("# Fees\nA **free** card and `IBAN`:\n\n- one\n- two\n\n1. first\n\n[our site](https://bank.example/fees)")
    assert rich["tags"] == ["h3", "p", "strong", "code", "ul", "li", "li", "ol", "li", "p", "a"]
    assert rich["hrefs"] == ["https://bank.example/fees"]
    assert render("snake_case_name stays")["tags"] == ["p"]

    type_message(browser, XSS[0])
    wait.until(lambda d: len(shown(d)) == 2 and idle(d))
    assert shown(browser)[0] == ("user", "You", XSS[0])
    assert browser.find_elements(By.CSS_SELECTOR, "#log img") == []
    assert browser.title != "pwned"
    assert console_errors(browser) == []
