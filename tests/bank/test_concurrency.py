"""The demo bank under threads that act at once: no overdraft, no double spend, no lost money.

Two backends share one SQLite file, as two server workers would, and every thread waits at a
barrier so that the transfers really race.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from chatcache.apps.bank import BankingError, CoreBanking, Receipt
from chatcache.apps.bank.tables import Customer, Transfer

from .conftest import FakeClock

THREADS = 12
Result = TypeVar("Result")


def _race(backends: list[CoreBanking], attempt: Callable[[CoreBanking, int], Result]) -> list[Result | BaseException]:
    """Run `attempt(backend, i)` on THREADS threads released together; each one's result or exception."""
    barrier = threading.Barrier(THREADS)
    outcomes: list[Result | BaseException] = [RuntimeError("did not run")] * THREADS

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = attempt(backends[i % len(backends)], i)
        except BaseException as exc:  # noqa: BLE001 - the test reads every outcome
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcomes


def test_concurrent_transfers_never_overdraw_and_lose_no_money(bank: CoreBanking, bank_url: str) -> None:
    """12 transfers of 300.00 race for 2,500.00: exactly 8 go through and 100.00 is left."""
    bank.balance("ada")
    second = CoreBanking(bank_url)
    try:
        outcomes = _race([bank, second], lambda backend, i: backend.transfer("ada", Decimal("300"), "12345674", idempotency_key=f"turn-{i}"))
    finally:
        second.close()
    done = [o for o in outcomes if isinstance(o, Receipt)]
    refused = [o for o in outcomes if not isinstance(o, Receipt)]
    assert all(isinstance(o, BankingError) and "does not cover" in str(o) for o in refused), refused
    final = bank.balance("ada").balance_cents
    assert final >= 0 and final == 250_000 - 30_000 * len(done)
    assert len(done) == 8, "every transfer the balance covered went through"
    assert sorted(r.balance_cents for r in done) == [250_000 - 30_000 * n for n in range(8, 0, -1)], "each saw the one before it"
    with Session(bank.engine) as session:
        assert session.scalar(select(func.sum(Transfer.amount_cents))) == 250_000 - final
        assert session.scalar(select(func.count()).select_from(Transfer)) == len(done)


def test_concurrent_retries_of_one_turn_send_the_money_once(bank: CoreBanking, bank_url: str) -> None:
    bank.balance("ada")
    second = CoreBanking(bank_url)
    try:
        outcomes = _race([bank, second], lambda backend, i: backend.transfer("ada", Decimal("300"), "12345674", idempotency_key="turn-1"))
    finally:
        second.close()
    assert all(isinstance(o, Receipt) for o in outcomes), outcomes
    assert len(set(outcomes)) == 1 and bank.balance("ada").balance_cents == 220_000


def test_concurrent_retries_of_one_top_up_pay_in_once(bank: CoreBanking, bank_url: str) -> None:
    bank.balance("ada")
    second = CoreBanking(bank_url)
    try:
        outcomes = _race([bank, second], lambda backend, i: backend.top_up("ada", Decimal("300"), idempotency_key="turn-1"))
    finally:
        second.close()
    assert all(isinstance(o, Receipt) for o in outcomes), outcomes
    assert len(set(outcomes)) == 1 and bank.balance("ada").balance_cents == 280_000


def test_concurrent_retries_of_one_cancel_give_the_money_back_once(bank: CoreBanking, bank_url: str, clock: FakeClock) -> None:
    bank.transfer("ada", Decimal("100"), "12345674")
    bank.transfer("ada", Decimal("300"), "12345674")
    second = CoreBanking(bank_url, clock=clock)  # the transfers' own time, or they are too old to cancel
    try:
        outcomes = _race([bank, second], lambda backend, i: backend.cancel_transfer("ada", idempotency_key="turn-1"))
    finally:
        second.close()
    assert all(isinstance(o, Receipt) for o in outcomes), outcomes
    assert len(set(outcomes)) == 1 and bank.balance("ada").balance_cents == 240_000, "the 300.00 came back, the 100.00 did not"


def test_a_new_customer_asking_from_many_threads_is_opened_once(bank: CoreBanking) -> None:
    outcomes = _race([bank], lambda backend, i: backend.balance("ada").account)
    assert len(set(outcomes)) == 1 and isinstance(outcomes[0], str), outcomes
    with Session(bank.engine) as session:
        assert session.scalar(select(func.count()).select_from(Customer)) == 1
