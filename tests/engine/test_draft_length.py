"""A reply's draft length follows what it kept: longer while every draft is kept, as long as
what was kept after a rejection, none after a step that kept nothing, with a probe later."""

from __future__ import annotations

from chatcache.model.draft_length import GROWTH, PROBE_AFTER, DraftLength


def test_a_new_reply_drafts_a_few_tokens_first() -> None:
    """Not the limit: a first guess that is wrong costs a step fed 3 tokens, not 9."""
    assert DraftLength().next(limit=8) == GROWTH
    assert DraftLength().next(limit=1) == 1
    assert DraftLength().next(limit=0) == 0


def test_a_reply_that_keeps_every_draft_drafts_more_up_to_the_limit() -> None:
    length = DraftLength()
    length.record(drafted=2, accepted=2)
    assert length.next(limit=8) == 2 + GROWTH
    length.record(drafted=4, accepted=4)
    assert length.next(limit=8) == 4 + GROWTH
    length.record(drafted=6, accepted=6)
    assert length.next(limit=8) == 8


def test_a_rejection_drafts_as_many_as_were_kept() -> None:
    length = DraftLength()
    length.record(drafted=8, accepted=3)
    assert length.next(limit=8) == 3
    assert length.next(limit=2) == 2  # the limit may have been lowered between steps


def test_a_reply_whose_drafts_are_all_rejected_stops_drafting_then_probes_with_one_token() -> None:
    length = DraftLength()
    length.record(drafted=8, accepted=0)
    for _ in range(PROBE_AFTER):
        assert length.next(limit=8) == 0
        length.record(drafted=0, accepted=0)
    assert length.next(limit=8) == 1
    assert length.next(limit=0) == 0  # drafting turned off: no probe either
    length.record(drafted=1, accepted=0)  # the probe rejected: another wait
    assert length.next(limit=8) == 0
    for _ in range(PROBE_AFTER):
        length.record(drafted=0, accepted=0)
    length.record(drafted=1, accepted=1)  # the probe kept: it drafts again, and grows
    assert length.next(limit=8) == 1 + GROWTH


def test_a_step_with_nothing_to_draft_keeps_the_length() -> None:
    """No n-gram matched: nothing was checked, so nothing is learned of the drafts."""
    length = DraftLength()
    length.record(drafted=4, accepted=2)
    length.record(drafted=0, accepted=0)
    assert length.next(limit=8) == 2
