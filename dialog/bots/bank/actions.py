"""The bank bot's actions: each a thin call into the demo core-banking system (`apps.bank`).

Every action acts for the chatbot user asking (`context.user_id`), who is a customer of the
demo bank from their first question on. What it returns is what `bank.yaml`'s response
templates read as `{result.FIELD}`, amounts already written as a customer reads them
("2,500.00"). The bank's refusals (`BankingError`: not enough money, no card to activate) are
written for the customer, so each action passes them on as `ActionRefused`: the flow's
`error_response` says why. The balance is kept for 30 seconds; every action that
moves money drops it, so a balance shown after a transfer is never the one before it.

This module is loaded from its file by `dialog.Actions.load`, not imported as part of a
package, hence the absolute import of the backend.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import ParamSpec, TypeVar

from chatcache.apps.bank import ARRIVAL_WORKING_DAYS, BankingError, CoreBanking, database_url, format_money
from chatcache.dialog import ActionContext, ActionRefused, action

Params = ParamSpec("Params")
Result = TypeVar("Result")

_banks: dict[str, CoreBanking] = {}  # one backend, with its connection pool, per database URL
_opening = threading.Lock()


def _bank() -> CoreBanking:
    """The backend of `$CHATCACHE_BANK_DB` (or the default file), opened on its first use."""
    url = database_url()
    with _opening:  # two first turns at once must not both create the tables
        if url not in _banks:
            _banks[url] = CoreBanking(url)
        return _banks[url]


def refusals_said(function: Callable[Params, Result]) -> Callable[Params, Result]:
    """`function` with the bank's refusals raised as `ActionRefused`, for the customer to read."""

    @functools.wraps(function)
    def acting(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        try:
            return function(*args, **kwargs)
        except BankingError as refusal:
            raise ActionRefused(str(refusal)) from refusal

    return acting


@action("fetch_balance", cache_ttl_s=30)
def fetch_balance(context: ActionContext) -> dict[str, str]:
    balance = _bank().balance(context.user_id)
    return {"balance": format_money(balance.balance_cents), "currency": balance.currency, "account": balance.account}


@action("transfer_money", invalidates=["fetch_balance"])
@refusals_said
def transfer_money(amount: Decimal, to_account: str, currency: str, context: ActionContext) -> dict[str, str]:
    # The turn's key: a retried turn gets the first attempt's receipt, and the money moves once.
    receipt = _bank().transfer(context.user_id, amount, to_account, currency=currency, idempotency_key=context.idempotency_key)
    return {
        "reference": receipt.reference,
        "amount": format_money(receipt.amount_cents),
        "to_account": to_account,
        "balance": format_money(receipt.balance_cents),
    }


@action("block_card")
@refusals_said
def block_card(card_type: str, context: ActionContext) -> dict[str, str]:
    card = _bank().block_card(context.user_id, card_type)
    return {"card_type": card.card_type.value, "last4": card.last4}


@action("top_up", invalidates=["fetch_balance"])
@refusals_said
def top_up(amount: Decimal, currency: str, context: ActionContext) -> dict[str, str]:
    receipt = _bank().top_up(context.user_id, amount, currency=currency, idempotency_key=context.idempotency_key)
    return {"reference": receipt.reference, "amount": format_money(receipt.amount_cents), "balance": format_money(receipt.balance_cents)}


@action("cancel_transfer", invalidates=["fetch_balance"])
@refusals_said
def cancel_transfer(context: ActionContext) -> dict[str, str]:
    receipt = _bank().cancel_transfer(context.user_id, idempotency_key=context.idempotency_key)
    return {"reference": receipt.reference, "amount": format_money(receipt.amount_cents), "balance": format_money(receipt.balance_cents)}


@action("order_card")
def order_card(context: ActionContext) -> dict[str, str | int]:
    card = _bank().order_card(context.user_id)
    return {"reference": card.order_reference, "last4": card.last4, "arrival_days": ARRIVAL_WORKING_DAYS}


@action("activate_card")
@refusals_said
def activate_card(context: ActionContext) -> dict[str, str]:
    return {"last4": _bank().activate_card(context.user_id).last4}


@action("virtual_card")
def virtual_card(context: ActionContext) -> dict[str, str]:
    return {"last4": _bank().virtual_card(context.user_id).last4}


@action("unblock_pin")
def unblock_pin(context: ActionContext) -> dict[str, str]:
    return {"card_type": _bank().unblock_pin(context.user_id).card_type.value}
