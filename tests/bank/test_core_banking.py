"""The demo core-banking system against its own invariants: money is never made or lost."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from chatcache.apps.bank import DB_ENV, BankingError, CardStatus, CardType, CoreBanking, TransferStatus, database_url
from chatcache.apps.bank.core_banking import demo_account_number, is_account_number
from chatcache.apps.bank.tables import Card, Customer, Transfer
from chatcache.errors import ConfigError


def _cards(bank: CoreBanking) -> list[Card]:
    with Session(bank.engine) as session:
        return list(session.scalars(select(Card).order_by(Card.id)))


def _transfers(bank: CoreBanking) -> list[Transfer]:
    with Session(bank.engine) as session:
        return list(session.scalars(select(Transfer).order_by(Transfer.id)))


def test_a_new_customer_opens_with_a_current_account_and_two_cards(bank: CoreBanking) -> None:
    """Ada's first question finds 2,500.00 EUR on an 8-digit account, a debit and a credit card."""
    balance = bank.balance("ada")
    assert balance.balance_cents == 250_000 and balance.currency == "EUR"
    assert re.fullmatch(r"\d{8}", balance.account)
    cards = _cards(bank)
    assert [(c.card_type, c.status) for c in cards] == [(CardType.DEBIT, CardStatus.ACTIVE), (CardType.CREDIT, CardStatus.ACTIVE)]
    assert all(re.fullmatch(r"\d{4}", c.last4) for c in cards)
    assert bank.balance("ada") == balance, "asking again opens nothing new"
    assert bank.balance("bob").account != balance.account
    with Session(bank.engine) as session:
        assert session.scalars(select(Customer.user_id).order_by(Customer.id)).all() == ["ada", "bob"]


def test_the_database_is_the_env_var_url_else_a_file_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DB_ENV, raising=False)
    assert database_url() == f"sqlite:///{tmp_path / 'data' / 'bank_demo.sqlite'}"  # the root conftest's data dir
    assert (tmp_path / "data").is_dir()
    monkeypatch.setenv(DB_ENV, f"sqlite:///{tmp_path}/elsewhere.sqlite")
    bank = CoreBanking()
    bank.balance("ada")
    bank.close()
    assert (tmp_path / "elsewhere.sqlite").exists()


def test_a_transfer_moves_money_and_is_recorded(bank: CoreBanking, clock) -> None:  # type: ignore[no-untyped-def]
    receipt = bank.transfer("ada", Decimal("250"), "12345674", idempotency_key="turn-1")
    assert (receipt.reference, receipt.amount_cents, receipt.balance_cents, receipt.to_account) == ("TR-000001", 25_000, 225_000, "12345674")
    assert bank.balance("ada").balance_cents == 225_000
    (row,) = _transfers(bank)
    assert (row.amount_cents, row.to_account, row.status, row.created_at, row.idempotency_key) == (25_000, "12345674", TransferStatus.DONE, clock.now, "turn-1")
    assert bank.transfer("ada", Decimal("0.01"), "12345674").balance_cents == 224_999, "cents are exact"


@pytest.mark.parametrize(
    ("amount", "to_account", "message"),
    [
        ("0", "12345674", "more than zero"),
        ("-5", "12345674", "more than zero"),
        ("NaN", "12345674", "more than zero"),
        ("0.001", "12345674", "below the cent"),
        ("2500.01", "12345674", r"balance of 2,500.00 EUR does not cover 2,500.01 EUR"),
        ("1E+30", "12345674", "does not cover"),
        ("10", "1234", "8 digits"),
        ("10", "12345678", "No account has the number 12345678"),  # its check digit would be 4
        ("10", "12345647", "No account has the number"),  # two neighbours swapped
    ],
)
def test_a_refused_transfer_changes_nothing(bank: CoreBanking, amount: str, to_account: str, message: str) -> None:
    with pytest.raises(BankingError, match=message):
        bank.transfer("ada", Decimal(amount), to_account, idempotency_key="turn-1")
    assert bank.balance("ada").balance_cents == 250_000 and _transfers(bank) == []


def test_a_transfer_to_ones_own_account_is_refused(bank: CoreBanking) -> None:
    own = bank.balance("ada").account
    with pytest.raises(BankingError, match="your own account"):
        bank.transfer("ada", Decimal("10"), own)
    assert bank.balance("ada").balance_cents == 250_000 and _transfers(bank) == []


def test_every_new_customer_gets_a_number_that_checks_out_and_one_wrong_digit_never_does() -> None:
    numbers = [demo_account_number(f"customer-{n}") for n in range(200)]
    assert all(is_account_number(number) for number in numbers)
    for number in numbers[:20]:
        for position in range(8):
            for digit in "0123456789":
                typo = number[:position] + digit + number[position + 1 :]
                assert typo == number or not is_account_number(typo)


def test_a_retried_turn_gets_the_first_receipt_and_moves_money_once(bank: CoreBanking) -> None:
    first = bank.transfer("ada", Decimal("100"), "12345674", idempotency_key="turn-7")
    again = bank.transfer("ada", Decimal("100"), "12345674", idempotency_key="turn-7")
    assert again == first and bank.balance("ada").balance_cents == 240_000 and len(_transfers(bank)) == 1
    assert bank.transfer("ada", Decimal("100"), "12345674", idempotency_key="turn-8").reference == "TR-000002"
    assert bank.transfer("bob", Decimal("100"), "12345674", idempotency_key="turn-7").reference == "TR-000003", "keys are per account"


def test_cancelling_gives_the_latest_transfers_money_back_once(bank: CoreBanking, clock) -> None:  # type: ignore[no-untyped-def]
    bank.transfer("ada", Decimal("100"), "12345674")
    bank.transfer("ada", Decimal("250"), "87654323")
    cancelled = bank.cancel_transfer("ada")
    assert (cancelled.reference, cancelled.amount_cents, cancelled.balance_cents) == ("TR-000002", 25_000, 240_000)
    assert [t.status for t in _transfers(bank)] == [TransferStatus.DONE, TransferStatus.CANCELLED]
    assert bank.cancel_transfer("ada").reference == "TR-000001", "the latest one still done"
    with pytest.raises(BankingError, match="no transfer from the last 30 minutes"):
        bank.cancel_transfer("ada")
    assert bank.balance("ada").balance_cents == 250_000


def test_a_transfer_older_than_30_minutes_cannot_be_cancelled(bank: CoreBanking, clock) -> None:  # type: ignore[no-untyped-def]
    bank.transfer("ada", Decimal("100"), "12345674")
    clock.advance(minutes=30)
    assert bank.cancel_transfer("ada").reference == "TR-000001", "30 minutes is still within"
    bank.transfer("ada", Decimal("100"), "12345674")
    clock.advance(minutes=31)
    with pytest.raises(BankingError, match="could still be cancelled"):
        bank.cancel_transfer("ada")
    assert bank.balance("ada").balance_cents == 240_000


def test_a_top_up_adds_money_up_to_its_limit(bank: CoreBanking) -> None:
    receipt = bank.top_up("ada", Decimal("10000.00"))
    assert (receipt.reference, receipt.amount_cents, receipt.balance_cents) == ("TU-000001", 1_000_000, 1_250_000)
    for refused, message in [("10000.01", "at most 10,000.00 EUR"), ("0", "more than zero")]:
        with pytest.raises(BankingError, match=message):
            bank.top_up("ada", Decimal(refused))
    assert bank.balance("ada").balance_cents == 1_250_000


def test_a_retried_top_up_pays_in_once(bank: CoreBanking) -> None:
    first = bank.top_up("ada", Decimal("50"), idempotency_key="turn-3")
    bank.transfer("ada", Decimal("10"), "12345674")
    again = bank.top_up("ada", Decimal("50"), idempotency_key="turn-3")
    assert again == first and first.balance_cents == 255_000, "the first receipt, balance and all"
    assert bank.balance("ada").balance_cents == 254_000
    assert bank.top_up("ada", Decimal("50"), idempotency_key="turn-4").reference == "TU-000002"
    assert bank.top_up("bob", Decimal("50"), idempotency_key="turn-3").reference == "TU-000003", "keys are per account"


def test_a_retried_cancel_cancels_one_transfer_only(bank: CoreBanking) -> None:
    bank.transfer("ada", Decimal("100"), "12345674")
    bank.transfer("ada", Decimal("250"), "87654323")
    first = bank.cancel_transfer("ada", idempotency_key="turn-9")
    again = bank.cancel_transfer("ada", idempotency_key="turn-9")
    assert again == first and (first.reference, first.balance_cents) == ("TR-000002", 240_000)
    assert [t.status for t in _transfers(bank)] == [TransferStatus.DONE, TransferStatus.CANCELLED], "the older one is still done"
    assert bank.balance("ada").balance_cents == 240_000
    assert bank.cancel_transfer("ada", idempotency_key="turn-10").reference == "TR-000001", "a new turn cancels the next"


def test_a_refused_cancel_leaves_its_key_free(bank: CoreBanking) -> None:
    with pytest.raises(BankingError, match="no transfer"):
        bank.cancel_transfer("ada", idempotency_key="turn-1")
    bank.transfer("ada", Decimal("100"), "12345674")
    assert bank.cancel_transfer("ada", idempotency_key="turn-1").balance_cents == 250_000, "a refusal recorded nothing"


def test_an_older_demo_database_is_refused_with_how_to_reset_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.sqlite"
    with create_engine(url).begin() as connection:  # the top-ups table before its idempotency key
        connection.exec_driver_sql("CREATE TABLE top_ups (id INTEGER PRIMARY KEY, account_id INTEGER, amount_cents INTEGER, created_at DATETIME)")
    with pytest.raises(ConfigError, match=r"older version \(table top_ups lacks idempotency_key, balance_after_cents\): delete it"):
        CoreBanking(url)


def test_an_ordered_card_becomes_active_when_activated(bank: CoreBanking) -> None:
    with pytest.raises(BankingError, match="no ordered card"):
        bank.activate_card("ada")
    ordered = bank.order_card("ada")
    assert (ordered.card_type, ordered.status) == (CardType.DEBIT, CardStatus.ORDERED)
    assert re.fullmatch(r"CO-\d{6}", ordered.order_reference)
    activated = bank.activate_card("ada")
    assert (activated.last4, activated.status, activated.order_reference) == (ordered.last4, CardStatus.ACTIVE, ordered.order_reference)
    assert [c.status for c in _cards(bank)] == [CardStatus.ACTIVE] * 3
    with pytest.raises(BankingError, match="no ordered card"):
        bank.activate_card("ada")


def test_blocking_a_card_twice_blocks_it_once(bank: CoreBanking) -> None:
    first = bank.block_card("ada", "debit")
    assert first.status == CardStatus.BLOCKED and bank.block_card("ada", "Debit card") == first
    assert [(c.card_type, c.status) for c in _cards(bank)] == [(CardType.DEBIT, CardStatus.BLOCKED), (CardType.CREDIT, CardStatus.ACTIVE)]
    with pytest.raises(BankingError, match="no virtual card to block"):
        bank.block_card("ada", "virtual")
    with pytest.raises(BankingError, match="a debit, a credit or a virtual card"):
        bank.block_card("ada", "loyalty")
    virtual = bank.virtual_card("ada")
    assert (virtual.card_type, virtual.status) == (CardType.VIRTUAL, CardStatus.ACTIVE)
    assert bank.block_card("ada", "virtual").last4 == virtual.last4


def test_blocking_twice_after_a_replacement_blocks_only_the_new_card(bank: CoreBanking) -> None:
    """With an old and a new debit card in use, "block my debit card" twice blocks the new one once."""
    bank.order_card("ada")
    new = bank.activate_card("ada")
    assert bank.block_card("ada", "debit").last4 == new.last4
    assert bank.block_card("ada", "debit").last4 == new.last4
    assert [c.status for c in _cards(bank) if c.card_type == CardType.DEBIT] == [CardStatus.ACTIVE, CardStatus.BLOCKED]


def test_unblocking_the_pin_gives_the_debit_card_its_tries_back(bank: CoreBanking) -> None:
    bank.balance("ada")
    with Session(bank.engine) as session, session.begin():
        session.scalars(select(Card).where(Card.card_type == CardType.DEBIT)).one().pin_tries_left = 0
    assert bank.unblock_pin("ada").card_type == CardType.DEBIT
    assert [c.pin_tries_left for c in _cards(bank)] == [3, 3]
    bank.block_card("ada", "debit")
    with pytest.raises(BankingError, match="no active debit card"):
        bank.unblock_pin("ada")
