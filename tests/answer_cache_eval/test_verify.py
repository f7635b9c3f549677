"""Each verification rule refuses the case it targets and lets a true rewording through."""

from __future__ import annotations

import pytest

from chatcache.answer_cache import verify


@pytest.mark.parametrize(
    ("query", "cached", "reason"),
    [
        ("Can I send 50 dollars abroad?", "Can I send 500 dollars abroad?", "numbers differ"),
        ("Is this card safe to use abroad?", "Is this card not safe to use abroad?", "negation differs"),
        ("Is John older than Mary?", "Is Mary older than John?", "same words, other roles"),
        ("cheap flights from Boston to Denver in May", "cheap flights from Denver to Boston", "same words, other roles"),
        ("What is the function of TV?", "What is the function of money?", "different entity"),
        ("How do I turn off my new card?", "How do I turn on my new card?", "different entity"),
        ("The app isn't letting me log out.", "The app isn't letting me log in.", "different entity"),
        ("why didn't i only get 20.00", "why did i only get 20.00", "negation differs"),  # no content words at all
        (
            "I was charged twice for one meal. How do I get it back? I do eat out much.",
            "I was charged twice for one meal. How do I get it back? I do not eat out much.",
            "negation differs",  # both negate somewhere, one more often
        ),
    ],
)
def test_rule_refuses_its_case(query: str, cached: str, reason: str) -> None:
    verdict = verify(query, cached)
    assert not verdict.ok
    assert verdict.reason.startswith(reason)


@pytest.mark.parametrize(
    ("query", "cached"),
    [
        ("Can I send 50 dollars abroad?", "Is it possible to send 50 dollars abroad?"),  # same number
        ("I still haven't received my new card.", "My new card never arrived, where is it?"),  # negation, other words
        ("Is John older than Mary?", "John, is he older than Mary?"),  # same words, same order
        ("How long are deliveries to the US?", "How long is delivery to the US?"),  # forms of one word
        ("Gradio builds machine learning demos in Python.", "With Gradio you build ML demos using Python code."),
    ],
)
def test_true_rewording_passes(query: str, cached: str) -> None:
    assert verify(query, cached).ok, verify(query, cached).reason


def test_role_swap_needs_prepositions_on_both_words() -> None:
    """Words that changed prepositions pass unless they traded them; few shared words, so the order rule is silent."""
    assert verify(
        "In winter, are there cheap direct flights from Boston to the coast?",
        "Any low fares for flights from Boston to the coast during winter?",
    ).ok
    refused = verify("trains from paris to lyon, the cheapest ones please", "which trains go from lyon to paris tomorrow morning")
    assert not refused.ok and "swapped" in refused.reason
