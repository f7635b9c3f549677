"""`bench.drafted_decode`, which fills `bench.model_answered`'s draft keys: on the tiny model, the
same turns answered plain and drafted at N = 1 and N = 8 give numbers for every key, and the
scheduler drafts afterwards exactly as it did before."""

from __future__ import annotations

from bench.drafted_decode import Turn, compare, drafting

TURNS = [
    Turn((), "How do I report a lost card?"),
    Turn((("How do I report a lost card?", "Call us and we block the card at once."),), "Is there a fee for that?"),
]


def test_plain_and_drafted_answers_of_the_same_turns_give_every_draft_key(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt="Lost cards are blocked at once. A new card costs nothing.")
    before = tiny_model.scheduler.draft_tokens
    with engine:
        one = compare(engine, tiny_model, TURNS, at_once=1, draft_tokens=4, max_new_tokens=8)
        eight = compare(engine, tiny_model, TURNS * 4, at_once=8, draft_tokens=4, max_new_tokens=8)
    assert tiny_model.scheduler.draft_tokens == before
    assert (one["turns"], one["runs"], eight["turns"], eight["runs"]) == (2, 2, 8, 1)
    for result in (one, eight):
        assert isinstance(result["speedup"], float) and result["speedup"] > 0
        assert 0.0 <= result["identical_share"] <= 1.0
        # The tiny random model's replies may quote no n-gram of their prompt: drafted tokens may be none.
        assert 0 <= result["accepted_tokens"] <= result["drafted_tokens"]
        assert result["accepted_share"] is None or 0.0 <= result["accepted_share"] <= 1.0
    assert one["identical_share"] == 1.0  # one at a time, greedy drafted decoding is plain decoding


def test_drafting_is_switched_back_when_the_block_fails(tiny_model) -> None:  # type: ignore[no-untyped-def]
    before = tiny_model.scheduler.draft_tokens
    try:
        with drafting(tiny_model, 5):
            assert tiny_model.scheduler.draft_tokens == 5
            raise RuntimeError
    except RuntimeError:
        pass
    assert tiny_model.scheduler.draft_tokens == before
