"""How the evaluations score what a run served: intervals, out-of-scope questions, label noise,
and the point certified on calibration pairs."""

from __future__ import annotations

import pytest

from chatcache.answer_cache.bound import min_evidence
from chatcache.answer_cache.decision import PATH
from chatcache.evals.answer_cache_scores import LabelNoise, PairTrial, certified_pair_point, pair_rank, score_served

STORED = [
    ("Can you tell me the status of my card?", "card_arrival"),
    ("I lost my card yesterday", "lost_card"),
    ("what are the fees for a transfer", "transfer_fee"),
]


def test_the_label_noise_rule_flags_a_contradiction_and_not_a_real_error() -> None:
    noise = LabelNoise(STORED)
    # the training file files this very question (once normalised) under the answer served
    assert noise.explains("can you tell me the status of my card", "card_arrival")
    # a near-copy (word ratio >= 0.9) that verification lets through counts too
    assert noise.explains("Can you tell me the status of my card please?", "card_arrival")
    # a question that only resembles one labelled with the answer served is a real error
    assert not noise.explains("what is the status of my new card", "card_arrival")
    # the same text under another answer is no excuse for serving that one
    assert not noise.explains("I lost my card yesterday", "card_arrival")
    # a near-copy that verification refuses (another number) is a real error
    noise = LabelNoise([("why was i charged 5 dollars for my transfer today", "transfer_fee")])
    assert not noise.explains("why was i charged 6 dollars for my transfer today", "transfer_fee")


def test_scores_count_out_of_scope_questions_served_as_wrong_and_list_them() -> None:
    test = [("I lost my card yesterday", "card_arrival"), ("play some jazz", "oos"), ("hi", "oos"), ("fees?", "transfer_fee")]
    served = ["lost_card", "lost_card", None, "transfer_fee"]
    result = score_served(served, test, "oos", LabelNoise(STORED), 0.95, via=["I lost my card yesterday", "x", None, "y"], list_wrong=True)
    assert (result["hits"], result["wrong"], result["oos_questions"], result["oos_served"]) == (3, 2, 2, 1)
    assert result["error_rate"] == pytest.approx(2 / 3, abs=1e-5)
    # the first is a training question labelled otherwise there: noise; the second is not
    assert result["label_noise"] == 1 and result["error_rate_without_noise"] == pytest.approx(1 / 3, abs=1e-5)
    assert [w["question"] for w in result["wrong_answers"]] == ["I lost my card yesterday", "play some jazz"]
    assert result["wrong_answers"][0]["via"] == "I lost my card yesterday"


def test_the_interval_is_two_sided_exact_and_holds_the_estimate() -> None:
    """23 wrong of 2,245 served: 1.02%, between 0.65% and 1.53% (Clopper-Pearson, 95%)."""
    test = [(f"q{i}", "a") for i in range(3000)]
    served: list[str | None] = ["b"] * 23 + ["a"] * 2222 + [None] * 755
    result = score_served(served, test, "oos", LabelNoise([]), 0.95)
    low, high = result["error_interval"]
    assert result["error_rate"] == pytest.approx(0.01024, abs=1e-5)
    assert low == pytest.approx(0.0065, abs=5e-5) and high == pytest.approx(0.0153, abs=5e-5)
    assert result["hit_rate"] == pytest.approx(2245 / 3000, abs=1e-4)


def test_a_pair_is_ranked_by_the_first_threshold_it_clears_when_verification_passes() -> None:
    assert pair_rank("the cat sat", "The cat sat.", 0.2, verify_on=True) == 0  # an exact repeat
    assert pair_rank("flights from boston to denver", "flights from denver to boston", 0.99, verify_on=True) is None
    assert pair_rank("flights from boston to denver", "flights from denver to boston", 0.99, verify_on=False) == 0
    rank = pair_rank("how do i reset my password", "how can i reset my password", 0.8, verify_on=True)
    assert rank is not None and PATH[rank].threshold <= 0.8 < PATH[rank - 1].threshold
    assert pair_rank("a b c", "d e f", 0.1, verify_on=True) is None


def test_the_pair_point_stops_at_the_first_step_that_fails_either_risk() -> None:
    rate, confidence = 0.05, 0.9
    enough = 2 * min_evidence(rate, confidence)
    positives = [PairTrial(True, 0)] * enough
    negatives = [PairTrial(False, None)] * enough
    loose_negatives = [PairTrial(False, 20)] * (enough // 5)  # served from step 20 on
    late_positives = [PairTrial(True, 30)] * (100 * enough)  # later steps would dilute the error again
    chosen = certified_pair_point(positives + loose_negatives + late_positives + negatives, rate, confidence)
    assert chosen["step"] == 19 and chosen["false_hits"] == 0 and chosen["negatives"] == enough + enough // 5
    assert chosen["point"]["threshold"] == PATH[19].threshold
    # too few negatives to bound their share: nothing is certified, however clean the served
    assert certified_pair_point(positives + [PairTrial(False, None)] * 10, rate, confidence)["step"] is None
    # steps serving too little are passed over, not the end
    chosen = certified_pair_point([PairTrial(True, 10)] * enough + negatives, rate, confidence)
    assert chosen["step"] == len(PATH) - 1 and chosen["served"] == enough
