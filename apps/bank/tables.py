"""The demo bank's tables: customers, their accounts, cards, transfers and top-ups.

Money is whole cents in an integer column, never a float: 0.10 + 0.20 must be 0.30 to the cent.
Times are naive UTC (SQLite keeps no time zone); `core_banking` is the only writer and reads
them back as UTC. References such as "TR-000042" are the row's id, formatted, not a column of
their own, so two rows can never share one.

These classes only describe the schema; `core_banking.CoreBanking` creates the tables and is
the only module that queries them.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from sqlalchemy import DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PIN_TRIES = 3  # wrong PINs a card takes before it refuses the next one


class CardType(str, Enum):
    DEBIT = "debit"
    CREDIT = "credit"
    VIRTUAL = "virtual"


class CardStatus(str, Enum):
    ACTIVE = "active"
    BLOCKED = "blocked"
    ORDERED = "ordered"  # in the post: it becomes active when the customer activates it


class TransferStatus(str, Enum):
    DONE = "done"
    CANCELLED = "cancelled"


class Base(DeclarativeBase):
    """Declarative base holding the demo bank's metadata (apart from the session tier's)."""


class Customer(Base):
    """One per chatbot user id, opened with demo data the first time that user asks anything."""

    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Account(Base):
    """A customer's current account."""

    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), unique=True)
    number: Mapped[str] = mapped_column(String(8), unique=True)
    currency: Mapped[str] = mapped_column(String(3))
    balance_cents: Mapped[int] = mapped_column(Integer)


class Card(Base):
    """A payment card on an account."""

    __tablename__ = "cards"

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    card_type: Mapped[CardType]
    last4: Mapped[str] = mapped_column(String(4))
    status: Mapped[CardStatus]
    pin_tries_left: Mapped[int] = mapped_column(Integer, default=PIN_TRIES)
    created_at: Mapped[datetime] = mapped_column(DateTime)

    @property
    def order_reference(self) -> str:
        return f"CO-{self.id:06d}"


class Transfer(Base):
    """Money sent from an account to another bank's account number.

    `idempotency_key` is the chatbot turn that asked for it: a retried turn finds its transfer
    instead of sending the money twice. `balance_after_cents` lets that retry see the same
    receipt as the first attempt.
    """

    __tablename__ = "transfers"
    __table_args__ = (UniqueConstraint("account_id", "idempotency_key"), UniqueConstraint("account_id", "cancel_key"))

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    amount_cents: Mapped[int] = mapped_column(Integer)
    to_account: Mapped[str] = mapped_column(String(8))
    status: Mapped[TransferStatus]
    created_at: Mapped[datetime] = mapped_column(DateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    balance_after_cents: Mapped[int] = mapped_column(Integer)
    # The turn that cancelled it and the balance that left, for that turn's retries.
    cancel_key: Mapped[str | None] = mapped_column(String(200))
    balance_after_cancel_cents: Mapped[int | None] = mapped_column(Integer)

    @property
    def reference(self) -> str:
        return f"TR-{self.id:06d}"


class TopUp(Base):
    """Money paid into an account (from a card the demo does not model); keyed by its turn, as a transfer is."""

    __tablename__ = "top_ups"
    __table_args__ = (UniqueConstraint("account_id", "idempotency_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    amount_cents: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    balance_after_cents: Mapped[int] = mapped_column(Integer)

    @property
    def reference(self) -> str:
        return f"TU-{self.id:06d}"
