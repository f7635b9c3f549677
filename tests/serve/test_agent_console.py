"""The customer and the agents, each in their own Chromium: the bank bot hands a conversation
to a person, one agent claims it (a second is told who has it), answers, the customer sees the
answer live and marked as a person's, the agent hands back, and the bot answers again.

With `CHATCACHE_SNAPSHOTS=docs/img` it also saves both pages at desktop and phone widths
(the README's pictures).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from chatcache.dialog.manager import HANDOFF_REPLY

from .conftest import DESKTOP, KEY_A, PHONE, console_errors, snapshot
from .test_web_page import idle, session_ready, shown, type_message

SAM_KEY = "key-agent-a-0123456789"
KIM_KEY = "key-agent-b-0123456789"
WAIT_S = 60
# The bank bot's flows, intents and handoff, with a one-line prompt for its free replies: its own
# (policies and knowledge, about 7,900 tokens) does not fit the tiny model's 512-token window.
BANK = {"bot": "bank", "system_prompt": "You are a bank's assistant.", "answer_cache": False, "drift": False}
ANSWER = "I have **blocked** your card. <img src=x onerror=\"document.title='pwned'\"> [details](javascript:document.title='pwned')"


def waiting(driver: WebDriver) -> WebDriverWait[WebDriver]:
    """A wait that reads again what the page replaced meanwhile: both pages poll the server and
    redraw the queue and the conversation when they change, so an element found a moment ago
    may be gone by the time its text is read."""
    return WebDriverWait(driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(f"{KEY_A} bank\n{SAM_KEY} bank agent sam\n{KIM_KEY} bank agent kim\n")
    return path


def sign_in(driver: WebDriver, url: str, key: str) -> None:
    """Open the console and type the key, as an agent does (Tab leaves the field)."""
    driver.get(url + "/agent")
    driver.find_element(By.ID, "api-key").send_keys(key, Keys.TAB)


def signed_in_as(driver: WebDriver, name: str) -> None:
    """The console shows the person the key names, in a field the agent cannot edit."""
    field = driver.find_element(By.ID, "agent-name")
    waiting(driver).until(lambda d: field.get_property("value") == name)
    assert field.get_property("readOnly") is True


def open_first(driver: WebDriver, title: str) -> None:
    wait = waiting(driver)

    def click_item(d: WebDriver) -> bool:  # found and clicked in one try: a redraw in between tries again
        item = next((b for b in d.find_elements(By.CSS_SELECTOR, "#queue .item") if title in b.text), None)
        if item is not None:
            item.click()
        return item is not None

    wait.until(click_item)
    wait.until(lambda d: d.find_element(By.ID, "conversation-title").text == title)


def claim_status(driver: WebDriver) -> str:
    return driver.find_element(By.ID, "claim-status").text


def test_an_agent_takes_over_answers_live_and_hands_back(serve, browsers, keys_file: Path) -> None:  # type: ignore[no-untyped-def]
    live = serve(**BANK, api_key_file=keys_file, max_tokens=16)
    customer, sam, kim = browsers(), browsers(), browsers()
    wait = waiting(customer)

    customer.get(live.url + "/")
    key = wait.until(lambda d: d.find_element(By.ID, "api-key") if d.find_element(By.ID, "api-key").is_displayed() else None)
    assert customer.switch_to.active_element == key  # the server needs a key: the page asks for it
    key.send_keys(KEY_A, Keys.TAB)
    session_id = wait.until(session_ready)
    type_message(customer, "My card was stolen")
    wait.until(lambda d: len(shown(d)) == 2 and idle(d))
    type_message(customer, "I want to talk to a human")
    wait.until(lambda d: len(shown(d)) == 4 and idle(d))
    assert shown(customer)[-1] == ("bot", "Assistant", HANDOFF_REPLY)
    notice = customer.find_element(By.ID, "handoff")
    assert notice.is_displayed() and "a person from our team will answer here" in notice.text
    assert customer.find_element(By.ID, "title").text == "My card was stolen"

    sign_in(sam, live.url, SAM_KEY)
    signed_in_as(sam, "sam")
    open_first(sam, "My card was stolen")
    assert "talk to human" in sam.find_element(By.ID, "summary").get_property("textContent")
    assert [who for _, who, _ in shown(sam)] == ["Customer", "Assistant", "Customer", "Assistant"]
    assert sam.find_element(By.ID, "message").get_property("disabled") is True  # no reply before the claim
    sam.find_element(By.ID, "claim").click()
    waiting(sam).until(lambda d: claim_status(d) == "You have this conversation.")

    sign_in(kim, live.url, KIM_KEY)
    signed_in_as(kim, "kim")
    open_first(kim, "My card was stolen")
    waiting(kim).until(lambda d: "with sam" in d.find_element(By.CSS_SELECTOR, "#queue .item").text)
    assert claim_status(kim) == "sam has this conversation."
    kim.find_element(By.ID, "claim").click()
    error = waiting(kim).until(lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").is_displayed() else None)
    assert error.text == "sam has already taken over this conversation."
    assert kim.find_element(By.ID, "send").get_property("disabled") is True

    box = sam.find_element(By.ID, "message")
    box.send_keys(ANSWER, Keys.ENTER)  # a hostile-looking answer: the customer's page must show it as text
    wait.until(lambda d: len(shown(d)) == 5)  # live, no reload
    kind, who, text = shown(customer)[-1]
    assert (kind, who) == ("agent", "sam · from our team")
    assert text == "I have blocked your card. <img src=x onerror=\"document.title='pwned'\"> [details](javascript:document.title='pwned')"
    answer = customer.find_elements(By.CSS_SELECTOR, "#log > article.msg")[-1]
    assert answer.find_element(By.CSS_SELECTOR, ".bubble strong").text == "blocked"
    assert answer.find_elements(By.CSS_SELECTOR, "img, a, script") == [] and customer.title != "pwned"
    assert customer.find_elements(By.CSS_SELECTOR, "#log img") == []
    snapshot(customer, "chat-desktop", DESKTOP)
    snapshot(customer, "chat-phone", PHONE)
    snapshot(sam, "agent-desktop", DESKTOP)
    snapshot(sam, "agent-phone", PHONE)

    sam.find_element(By.ID, "hand-back").click()
    waiting(sam).until(lambda d: d.find_element(By.ID, "queue-empty").is_displayed())
    wait.until(lambda d: not d.find_element(By.ID, "handoff").is_displayed())  # the customer's page sees it, live
    type_message(customer, "What are your opening hours?")
    wait.until(lambda d: len(shown(d)) == 7 and idle(d))
    assert shown(customer)[-1][0] == "bot" and shown(customer)[-1][2].strip()
    with live.client(KEY_A) as client:
        record = client.get(f"/v1/sessions/{session_id}").json()
    assert record["handed_off"] is False and record["claimed_by"] is None
    assert [m.get("agent") for m in record["messages"]] == [None, None, None, None, "sam", None, None]
    assert console_errors(customer, expected=(401,)) == [] and console_errors(sam, expected=(401,)) == []
    assert console_errors(kim, expected=(401, 409)) == []


def test_the_console_with_a_customers_key_shows_the_refusal(serve, browser: WebDriver, keys_file: Path) -> None:  # type: ignore[no-untyped-def]
    live = serve(**BANK, api_key_file=keys_file)
    sign_in(browser, live.url, KEY_A)
    error = waiting(browser).until(lambda d: d.find_element(By.ID, "error") if "agent's API key" in d.find_element(By.ID, "error").text else None)
    assert error.is_displayed() and browser.find_elements(By.CSS_SELECTOR, "#queue .item") == []
