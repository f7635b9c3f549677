"""Drafts from n-grams: transformers' prompt-lookup rule, over the prompt and cached answers."""

from __future__ import annotations

import random

from chatcache.model.drafts import DraftSource, propose


def _reference(context: list[int], sources: list[list[int]], k: int, max_ngram: int) -> list[int]:
    """The rule written plainly: longest tail n-gram first, sources before the context, first occurrence."""
    for size in range(min(max_ngram, len(context) - 1), 0, -1):
        key = context[-size:]
        for source in [*sources, context]:
            starts = [i for i in range(len(source) - size + 1) if source[i : i + size] == key]
            if starts and starts[0] + size < len(source):
                return source[starts[0] + size : starts[0] + size + k]
    return []


def test_the_tail_ngram_proposes_what_followed_its_first_occurrence() -> None:
    assert propose([1, 2, 3, 4, 5, 9, 2, 3], [], k=3) == [4, 5, 9]
    assert propose([1, 2, 3, 4, 5, 9, 2, 3], [], k=10) == [4, 5, 9, 2, 3]  # up to the context's end


def test_a_longer_ngram_wins_over_an_earlier_shorter_one() -> None:
    assert propose([7, 3, 8, 5, 3, 4, 5, 3], [], k=2) == [4, 5]


def test_no_match_and_a_tail_found_only_at_itself_propose_nothing() -> None:
    assert propose([1, 2, 3], [], k=4) == []
    assert propose([5], [[5, 6]], k=4) == []  # one token of context has no n-gram before its tail
    assert propose([1, 2, 3, 1], [], k=0) == []


def test_cached_answers_are_searched_before_the_prompt() -> None:
    context = [1, 2, 10, 20, 1, 2]
    assert propose(context, [[8, 1, 2, 30, 31]], k=2) == [30, 31]
    assert propose(context, [[8, 9]], k=2) == [10, 20]


def test_a_byte_match_across_two_tokens_is_no_match() -> None:
    # 256 then 2 are the bytes 00 01 00 00 02 00 00 00: from the second byte on they read 0x02000001.
    assert propose([9, 0x02000001], [[256, 2, 5]], k=2) == []


def test_random_sequences_follow_the_rule() -> None:
    draw = random.Random(42)
    for _ in range(500):
        context = [draw.randrange(6) for _ in range(draw.randrange(1, 30))]
        sources = [[draw.randrange(6) for _ in range(draw.randrange(0, 12))] for _ in range(draw.randrange(3))]
        k, max_ngram = draw.randrange(1, 6), draw.randrange(1, 4)
        assert propose(context, sources, k, max_ngram) == _reference(context, sources, k, max_ngram)


def test_a_cached_answer_drafts_a_reply_from_its_first_token() -> None:
    """The prompt ends with the assistant's header; before any reply token the answer's start is proposed."""
    prompt = [50, 51, 52, 60, 61]  # ... <|im_start|> assistant \n
    source = DraftSource(prompt, answers=[[70, 71, 72, 73]])
    assert source.propose(3) == [70, 71, 72]
    source.append(70)
    source.append(71)
    assert source.propose(3) == [72, 73]
    source.append(99)  # the reply left the answer: the prompt is looked up instead
    assert source.propose(3) == []
