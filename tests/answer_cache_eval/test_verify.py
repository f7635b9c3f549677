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


@pytest.mark.parametrize(
    ("query", "cached", "reason"),
    [
        # Two names traded places with no preposition before one of them; other words changed too,
        # so too few are shared for the order rule.
        (
            "After the death of Ali at the age of sixty, Omar came to power and quickly founded a new dynasty.",
            "Following the death of Omar at the age of sixty, Ali rose to power and quickly established a new dynasty.",
            "word moved",
        ),
        # The swap is in the second occurrence of a word whose first occurrence kept its role.
        (
            "The tram runs from the station to the old harbour, and from the harbour to the market.",
            "The tram runs from the station to the old harbour, and from the market to the harbour.",
            "same words, other roles",
        ),
        # One word replaced, beside a date written another way (two edits, so the span rule on all words is silent).
        (
            "On 21 June the city council replaced the old mayor of the town with his deputy.",
            "On June 21 the city council replaced the old mayor of the town with his cousin.",
            "different entity",
        ),
    ],
)
def test_near_copy_that_means_something_else_is_refused(query: str, cached: str, reason: str) -> None:
    """Near-copies look alike to the embedding whatever the edit did, so the edit is checked."""
    verdict = verify(query, cached)
    assert not verdict.ok
    assert verdict.reason.startswith(reason)


@pytest.mark.parametrize(
    ("query", "cached"),
    [
        # A date moves freely.
        ("The bridge was built in 1901 by the city.", "In 1901 the bridge was built by the city."),
        ("On 21 June the city council replaced the old mayor.", "On June 21 the city council replaced the old mayor."),
        (
            "You can get the current verbosity of the logger with logging.get_verbosity().",
            "The logger's current verbosity is returned by logging.get_verbosity().",
        ),  # a rewording, not a near-copy: its moved words are left to the embedding
        ("Can I top up my account with a bank transfer?", "Is it possible to top up my account by bank transfer?"),
    ],
)
def test_near_copy_checks_let_rewordings_through(query: str, cached: str) -> None:
    assert verify(query, cached).ok, verify(query, cached).reason
