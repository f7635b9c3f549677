"""`chatcache eval polarity`: questions flipped by rule, and the cache refusing every flip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatcache.cli import main
from chatcache.evals.polarity import evaluate_polarity, negated, opposite, polar_pairs


@pytest.mark.parametrize(
    ("question", "flipped"),
    [
        ("My card has not been delivered", "My card has been delivered"),
        ("I haven't received my card", "I have received my card"),
        ("I cannot log in", "I can log in"),
        ("Why was my transfer declined?", "Why wasn't my transfer declined?"),
        # Left out: another negation, a question's opening auxiliary, "can you", "how do I".
        ("Why have I not received my card?", None),
        ("I have no idea why", None),
        ("Is my card blocked?", None),
        ("Can you check my balance?", None),
        ("How do I top up?", None),
    ],
)
def test_negation_rule(question: str, flipped: str | None) -> None:
    assert negated(question) == flipped


def test_opposite_rule_keeps_the_case_and_takes_phrases_whole() -> None:
    assert opposite("How do I turn on notifications?") == "How do I turn off notifications?"
    assert opposite("Increase my limit") == "Decrease my limit"
    assert opposite("Where is my card?") is None
    assert polar_pairs(["Why was my transfer declined?"]) == [
        ("Why was my transfer declined?", "Why wasn't my transfer declined?", "negation"),
        ("Why was my transfer declined?", "Why was my transfer accepted?", "opposite"),
    ]


def test_no_flip_is_served_though_the_embeddings_match(tmp_path: Path, toy_embed, capsys) -> None:  # type: ignore[no-untyped-def]
    """With a bag-of-words embedder a flip is the question's nearest neighbour: without
    verification it is served, with it never; a plain rewording still is."""
    banking = tmp_path / "train.csv"
    banking.write_text(
        "text,category\nWhy was my transfer declined?,declined_transfer\nMy card has not been delivered,card_arrival\n"
        "How do I turn on my new card?,activate_my_card\n"
    )
    positives = tmp_path / "pairs.json"
    positives.write_text(json.dumps([{"origin": "Why was my transfer declined?", "similar": "why was my transfer declined"}]))
    result = evaluate_polarity(banking, positives, embed=toy_embed)
    assert result["pairs"] == {"opposites": 4, "paraphrases": 1}
    assert result["without_verification"]["opposites_served"] > 0
    assert result["opposites_served"] == 0 and result["served_opposites"] == []
    assert result["paraphrase_hit_rate"] == 1.0
    capsys.readouterr()
    assert main(["eval", "polarity", "--banking", str(banking), "--positives", str(positives), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"]["opposites"] == 4
