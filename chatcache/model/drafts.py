"""Drafts that cost nothing, for speculative decoding: n-grams of the prompt, and cached answers.

A reply grounded in its prompt repeats the prompt's words, and a question the answer cache
would not serve often gets nearly an answer it holds. Either proposes the next few tokens for
free; the scheduler feeds them to the model in one forward pass and keeps the longest prefix the
model agrees with, so a greedy reply is the one plain decoding writes and a sampled one keeps its
distribution (`generation.pick`). The rule is transformers'
prompt lookup (`PromptLookupCandidateGenerator`): the longest tail n-gram of the reply so far
(prompt included), `MAX_NGRAM` tokens down to one, found at its first occurrence in a source,
proposes up to k of the tokens that follow it there. Cached answers are searched before the
prompt, an n-gram's length before the source: a longer match predicts better wherever it is.

Unlike transformers, a draft is not cut at an end-of-reply token: the scheduler picks tokens
one by one along an accepted run and stops at the first that ends the reply.

Not done here: choosing which cached answers to draft from (the turn's, from its scope), and
how many tokens to draft (`draft_length`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

MAX_NGRAM = 3  # the longest tail n-gram looked up (transformers' default is 2)
_TYPECODE = "i"  # token ids as C ints, so that `bytes.find` searches them at C speed
_ITEM = array(_TYPECODE).itemsize


def propose(context: Sequence[int], sources: Sequence[Sequence[int]], k: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to `k` tokens that may follow `context`, or none when no source has its tail n-gram.

    Args:
        context: the prompt and the reply so far; searched after `sources`, as prompt lookup.
        sources: other token sequences to draft from, searched first, in order (cached answers).
        k: the most tokens proposed.
        max_ngram: the longest tail n-gram of `context` looked up.
    """
    if k < 1:
        return []
    context_bytes = _as_bytes(context)
    haystacks = [_as_bytes(source) for source in sources] + [context_bytes]
    for size in range(min(max_ngram, len(context) - 1), 0, -1):
        key = context_bytes[-size * _ITEM :]
        for haystack in haystacks:
            start = _first_match(haystack, key)
            # Only a source's last n-gram has nothing after it, and it is then its only
            # occurrence: the context's own tail always is, so a shorter n-gram is tried.
            if start is not None and start + size < len(haystack) // _ITEM:
                return _as_ids(haystack[(start + size) * _ITEM : (start + size + k) * _ITEM])
    return []


class DraftSource:
    """What one reply is drafted from: its prompt and the reply so far, and cached answers.

    Args:
        prompt: the whole prompt the reply follows (system prompt, history, question).
        answers: cached answers' token ids, as candidate replies to this prompt.
    """

    def __init__(self, prompt: Sequence[int], answers: Sequence[Sequence[int]] = ()) -> None:
        self.context = array(_TYPECODE, prompt)
        # An answer is a whole reply: led by the prompt's last tokens (the assistant's header),
        # the reply's first tokens match its start.
        lead = list(prompt[-MAX_NGRAM:])
        self.answers = [array(_TYPECODE, lead + list(answer)) for answer in answers]

    def append(self, token_id: int) -> None:
        """Note a token of the reply."""
        self.context.append(token_id)

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens that may come next (`propose`)."""
        return propose(self.context, self.answers, k)


def _as_bytes(ids: Sequence[int]) -> bytes:
    return ids.tobytes() if isinstance(ids, array) else array(_TYPECODE, ids).tobytes()


def _as_ids(data: bytes) -> list[int]:
    return array(_TYPECODE, data).tolist()


def _first_match(haystack: bytes, key: bytes) -> int | None:
    """The first token index where `key` occurs in `haystack`; a byte match that does not start
    at a token's first byte is no match."""
    at = haystack.find(key)
    while at != -1 and at % _ITEM:
        at = haystack.find(key, at + 1)
    return None if at == -1 else at // _ITEM
