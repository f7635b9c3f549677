"""Evaluations on datasets: answer-cache precision (`answer_cache`), drift detection (`drift`),
and replies under load against the uncached path (`batching`)."""
