"""A demo core-banking system: the backend the shipped bank bot's actions really act on.

Each chatbot user is a customer, opened on first use with a current account holding
2,500.00 EUR and an active debit and credit card, so a demo starts with money to move. Every
operation is one database transaction (opening a new customer is one before it, kept even if
the operation is refused), and those that move money are safe under concurrent threads and
processes: the debit is a conditional UPDATE (`balance >= amount`) whose row count
says whether it happened, so two transfers can never overdraw an account between them, on
SQLite or PostgreSQL alike. A transfer, a top-up and a cancellation carry the chatbot turn's
idempotency key, so a retried turn gets the first attempt's receipt instead of moving the money
twice.

What it deliberately does not do: transfers go to other banks' account numbers only (nobody
here is credited, so a cancelled transfer takes nothing back from a recipient), there is one
currency, and no interest, fees, statements or authentication: the chatbot vouches for its user.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import CursorResult, Engine, Update, inspect, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from chatcache.errors import ConfigError

from .database import DB_ENV, connect, database_url
from .tables import PIN_TRIES, Account, Base, Card, CardStatus, CardType, Customer, TopUp, Transfer, TransferStatus

CURRENCY = "EUR"
OPENING_BALANCE_CENTS = 250_000
MAX_TOP_UP_CENTS = 1_000_000
CANCEL_WINDOW = timedelta(minutes=30)
ARRIVAL_WORKING_DAYS = 5  # how long an ordered card takes to arrive
_OPEN_CUSTOMER_TRIES = 5  # a new account number may collide with an existing one
_ACCOUNT_NUMBER = re.compile(r"\d{8}")
_NOTHING_TO_CANCEL = f"There is no transfer from the last {CANCEL_WINDOW.seconds // 60} minutes that could still be cancelled."


class BankingError(ValueError):
    """An operation the bank refuses; the message is written for the customer."""


@dataclass(frozen=True)
class Balance:
    account: str
    balance_cents: int
    currency: str


@dataclass(frozen=True)
class Receipt:
    """What moving money left: its reference, the amount, and the balance after it."""

    reference: str
    amount_cents: int
    balance_cents: int
    to_account: str | None = None  # where a transfer went; None for a top-up


@dataclass(frozen=True)
class CardInfo:
    card_type: CardType
    last4: str
    status: CardStatus
    order_reference: str


def format_money(cents: int) -> str:
    """Cents as a customer reads them: 250000 is "2,500.00"."""
    return f"{Decimal(cents) / 100:,.2f}"


def demo_account_number(user_id: str, attempt: int = 0) -> str:
    """The account number a new demo customer gets: the same in every new demo database, so a
    conversation test can name the customer's own account (the `attempt`-th, after collisions)."""
    digest = hashlib.sha256(f"{user_id}/{attempt}".encode()).digest()
    return with_check_digit(f"{int.from_bytes(digest[:8], 'big') % 10**7:07d}")


def with_check_digit(digits: str) -> str:
    """`digits` followed by their Luhn check digit, as the bank's account numbers end (and card
    numbers do): a mistyped digit, or two neighbours swapped, makes a number that no account has."""
    return digits + str((10 - _luhn_sum(digits + "0")) % 10)


def is_account_number(number: str) -> bool:
    """Whether `number` could be an account: 8 digits whose last checks the others."""
    return bool(_ACCOUNT_NUMBER.fullmatch(number)) and _luhn_sum(number) % 10 == 0


def _luhn_sum(number: str) -> int:
    """The Luhn sum: every second digit from the right doubled, less 9 above 9, and all added."""
    doubled = (int(digit) * 2 if position % 2 else int(digit) for position, digit in enumerate(reversed(number)))
    return sum(value - 9 if value > 9 else value for value in doubled)


def _utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)  # naive UTC, as the tables keep it


class CoreBanking:
    """The demo bank, each operation for one chatbot user id.

    Args:
        url: a SQLAlchemy database URL; None: `database.database_url()`. The tables are
            created if missing. (In-memory SQLite is one database per thread: use a file for threads.)
        clock: the current time as naive UTC (a test's own clock, to age a transfer).

    Raises:
        ConfigError: the database holds the tables of an older demo, without today's columns.
    """

    def __init__(self, url: str | None = None, clock: Callable[[], datetime] = _utc_now) -> None:
        self.engine = connect(url or database_url())
        Base.metadata.create_all(self.engine)
        _check_columns(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._now = clock

    def close(self) -> None:
        """Close the pooled connections (a SQLite file can then be deleted)."""
        self.engine.dispose()

    def balance(self, user_id: str) -> Balance:
        """The customer's account number, balance and currency."""
        account_id = self._account_id(user_id)
        with self._sessions.begin() as session:
            account = session.get_one(Account, account_id)
            return Balance(account.number, account.balance_cents, account.currency)

    def transfer(
        self, user_id: str, amount: Decimal, to_account: str, currency: str = CURRENCY, idempotency_key: str | None = None
    ) -> Receipt:
        """Send `amount` of `currency` to the account number `to_account`; with a key already
        used, the first transfer's receipt, and no money moves.

        Raises:
            BankingError: the amount is not positive or not covered by the balance, the
                currency is not the bank's, or the account number is not 8 digits, is no
                account's (its check digit is wrong) or is the customer's own.
        """
        cents = _cents(amount, currency)
        account_id = self._account_id(user_id)

        def send(session: Session) -> Receipt:
            account = session.get_one(Account, account_id)
            if not _ACCOUNT_NUMBER.fullmatch(to_account):
                raise BankingError(f"An account number has 8 digits, and {to_account} does not.")
            if not is_account_number(to_account):
                raise BankingError(f"No account has the number {to_account}: its last digit does not check the others. Please check the number.")
            if to_account == account.number:
                raise BankingError("That is your own account; a transfer goes to someone else's.")
            balance = _debit(session, account, cents)
            transfer = Transfer(
                account_id=account_id,
                amount_cents=cents,
                to_account=to_account,
                status=TransferStatus.DONE,
                created_at=self._now(),
                idempotency_key=idempotency_key,
                balance_after_cents=balance,
            )
            session.add(transfer)
            session.flush()
            return _receipt(transfer)

        return self._once(idempotency_key, lambda session, key: _transfer_by_key(session, account_id, key), send)

    def top_up(self, user_id: str, amount: Decimal, currency: str = CURRENCY, idempotency_key: str | None = None) -> Receipt:
        """Pay `amount` of `currency` into the account; with a key already used, the first
        top-up's receipt, and no money moves.

        Raises:
            BankingError: the amount is not positive or is over the limit of one top-up, or the
                currency is not the bank's.
        """
        cents = _cents(amount, currency)
        if cents > MAX_TOP_UP_CENTS:
            raise BankingError(f"A top-up can be at most {format_money(MAX_TOP_UP_CENTS)} {CURRENCY}.")
        account_id = self._account_id(user_id)

        def pay_in(session: Session) -> Receipt:
            session.execute(update(Account).where(Account.id == account_id).values(balance_cents=Account.balance_cents + cents))
            top_up = TopUp(
                account_id=account_id,
                amount_cents=cents,
                created_at=self._now(),
                idempotency_key=idempotency_key,
                balance_after_cents=_balance_cents(session, account_id),
            )
            session.add(top_up)
            session.flush()
            return Receipt(top_up.reference, cents, top_up.balance_after_cents)

        return self._once(idempotency_key, lambda session, key: _top_up_by_key(session, account_id, key), pay_in)

    def cancel_transfer(self, user_id: str, idempotency_key: str | None = None) -> Receipt:
        """Cancel the latest transfer still done and made within `CANCEL_WINDOW`: its money comes
        back. With a key already used, the receipt of the transfer that key cancelled, and
        nothing else is cancelled.

        Raises:
            BankingError: there is no such transfer.
        """
        account_id = self._account_id(user_id)

        def cancel(session: Session) -> Receipt:
            since = self._now() - CANCEL_WINDOW
            latest = session.scalars(
                select(Transfer)
                .where(Transfer.account_id == account_id, Transfer.status == TransferStatus.DONE, Transfer.created_at >= since)
                .order_by(Transfer.id.desc())
                .limit(1)
            ).first()
            if latest is None:
                raise BankingError(_NOTHING_TO_CANCEL)
            # Conditional, like the debit: of two concurrent cancels, one gives the money back.
            cancelled = _changed(
                session,
                update(Transfer)
                .where(Transfer.id == latest.id, Transfer.status == TransferStatus.DONE)
                .values(status=TransferStatus.CANCELLED, cancel_key=idempotency_key),
            )
            if cancelled != 1:
                raise BankingError(_NOTHING_TO_CANCEL)
            session.execute(update(Account).where(Account.id == account_id).values(balance_cents=Account.balance_cents + latest.amount_cents))
            balance = _balance_cents(session, account_id)
            session.execute(update(Transfer).where(Transfer.id == latest.id).values(balance_after_cancel_cents=balance))
            return Receipt(latest.reference, latest.amount_cents, balance, latest.to_account)

        return self._once(idempotency_key, lambda session, key: _cancel_by_key(session, account_id, key), cancel)

    def _once(self, key: str | None, first_with: Callable[[Session, str], Receipt | None], act: Callable[[Session], Receipt]) -> Receipt:
        """`act` in one transaction, unless the turn `key` already acted: then that first
        receipt (`first_with(session, key)`), and nothing happens again."""
        try:
            with self._sessions.begin() as session:
                if key is not None and (first := first_with(session, key)) is not None:
                    return first
                return act(session)
        except IntegrityError:
            # A concurrent retry of the same turn recorded its row first (PostgreSQL; on
            # SQLite writers queue, so the lookup above finds it): this attempt rolled back.
            if key is None:
                raise
            with self._sessions.begin() as session:
                first = first_with(session, key)
            if first is None:
                raise
            return first

    def block_card(self, user_id: str, card_type: str) -> CardInfo:
        """Block the customer's `card_type` card ("debit", "credit", "virtual"): the newest one
        in use, whose replacement may still be in the post. Already blocked, it is returned as
        it is, so asking twice blocks one card, not the next one too.

        Raises:
            BankingError: the card type is unknown, or the customer has no such card.
        """
        wanted = _card_type(card_type)
        account_id = self._account_id(user_id)
        with self._sessions.begin() as session:
            card = _newest_card(session, account_id, wanted, CardStatus.ACTIVE, CardStatus.BLOCKED)
            if card is None:
                raise BankingError(f"You have no {wanted.value} card to block.")
            card.status = CardStatus.BLOCKED
            return _card_info(card)

    def order_card(self, user_id: str) -> CardInfo:
        """Order a new physical debit card; it arrives in `ARRIVAL_WORKING_DAYS` working days."""
        return self._issue_card(user_id, CardType.DEBIT, CardStatus.ORDERED)

    def activate_card(self, user_id: str) -> CardInfo:
        """Activate the newest ordered card.

        Raises:
            BankingError: no card is on its way.
        """
        account_id = self._account_id(user_id)
        with self._sessions.begin() as session:
            card = session.scalars(
                select(Card).where(Card.account_id == account_id, Card.status == CardStatus.ORDERED).order_by(Card.id.desc()).limit(1)
            ).first()
            if card is None:
                raise BankingError("You have no ordered card waiting to be activated.")
            card.status = CardStatus.ACTIVE
            return _card_info(card)

    def virtual_card(self, user_id: str) -> CardInfo:
        """Issue a new virtual card, active at once."""
        return self._issue_card(user_id, CardType.VIRTUAL, CardStatus.ACTIVE)

    def _issue_card(self, user_id: str, card_type: CardType, status: CardStatus) -> CardInfo:
        account_id = self._account_id(user_id)
        with self._sessions.begin() as session:
            card = self._new_card(account_id, card_type, status)
            session.add(card)
            session.flush()
            return _card_info(card)

    def unblock_pin(self, user_id: str) -> CardInfo:
        """Give the active debit card its PIN tries back.

        Raises:
            BankingError: the customer has no active debit card.
        """
        account_id = self._account_id(user_id)
        with self._sessions.begin() as session:
            card = _newest_card(session, account_id, CardType.DEBIT, CardStatus.ACTIVE)
            if card is None:
                raise BankingError("You have no active debit card whose PIN could be unblocked.")
            card.pin_tries_left = PIN_TRIES
            return _card_info(card)

    def _account_id(self, user_id: str) -> int:
        """The id of `user_id`'s account, opening the customer with demo data if new.

        Its own transaction, so a customer stays open even when the operation that opened it fails.
        """
        for attempt in range(_OPEN_CUSTOMER_TRIES):
            with self._sessions.begin() as session:
                found = session.scalar(select(Account.id).join(Customer).where(Customer.user_id == user_id))
            if found is not None:
                return found
            try:
                self._open_customer(user_id, attempt)
            except IntegrityError:
                continue  # another thread opened this customer first, or the account number is taken
        raise BankingError("Your account could not be opened just now; please try again.")

    def _open_customer(self, user_id: str, attempt: int) -> None:
        with self._sessions.begin() as session:
            customer = Customer(user_id=user_id, created_at=self._now())
            session.add(customer)
            session.flush()
            account = Account(customer_id=customer.id, number=demo_account_number(user_id, attempt), currency=CURRENCY, balance_cents=OPENING_BALANCE_CENTS)
            session.add(account)
            session.flush()
            session.add_all([self._new_card(account.id, CardType.DEBIT, CardStatus.ACTIVE), self._new_card(account.id, CardType.CREDIT, CardStatus.ACTIVE)])

    def _new_card(self, account_id: int, card_type: CardType, status: CardStatus) -> Card:
        return Card(account_id=account_id, card_type=card_type, last4=f"{secrets.randbelow(10**4):04d}", status=status, pin_tries_left=PIN_TRIES, created_at=self._now())


def _check_columns(engine: Engine) -> None:
    """`create_all` adds missing tables, not missing columns: an older demo's database is refused by name."""
    inspector = inspect(engine)
    for table in Base.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        missing = [column.name for column in table.columns if column.name not in present]
        if missing:
            raise ConfigError(
                f"The demo bank's database {engine.url.render_as_string(hide_password=True)} is from an older version "
                f"(table {table.name} lacks {', '.join(missing)}): delete it to start the demo afresh, or set ${DB_ENV} to another."
            )


def _cents(amount: Decimal, currency: str) -> int:
    if currency.upper() != CURRENCY:  # one currency, and no conversion: never a silent change of what was asked
        raise BankingError(f"Northwind Bank moves money in {CURRENCY} only, not in {currency}.")
    if not amount.is_finite() or amount <= 0:
        raise BankingError("The amount must be more than zero.")
    cents = amount * 100
    if cents != cents.to_integral_value():
        raise BankingError("An amount cannot go below the cent.")
    return int(cents)


def _debit(session: Session, account: Account, cents: int) -> int:
    """Take `cents` from the account, or refuse if its balance does not cover them; the balance after."""
    # The balance read here is a clear message early; the WHERE is the guard that holds under concurrency.
    if cents <= account.balance_cents:
        taken = _changed(
            session, update(Account).where(Account.id == account.id, Account.balance_cents >= cents).values(balance_cents=Account.balance_cents - cents)
        )
        if taken == 1:
            return _balance_cents(session, account.id)
    balance = _balance_cents(session, account.id)
    raise BankingError(f"Your balance of {format_money(balance)} {account.currency} does not cover {format_money(cents)} {account.currency}.")


def _changed(session: Session, statement: Update) -> int:
    """How many rows an UPDATE changed: its result is a cursor's, which `Session.execute` does not type."""
    result = session.execute(statement)
    assert isinstance(result, CursorResult)
    return result.rowcount


def _balance_cents(session: Session, account_id: int) -> int:
    balance = session.scalar(select(Account.balance_cents).where(Account.id == account_id))
    assert balance is not None
    return balance


def _transfer_by_key(session: Session, account_id: int, key: str) -> Receipt | None:
    transfer = session.scalars(select(Transfer).where(Transfer.account_id == account_id, Transfer.idempotency_key == key)).first()
    return None if transfer is None else _receipt(transfer)


def _top_up_by_key(session: Session, account_id: int, key: str) -> Receipt | None:
    top_up = session.scalars(select(TopUp).where(TopUp.account_id == account_id, TopUp.idempotency_key == key)).first()
    return None if top_up is None else Receipt(top_up.reference, top_up.amount_cents, top_up.balance_after_cents)


def _cancel_by_key(session: Session, account_id: int, key: str) -> Receipt | None:
    transfer = session.scalars(select(Transfer).where(Transfer.account_id == account_id, Transfer.cancel_key == key)).first()
    if transfer is None or transfer.balance_after_cancel_cents is None:
        return None
    return Receipt(transfer.reference, transfer.amount_cents, transfer.balance_after_cancel_cents, transfer.to_account)


def _receipt(transfer: Transfer) -> Receipt:
    return Receipt(transfer.reference, transfer.amount_cents, transfer.balance_after_cents, transfer.to_account)


def _newest_card(session: Session, account_id: int, card_type: CardType, *statuses: CardStatus) -> Card | None:
    return session.scalars(
        select(Card).where(Card.account_id == account_id, Card.card_type == card_type, Card.status.in_(statuses)).order_by(Card.id.desc()).limit(1)
    ).first()


def _card_type(name: str) -> CardType:
    """The card type a customer names: "debit", "Debit card", "credit", "virtual"."""
    try:
        return CardType(name.strip().lower().removesuffix(" card"))
    except ValueError:
        raise BankingError("I can block a debit, a credit or a virtual card.") from None


def _card_info(card: Card) -> CardInfo:
    return CardInfo(card.card_type, card.last4, card.status, card.order_reference)
