"""The bank bot's actions module (`dialog/bots/bank/actions.py`) run by `dialog.Actions` on a real demo bank.

A small bot with one flow per action stands in for `bank.yaml`: what is tested is the module,
its results' fields, and that the balance it keeps is never older than the last money moved.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatcache import dialog
from chatcache.apps.bank import DB_ENV, CoreBanking, demo_account_number
from chatcache.dialog import ActionContext, Actions, BotDefinition, Flow, Intent, Slot

MODULE = Path(dialog.__file__).parent / "bots" / "bank" / "actions.py"

# intent, its slots, and the response its flow renders from the action's result
FLOWS = {
    "fetch_balance": ([], "You have {result.balance} {result.currency} on account {result.account}."),
    "transfer_money": (["amount", "to_account", "currency"], "Sent {result.amount} to {result.to_account}, reference {result.reference}; {result.balance} left."),
    "block_card": (["card_type"], "Your {result.card_type} card ending {result.last4} is blocked."),
    "top_up": (["amount", "currency"], "Topped up {result.amount}, reference {result.reference}; balance {result.balance}."),
    "cancel_transfer": ([], "Cancelled {result.reference}: {result.amount} is back; balance {result.balance}."),
    "order_card": ([], "Card ending {result.last4} ordered ({result.reference}), here in {result.arrival_days} working days."),
    "activate_card": ([], "Card ending {result.last4} is active."),
    "virtual_card": ([], "Your virtual card ends {result.last4}."),
    "unblock_pin": ([], "The PIN of your {result.card_type} card is unblocked."),
}
ASK = {"amount": "How much?", "to_account": "To which account?", "card_type": "Which card?"}


def _bot() -> BotDefinition:
    return BotDefinition(
        system_prompt="You are a bank's assistant.",
        intents=[Intent(name=name, examples=[name.replace("_", " ")], slots=slots) for name, (slots, _) in FLOWS.items()],
        slots=[
            Slot(name="amount", kind="amount"),
            Slot(name="to_account", pattern=r"\b(\d{8})\b"),
            Slot(name="card_type", values=["debit", "credit", "virtual"]),
            Slot(name="currency", kind="currency", default="EUR"),
        ],
        flows={
            name: Flow(ask={s: ASK[s] for s in slots if s in ASK}, action=name, response=response, error_response=f"{name} did not go through.")
            for name, (slots, response) in FLOWS.items()
        },
        actions=str(MODULE),
    )


@pytest.fixture
def bank_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/bank.sqlite"
    monkeypatch.setenv(DB_ENV, url)
    return url


@pytest.fixture
def actions(bank_url: str) -> Actions:
    loaded = Actions.load(_bot())
    assert loaded is not None
    return loaded


def _turn(n: int, user: str = "ada") -> ActionContext:
    return ActionContext("acme", user, "s1", f"s1:{n}")


def test_the_shown_balance_is_kept_but_never_older_than_the_last_money_moved(actions: Actions) -> None:
    """The balance is read once, kept, and read afresh after a transfer, a top-up and a cancel."""
    first = actions.perform("fetch_balance", {}, _turn(1))
    assert re.fullmatch(r"You have 2,500\.00 EUR on account \d{8}\.", first.reply) and not first.cached
    assert actions.perform("fetch_balance", {}, _turn(2)).cached, "kept: the bank was not asked again"
    sent = actions.perform("transfer_money", {"amount": "250", "to_account": "12345674", "currency": "EUR"}, _turn(3))
    assert sent.reply == "Sent 250.00 to 12345674, reference TR-000001; 2,250.00 left."
    after = actions.perform("fetch_balance", {}, _turn(4))
    assert not after.cached and after.result is not None and after.result["balance"] == "2,250.00"
    actions.perform("top_up", {"amount": "1000", "currency": "EUR"}, _turn(5))
    assert actions.perform("fetch_balance", {}, _turn(6)).result == {**after.result, "balance": "3,250.00"}
    cancelled = actions.perform("cancel_transfer", {}, _turn(7))
    assert cancelled.reply == "Cancelled TR-000001: 250.00 is back; balance 3,500.00."
    assert actions.perform("fetch_balance", {}, _turn(8)).result == {**after.result, "balance": "3,500.00"}


def test_the_actions_act_on_the_bank_the_env_var_names(actions: Actions, bank_url: str) -> None:
    actions.perform("transfer_money", {"amount": "1234.5", "to_account": "12345674", "currency": "EUR"}, _turn(1))
    bank = CoreBanking(bank_url)
    try:
        assert bank.balance("ada").balance_cents == 126_550 and bank.balance("bob").balance_cents == 250_000
    finally:
        bank.close()


def test_a_retried_turn_transfers_once(actions: Actions) -> None:
    transfer = {"amount": "100", "to_account": "12345674", "currency": "EUR"}
    first = actions.perform("transfer_money", transfer, _turn(1))
    retry = actions.perform("transfer_money", transfer, _turn(1))
    assert retry.result == first.result and retry.reply == first.reply
    assert actions.perform("fetch_balance", {}, _turn(2)).result["balance"] == "2,400.00"  # type: ignore[index]


def test_a_retried_turn_tops_up_and_cancels_once(actions: Actions) -> None:
    actions.perform("transfer_money", {"amount": "100", "to_account": "12345674", "currency": "EUR"}, _turn(1))
    actions.perform("transfer_money", {"amount": "200", "to_account": "12345674", "currency": "EUR"}, _turn(2))
    for _ in range(2):
        cancelled = actions.perform("cancel_transfer", {}, _turn(3))
        topped_up = actions.perform("top_up", {"amount": "50", "currency": "EUR"}, _turn(4))
    assert cancelled.result["amount"] == "200.00" and topped_up.result["balance"] == "2,450.00"  # type: ignore[index]
    assert actions.perform("fetch_balance", {}, _turn(5)).result["balance"] == "2,450.00"  # type: ignore[index]


def test_a_refused_action_tells_the_customer_the_banks_reason(actions: Actions) -> None:
    refused = actions.perform("transfer_money", {"amount": "9999", "to_account": "12345674", "currency": "EUR"}, _turn(1))
    assert refused.reply == "Your balance of 2,500.00 EUR does not cover 9,999.00 EUR. transfer_money did not go through." and refused.result is None
    own = actions.perform("transfer_money", {"amount": "10", "to_account": demo_account_number("ada"), "currency": "EUR"}, _turn(2))
    assert own.reply == "That is your own account; a transfer goes to someone else's. transfer_money did not go through."
    dollars = actions.perform("transfer_money", {"amount": "10", "to_account": "12345674", "currency": "USD"}, _turn(3))
    assert dollars.reply == "Northwind Bank moves money in EUR only, not in USD. transfer_money did not go through."
    nothing = actions.perform("cancel_transfer", {}, _turn(4))
    assert nothing.result is None and nothing.reply.startswith("There is no transfer from the last 30 minutes")
    assert actions.perform("fetch_balance", {}, _turn(3)).result["balance"] == "2,500.00"  # type: ignore[index]


def test_the_card_actions_return_the_fields_the_bot_reads(actions: Actions) -> None:
    blocked = actions.perform("block_card", {"card_type": "credit"}, _turn(1))
    assert blocked.result is not None and blocked.result["card_type"] == "credit" and re.fullmatch(r"\d{4}", blocked.result["last4"])
    assert actions.perform("block_card", {"card_type": "credit"}, _turn(2)).result == blocked.result, "blocking again changes nothing"
    ordered = actions.perform("order_card", {}, _turn(3)).result
    assert ordered is not None and ordered["arrival_days"] == 5 and re.fullmatch(r"CO-\d{6}", ordered["reference"])
    assert actions.perform("activate_card", {}, _turn(4)).result == {"last4": ordered["last4"]}
    assert actions.perform("activate_card", {}, _turn(5)).error is not None, "nothing left to activate"
    virtual = actions.perform("virtual_card", {}, _turn(6)).result
    assert virtual is not None and re.fullmatch(r"\d{4}", virtual["last4"])
    assert actions.perform("unblock_pin", {}, _turn(7)).reply == "The PIN of your debit card is unblocked."
