"""The customers of `bench.model_answered`: the same visits for the same seed, intents asked with
Zipf popularity, questions asked again in other words, and customers who come back."""

from __future__ import annotations

from collections import Counter

from bench.model_answered import FOLLOW_UPS, MAX_QUESTIONS, Question, Visit, repeated_prompts, workload

POOL = {f"intent_{n:02d}": [f"question {n} worded {w}" for w in range(5)] for n in range(20)}


def asked_intents(zipf: float) -> list[int]:
    """How often each intent was asked as a question of its own, most asked first."""
    visits = workload(POOL, 4000, seed=7, zipf=zipf)
    counts = Counter(q.intent for v in visits for q in v.questions if q.kind == "new")
    return sorted(counts.values(), reverse=True)


def test_the_same_seed_gives_the_same_customers_and_another_seed_others() -> None:
    assert workload(POOL, 300, seed=3) == workload(POOL, 300, seed=3)
    assert workload(POOL, 300, seed=3) != workload(POOL, 300, seed=4)


def test_intents_are_asked_with_zipf_popularity() -> None:
    """Rank r gets about 1 / (r * H) of the questions (H the harmonic number of 20 intents);
    with exponent 0 every intent is about as popular as any other."""
    counts = asked_intents(zipf=1.0)
    harmonic = sum(1 / r for r in range(1, 21))
    shares = [c / sum(counts) for c in counts]
    for rank in range(1, 6):
        assert abs(shares[rank - 1] - 1 / (rank * harmonic)) < 0.025, (rank, shares[rank - 1])
    flat = asked_intents(zipf=0.0)
    assert max(flat) / sum(flat) < 0.08 and min(flat) / sum(flat) > 0.02


def test_customers_come_back_to_their_own_session_once() -> None:
    visits = workload(POOL, 400, seed=1, returning_share=0.25)
    seen: set[str] = set()
    returned: set[str] = set()
    for visit in visits:
        if visit.returning:
            assert visit.session_id in seen and visit.session_id not in returned  # an earlier customer, back once
            returned.add(visit.session_id)
        else:
            assert visit.session_id not in seen  # a new customer gets a new session
            seen.add(visit.session_id)
    assert 0.18 < len(returned) / len(visits) < 0.3
    assert not any(v.returning for v in workload(POOL, 100, seed=1, returning_share=0.0))


def test_a_visit_asks_again_in_other_words_and_follows_up() -> None:
    visits = workload(POOL, 500, seed=2)
    kinds = Counter(q.kind for v in visits for q in v.questions)
    assert kinds["reworded"] > 30 and kinds["follow_up"] > 30
    for visit in visits:
        assert 1 <= len(visit.questions) <= MAX_QUESTIONS and visit.questions[0].kind == "new"
        for previous, question in zip(visit.questions, visit.questions[1:]):
            if question.kind == "reworded":
                assert question.intent == previous.intent and question.text != previous.text
                assert question.text in POOL[question.intent]
            elif question.kind == "follow_up":
                assert question.text in FOLLOW_UPS


def test_a_prompt_repeats_only_with_the_same_questions_before_it_in_its_session() -> None:
    def visit(session: str, *texts: str, returning: bool = False) -> Visit:
        return Visit(session, tuple(Question("i", t, "new") for t in texts), returning)

    visits = [
        visit("a", "lost card", "fee?"),
        visit("b", "lost card", "fee?"),  # both prompts are a's again
        visit("c", "fee?"),  # the same words after other questions (none): another prompt
        visit("d", "lost card", "when?"),  # its first prompt repeats, its second is new
        visit("a", "fee?", returning=True),  # after a's earlier questions: new
    ]
    assert repeated_prompts(visits) == 3
    assert repeated_prompts(workload(POOL, 300, seed=0)) > 0  # 100 wordings: first questions come again
