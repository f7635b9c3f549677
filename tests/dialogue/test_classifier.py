"""The intent classifier on a toy embedder: scores, confidence, fallback and its knobs."""

from __future__ import annotations

import numpy as np
import pytest

from chatcache.dialog import OUT_OF_SCOPE, IntentClassifier


def test_example_like_text_gets_its_intent(bot, embed) -> None:
    result = IntentClassifier(bot, embed).classify("I lost my credit card")
    assert result.intent == "report_lost_card"
    assert 0.5 < result.confidence <= 1.0
    assert set(result.scores) == {i.name for i in bot.intents}
    ranked = sorted(result.scores.values(), reverse=True)
    assert result.margin == pytest.approx(ranked[0] - ranked[1])


def test_unrelated_text_is_out_of_scope(bot, embed) -> None:
    result = IntentClassifier(bot, embed).classify("quantum chromodynamics lecture")
    assert result.intent == OUT_OF_SCOPE
    assert result.confidence < 0.5


def test_thresholds_are_configurable(bot, embed) -> None:
    text = "what are your hours"
    assert IntentClassifier(bot, embed, threshold=0.0).classify(text).intent == "opening_hours"
    assert IntentClassifier(bot, embed, threshold=1.0).classify(text).intent == OUT_OF_SCOPE
    assert IntentClassifier(bot, embed, threshold=0.0, margin=0.99).classify(text).intent == OUT_OF_SCOPE


def test_lower_reject_score_raises_confidence(bot, embed) -> None:
    text = "what are your hours"
    strict = IntentClassifier(bot, embed, reject_score=0.9).classify(text)
    lenient = IntentClassifier(bot, embed, reject_score=0.0).classify(text)
    assert lenient.confidence > strict.confidence


def test_bad_settings_fail_at_construction(bot, embed) -> None:
    with pytest.raises(ValueError, match="threshold"):
        IntentClassifier(bot, embed, threshold=1.5)
    with pytest.raises(ValueError, match="temperature"):
        IntentClassifier(bot, embed, temperature=0.0)
    with pytest.raises(ValueError, match="rows"):
        IntentClassifier(bot, lambda texts: np.zeros((1, 4)))


def test_a_given_embedding_is_used_instead_of_embedding_again(bot, embed) -> None:  # type: ignore[no-untyped-def]
    calls: list[list[str]] = []

    def counting(texts: list[str]):  # type: ignore[no-untyped-def]
        calls.append(texts)
        return embed(texts)

    classifier = IntentClassifier(bot, counting)
    text = "I want to send money to my friend"
    expected = classifier.classify(text)
    calls.clear()
    assert classifier.classify(text, embed([text])[0]) == expected
    assert calls == []


def test_prototypes_are_the_unit_mean_of_each_intents_examples(bot, embed) -> None:  # type: ignore[no-untyped-def]
    prototypes = IntentClassifier(bot, embed).prototypes()
    assert set(prototypes) == {i.name for i in bot.intents}
    for intent in bot.intents:
        mean = np.asarray(embed(list(intent.examples)), dtype=np.float64).mean(axis=0)
        np.testing.assert_allclose(prototypes[intent.name], mean / np.linalg.norm(mean), atol=1e-6)
