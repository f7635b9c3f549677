"""The GPTCache peer of the answer-cache evaluations serves what GPTCache serves, on the vectors given."""

from __future__ import annotations

import numpy as np

from chatcache.evals import gptcache_peer


def test_an_exact_repeat_is_served_and_an_orthogonal_question_is_not() -> None:
    vectors = {
        "how do i top up": np.array([1.0, 0.0, 0.0], dtype=np.float32),
        "where is my card": np.array([0.0, 1.0, 0.0], dtype=np.float32),
    }
    served = gptcache_peer.served_answers([("how do i top up", "top_up")], ["how do i top up", "where is my card"], vectors)
    assert served == ["top_up", None]
    assert gptcache_peer.pair_hits([("how do i top up", "where is my card")], vectors) == [False]
