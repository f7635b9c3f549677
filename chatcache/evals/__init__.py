"""Evaluations on datasets: answer-cache precision (`answer_cache`), drift detection (`drift`),
intent recognition and its fallback (`intents`, on `intent_data`), and replies under load
against the uncached path (`batching`)."""
