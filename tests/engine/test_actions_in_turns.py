"""A flow's action in a turn: the bot's code runs instead of the model, and the turn records it."""

from __future__ import annotations

import pytest

from chatcache import TokenTierConfig
from chatcache.tiers.conversations import stored_dialogue

ASK = "Send 200 dollars to account 12345674"


@pytest.fixture
def bank(make_engine, tiny_model, toy_embed, write_bank_bot, tmp_path):  # type: ignore[no-untyped-def]
    def build():  # type: ignore[no-untyped-def]
        return make_engine(
            tiny_model, bot=write_bank_bot(), embedder=toy_embed, store=f"sqlite:///{tmp_path}/bank.db",
            token_tier=TokenTierConfig(spill_dir=None), tenant="acme", user_id="alice",
        )  # fmt: skip

    return build


def test_a_confirmed_flow_runs_its_action_and_replies_with_its_response(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank()
    asked = engine.chat("s", ASK, max_new_tokens=8)
    assert asked.dialogue_state == "CONFIRMING" and asked.action is None
    done = engine.chat("s", "yes, do it", max_new_tokens=8)
    assert done.text == "Sent 200 to 12345674, reference T-1."
    assert done.stats.tier == "action" and done.stats.generated_tokens == 0  # the model did not run
    assert done.action is not None and done.action.result == {"reference": "T-1"}
    assert done.dialogue_state == "DONE"
    calls = engine.actions["transfer"].__globals__["calls"]
    (_, _, context), = calls
    assert (context.tenant, context.user_id, context.session_id) == ("acme", "alice", "s")
    stored = engine.sessions.records("s")[-1]
    assert stored.content == done.text and stored.meta["action"]["result"] == {"reference": "T-1"}
    dialogue = stored_dialogue("s", engine.sessions.get("s").state)
    assert dialogue is not None and dialogue.state == "DONE"


def test_a_failing_action_ends_the_flow_with_its_error_response(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank()
    engine.chat("s", "Send 5 dollars to account 00000000", max_new_tokens=8)
    failed = engine.chat("s", "yes", max_new_tokens=8)
    assert failed.text == "The transfer of 5 did not go through."
    assert failed.action is not None and failed.action.result is None and "down" in (failed.action.error or "")
    assert failed.dialogue_state == "DONE"
    again = engine.chat("s", ASK, max_new_tokens=8)  # the bot goes on: a new flow starts
    assert again.dialogue_state == "CONFIRMING"
