"""A bot's actions: Python functions its flows call, with typed slots in and a rendered reply out."""

from __future__ import annotations

import logging
from decimal import Decimal

import pytest

from chatcache.dialog import ActionContext, ActionError, Actions, BotDefinitionError, load_bot
from chatcache.dialog.actions import DEFAULT_ERROR_RESPONSE, UNEXPECTED_REASON

def test_an_action_gets_typed_slots_and_its_result_fills_the_response(write_bank_bot) -> None:  # type: ignore[no-untyped-def]
    actions = Actions.load(load_bot(write_bank_bot()))
    assert actions is not None
    who = ActionContext("acme", "alice", "s1", "s1:3")
    outcome = actions.perform("transfer_money", {"amount": "200", "to_account": "12345674"}, who)
    assert outcome.reply == "Sent 200 to 12345674, reference T-1."
    assert outcome.result == {"reference": "T-1"} and outcome.error is None
    assert outcome.arguments == {"amount": "200", "to_account": "12345674"}
    (amount, account, context), = actions["transfer"].__globals__["calls"]
    assert amount == Decimal("200") and isinstance(amount, Decimal) and account == "12345674" and context == who


def test_a_failing_action_gets_its_error_response_and_is_logged(write_bank_bot, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    actions = Actions.load(load_bot(write_bank_bot()))
    assert actions is not None
    who = ActionContext("acme", "alice", "s1", "s1:3")
    with caplog.at_level(logging.ERROR, "chatcache.actions"):
        failed = actions.perform("transfer_money", {"amount": "5", "to_account": "00000000"}, who)
    assert failed.reply == "The transfer of 5 did not go through." and failed.result is None
    assert "core banking system is down" in (failed.error or "") and "action 'transfer' failed" in caplog.text
    not_json = actions.perform("transfer_money", {"amount": "5", "to_account": "11111111"}, who)
    assert not_json.result is None and "not JSON serializable" in (not_json.error or "")


def test_actions_that_do_not_fit_the_bot_are_refused_at_load(write_bank_bot) -> None:  # type: ignore[no-untyped-def]
    missing = "from dialog import action\n"
    with pytest.raises(ActionError, match="calls action 'transfer', which the actions module does not define"):
        Actions.load(load_bot(write_bank_bot(actions=missing)))
    extra = "from dialog import action\n@action('transfer')\ndef transfer(amount, to_account, pin):\n    return {}\n"
    with pytest.raises(ActionError, match="takes 'pin', which is neither a slot"):
        Actions.load(load_bot(write_bank_bot(actions=extra)))
    broken = "import no_such_module_anywhere\n"
    with pytest.raises(ActionError, match="failed to import"):
        Actions.load(load_bot(write_bank_bot(actions=broken)))


def test_the_bot_file_names_a_missing_module_and_a_bad_response_placeholder_by_line(write_bank_bot) -> None:  # type: ignore[no-untyped-def]
    path = write_bank_bot()
    path.write_text(path.read_text().replace("actions: bank_actions.py", "actions: nowhere.py"))
    with pytest.raises(BotDefinitionError, match="bank.yaml line 2: actions: no file 'nowhere.py'"):
        load_bot(path)
    bad = write_bank_bot(replace=("reference {result.reference}", "for {customer}"))
    with pytest.raises(BotDefinitionError, match=r"line \d+: flows.transfer_money.response: placeholder '\{customer\}' is not a slot"):
        load_bot(bad)


# Why an action failed: its refusal's reason for the user, never an exception's internals.
WHO = ActionContext("acme", "alice", "s1", "s1:3")
TRANSFER = {"amount": "50", "currency": "EUR"}


def test_a_refusal_fills_reason_in_the_error_response(small_bank) -> None:  # type: ignore[no-untyped-def]
    actions = Actions.load(small_bank)
    assert actions is not None
    refused = actions.perform("transfer_money", {**TRANSFER, "to_account": "12121212"}, WHO)
    assert refused.reply == (
        "I could not make that transfer: That is your own account; a transfer goes to someone else's."
        " Shall I put you through to a person?"
    )
    assert refused.result is None and "ActionRefused" in (refused.error or "")


def test_a_refusal_goes_before_an_error_response_without_reason(small_bank) -> None:  # type: ignore[no-untyped-def]
    actions = Actions.load(small_bank)
    assert actions is not None
    refused = actions.perform("block_card", {}, WHO)
    assert refused.reply == "Your card is already blocked. Your card could not be blocked."


def test_a_refusal_without_an_error_response_gets_the_default_with_its_reason(small_bank, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "small_bank.yaml"
    path.write_text(path.read_text().replace("    error_response: Your card could not be blocked.\n", ""))
    actions = Actions.load(load_bot(path))
    assert actions is not None
    assert actions.perform("block_card", {}, WHO).reply == DEFAULT_ERROR_RESPONSE.format(reason="Your card is already blocked.")


def test_any_other_failure_gets_the_generic_reason_and_never_its_internals(small_bank, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    actions = Actions.load(small_bank)
    assert actions is not None
    with caplog.at_level(logging.ERROR, "chatcache.actions"):
        failed = actions.perform("transfer_money", {**TRANSFER, "to_account": "00000000"}, WHO)
    assert failed.reply == f"I could not make that transfer: {UNEXPECTED_REASON} Shall I put you through to a person?"
    for internal in ("10.0.0.7", "svc_bank", "password", "RuntimeError", "core banking"):
        assert internal not in failed.reply
    assert "svc_bank" in (failed.error or "") and "svc_bank" in caplog.text  # kept for the operator: in the outcome and the log


def test_a_refusal_in_an_amount_goes_before_the_flows_error_response(write_bank_bot) -> None:  # type: ignore[no-untyped-def]
    """The conftest bank bot's `error_response` has no {reason}: the refusal goes first."""
    actions = Actions.load(load_bot(write_bank_bot(actions=BANK_REFUSING)))
    assert actions is not None
    refused = actions.perform("transfer_money", {"amount": "5000", "to_account": "12345674"}, WHO)
    assert refused.reply == "Your balance of 200.00 does not cover 5000. The transfer of 5000 did not go through."


BANK_REFUSING = '''
from chatcache.dialog import ActionRefused, action

@action("transfer")
def transfer(amount, to_account):
    raise ActionRefused(f"Your balance of 200.00 does not cover {amount}.")
'''
