"""Fixtures for the dialogue tests: the shipped bot and a deterministic toy embedder."""

from __future__ import annotations

import pytest

from chatcache.dialog import BotDefinition, load_bot

@pytest.fixture(scope="session")
def bot() -> BotDefinition:
    return load_bot("customer_service")


@pytest.fixture(scope="session")
def embed(toy_embed):  # type: ignore[no-untyped-def]
    """The root conftest's toy embedder under the name these tests use."""
    return toy_embed


SMALL_BANK = """\
system_prompt: You are a bank's assistant.
actions: small_bank_actions.py
intents:
  - name: transfer_money
    description: a transfer
    slots: [amount, currency, to_account]
    examples: ['I want to send money', 'transfer money to another account', 'send 50 euros to account 12345674']
  - name: block_card
    description: blocking your card
    examples: ['block my card', 'please block my card now', 'freeze and block my bank card']
  - name: check_balance
    description: the balance of your account
    examples: ["what's my balance", 'how much money is in my account', 'show me my balance']
  - name: opening_hours
    examples: ['when are you open', 'what are your opening hours', 'are you open on saturday']
    answer: We are open from 9 to 5.
  - name: fees
    examples: ['what are your fees', 'do I pay fees', 'how much are the fees']
    answer: Transfers within the country are free.
slots:
  - name: to_account
    pattern: '(?<![\\d.,])(\\d{8})(?![\\d.,])'
    valid: '(?!99999999)\\d{8}'
    invalid: '{value} is a closed account; give another one.'
  - name: amount
    kind: amount
  - name: currency
    kind: currency
    default: EUR
    valid: EUR
    invalid: We send euros only, not {value}.
flows:
  transfer_money:
    ask:
      amount: How much would you like to send?
      to_account: To which account?
    confirm: Send {amount} {currency} to {to_account}?
    action: transfer
    response: Sent {amount} {currency} to {to_account}.
    error_response: 'I could not make that transfer: {reason} Shall I put you through to a person?'
  block_card:
    confirm: Shall I block your card now?
    action: block_card
    response: Your card is blocked.
    error_response: Your card could not be blocked.
  check_balance:
    action: balance
    response: You have {result.balance} EUR.
"""

SMALL_BANK_ACTIONS = '''
from chatcache.dialog import ActionRefused, action

@action("transfer")
def transfer(amount, currency, to_account):
    if to_account == "12121212":
        raise ActionRefused("That is your own account; a transfer goes to someone else's.")
    if to_account == "00000000":
        raise RuntimeError("core banking at 10.0.0.7 said: password for svc_bank expired")
    return {}

@action("block_card")
def block_card():
    raise ActionRefused("Your card is already blocked.")

@action("balance")
def balance():
    return {"balance": "2,200.00"}
'''


@pytest.fixture
def small_bank(tmp_path):  # type: ignore[no-untyped-def]
    """A small bank bot: a transfer in euros only (its currency a default, an account refused by
    `valid`), a card block and a balance that act, and two curated answers (opening hours, fees).
    Its actions refuse a transfer to 12121212 (`ActionRefused`) and fail with internals for 00000000;
    blocking a card is always refused (it already is)."""
    (tmp_path / "small_bank_actions.py").write_text(SMALL_BANK_ACTIONS)
    path = tmp_path / "small_bank.yaml"
    path.write_text(SMALL_BANK)
    return load_bot(path)
