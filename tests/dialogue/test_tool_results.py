"""The tool-result cache (`dialog.results`) against calling every action every time."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache.dialog import ActionContext, ActionError, Actions, action, load_bot
from chatcache.dialog.results import ToolResults

BOT = """\
system_prompt: You are a bank's assistant.
actions: {module}
intents:
  - name: transfer_money
    examples: ['Send 200 dollars to account 12345674']
    slots: [amount, to_account]
  - name: account_balance
    examples: ['What is the balance of account 12345674?']
    slots: [account]
slots:
  - name: amount
    kind: amount
  - name: to_account
    pattern: '\\b(\\d{{8}})\\b'
  - name: account
    pattern: '\\b(\\d{{8}})\\b'
flows:
  transfer_money:
    ask:
      amount: How much?
      to_account: To which account?
    confirm: Send {{amount}} to {{to_account}}?
    action: transfer
    response: Sent {{amount}} to {{to_account}}.
    error_response: The transfer did not go through.
  account_balance:
    ask:
      account: Which account?
    action: balance
    response: Account {{account}} holds {{result.balance}}.
"""

# One core-banking backend per module: a joint account 12345674 that both customers read.
ACTIONS = '''
from decimal import Decimal
from chatcache.dialog import action

balances = {{"12345674": Decimal("1000"), "87654323": Decimal("50")}}
calls = []

@action("balance"{balance})
def balance(account, context):
    calls.append(("balance", account, context.user_id))
    return {{"balance": str(balances[account])}}

@action("transfer"{transfer})
def transfer(amount, to_account, context):
    calls.append(("transfer", to_account, context.user_id))
    if to_account == "00000000":
        balances["12345674"] -= amount  # the money left before the backend failed
        raise RuntimeError("the core banking system timed out")
    balances["12345674"] -= amount
    balances[to_account] += amount
    return {{}}
'''


def _actions(tmp_path: Path, name: str, balance: str = "", transfer: str = "") -> Actions:
    (tmp_path / f"{name}.py").write_text(ACTIONS.format(balance=balance, transfer=transfer))
    bot = tmp_path / f"{name}.yaml"
    bot.write_text(BOT.format(module=f"{name}.py"))
    actions = Actions.load(load_bot(bot))
    assert actions is not None
    return actions


def _balance(actions: Actions, user: str, account: str = "12345674", tenant: str = "acme"):  # type: ignore[no-untyped-def]
    return actions.perform("account_balance", {"account": account}, ActionContext(tenant, user, "s", "k"))


def _transfer(actions: Actions, user: str, to: str, amount: str = "200"):  # type: ignore[no-untyped-def]
    return actions.perform("transfer_money", {"amount": amount, "to_account": to}, ActionContext("acme", user, "s", "k"))


def test_kept_results_answer_as_calling_every_time_would_and_transfers_invalidate_them(tmp_path: Path) -> None:
    now = [0.0]
    cached = _actions(tmp_path, "cached", balance=", cache_ttl_s=60", transfer=', invalidates=["balance"]')
    cached.results = ToolResults(clock=lambda: now[0])
    every_time = _actions(tmp_path, "every_time")
    steps = [
        lambda a: _balance(a, "alice"),
        lambda a: _balance(a, "alice"),  # kept
        lambda a: _balance(a, "bob"),  # another user: never alice's kept result
        lambda a: _balance(a, "alice", tenant="other"),  # another tenant: neither
        lambda a: _balance(a, "alice", account="87654323"),  # other arguments
        lambda a: _transfer(a, "alice", "87654323"),
        lambda a: _balance(a, "bob"),  # the joint account changed: bob's kept balance was dropped
        lambda a: _balance(a, "alice", account="87654323"),
        lambda a: _transfer(a, "bob", "00000000", amount="5"),  # failed, after moving money
        lambda a: _balance(a, "alice"),
    ]
    hits = []
    for step in steps:
        got, want = step(cached), step(every_time)
        assert (got.reply, got.result, got.error is None) == (want.reply, want.result, want.error is None)
        hits.append(got.cached)
        assert not want.cached
    assert hits == [False, True, False, False, False, False, False, False, False, False]
    assert _reads(cached) == _reads(every_time) - 1  # the one kept result spared one call
    assert _balance(cached, "alice").cached  # kept again after the last read
    now[0] += 61
    expired = _balance(cached, "alice")
    assert not expired.cached and expired.reply == "Account 12345674 holds 795."
    assert cached.results.stats.hits == 2 and cached.results.stats.invalidated > 0


def _reads(actions: Actions) -> int:
    return sum(call[0] == "balance" for call in actions["balance"].__globals__["calls"])


def test_a_failed_action_is_never_kept(tmp_path: Path) -> None:
    actions = _actions(tmp_path, "failing", balance=", cache_ttl_s=60")
    missing = _balance(actions, "alice", account="99999999")  # no such account: the action raises
    assert missing.error is not None and not missing.cached
    again = _balance(actions, "alice", account="99999999")
    assert again.error is not None and not again.cached  # it ran again


def test_an_action_that_invalidates_an_unknown_action_or_keeps_results_for_no_time_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ActionError, match="invalidates 'balanse', which the actions module does not define"):
        _actions(tmp_path, "typo", transfer=', invalidates=["balanse"]')
    with pytest.raises(ValueError, match="cache_ttl_s must be positive"):
        action("balance", cache_ttl_s=0)


def test_a_kept_result_in_a_turn_says_so_and_the_model_never_runs(make_engine, tiny_model, toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from chatcache import TokenTierConfig

    (tmp_path / "engine_actions.py").write_text(ACTIONS.format(balance=", cache_ttl_s=60", transfer=', invalidates=["balance"]'))
    bot = tmp_path / "engine_bot.yaml"
    bot.write_text(BOT.format(module="engine_actions.py"))
    engine = make_engine(
        tiny_model, bot=bot, embedder=toy_embed, store=f"sqlite:///{tmp_path}/bank.db",
        token_tier=TokenTierConfig(spill_dir=None), tenant="acme", user_id="alice",
    )  # fmt: skip
    question = "What is the balance of account 12345674?"
    first, second = engine.chat("s", question, max_new_tokens=8), engine.chat("s", question, max_new_tokens=8)
    assert first.text == second.text == "Account 12345674 holds 1000."
    assert first.action is not None and not first.action.cached
    assert second.action is not None and second.action.cached and second.stats.tier == "action"
    assert second.stats.generated_tokens == 0
    assert engine.sessions.records("s")[-1].meta["action"]["cached"] is True
    assert engine.actions is not None and engine.actions.results.stats.hits == 1
