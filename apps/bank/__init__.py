"""The demo core-banking system behind the shipped bank bot (`dialog/bots/bank/actions.py`).

    from decimal import Decimal
    from chatcache.apps.bank import CoreBanking

    bank = CoreBanking()  # $CHATCACHE_BANK_DB, else bank_demo.sqlite in the data directory
    bank.transfer("ada", Decimal("250"), "12345674", idempotency_key="turn-7")
"""

from .core_banking import (
    ARRIVAL_WORKING_DAYS,
    Balance,
    BankingError,
    CardInfo,
    CoreBanking,
    Receipt,
    demo_account_number,
    format_money,
)
from .database import DB_ENV, database_url
from .tables import CardStatus, CardType, TransferStatus

__all__ = [
    "ARRIVAL_WORKING_DAYS",
    "DB_ENV",
    "Balance",
    "BankingError",
    "CardInfo",
    "CardStatus",
    "CardType",
    "CoreBanking",
    "Receipt",
    "TransferStatus",
    "database_url",
    "demo_account_number",
    "format_money",
]
