"""The decoding loop: prefill the uncached tail of a prompt, then pick tokens one at a time.

Written out instead of calling `model.generate` so each token can be streamed, its entropy
measured (the answer cache refuses uncertain answers) and the loop stopped at once when the
reader stops reading. After the loop the cache holds every fed token: the prompt and all
generated tokens but the last, which was picked and never fed. A reply format's matcher, when
the reply has one, masks the logits before each pick (`next_token`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from ..config import GenerationConfig
from .format_matcher import FormatMatcher

_LN2 = math.log(2.0)
REPEAT_WINDOW = 64  # the reply's last tokens a repetition penalty looks at (llama.cpp's repeat_last_n)


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    entropy_bits: float


@dataclass(frozen=True)
class Completion:
    """An off-the-record answer: its text, mean token entropy, and whether the model ended it.

    What a runner answers a whole prompt with (an answer-cache audit, a prefetch), local
    (`ModelRunner.complete`) or remote (`RemoteRunner.answer`).
    """

    text: str
    mean_entropy_bits: float
    ended: bool


def forward(model: PreTrainedModel, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    """Feed `ids` after what `cache` holds; return the next-token logits (float32, on the CPU)."""
    with torch.no_grad():
        input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)
        output = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    logits: torch.Tensor = output.logits[0, -1]
    return logits.float().cpu()


def prefill(model: PreTrainedModel, ids: list[int], cache: DynamicCache) -> None:
    """Compute KV for `ids` into `cache`, discarding the logits."""
    forward(model, ids, cache)


def entropy_bits(logits: torch.Tensor) -> float:
    """Entropy of the distribution the logits give; tokens masked to -inf count as impossible."""
    probs = torch.softmax(logits, dim=-1)
    return float(-torch.xlogy(probs, probs).sum()) / _LN2


def masked(logits: torch.Tensor, allowed: bytes) -> torch.Tensor:
    """`logits` with every token not `allowed` (one byte per vocabulary entry, 0 for no) at -inf;
    entries past the vocabulary's end (padding rows of the output layer) too."""
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
    known = min(len(allowed), logits.shape[-1])
    keep[:known] = torch.frombuffer(bytearray(allowed[:known]), dtype=torch.uint8).bool()
    return logits.masked_fill(~keep, float("-inf"))


def next_token(
    logits: torch.Tensor,
    params: GenerationConfig,
    rng: torch.Generator | None,
    recent: deque[int],
    matcher: FormatMatcher | None,
    draft: int | None = None,
) -> GeneratedToken:
    """Pick the next token (within the reply format, if there is one) and note it in `recent`
    and the matcher; its entropy is that of the distribution it was picked from. `draft` is the
    token a draft proposes here, if any (`pick`)."""
    if matcher is not None:
        logits = masked(logits, matcher.allowed())
    token = pick(logits, params, rng, recent, draft)
    if matcher is not None:
        matcher.accept(token)
    recent.append(token)
    return GeneratedToken(token, entropy_bits(logits))


def pick(
    logits: torch.Tensor, params: GenerationConfig, rng: torch.Generator | None, recent: Sequence[int] = (), draft: int | None = None
) -> int:
    """Greedy at temperature 0; otherwise nucleus sampling at the given temperature; after
    the repetition penalty on the `recent` reply tokens, if the settings have one.

    Where a draft proposed `draft`, a sampled pick follows the speculative-sampling rule
    (Leviathan et al., 2023) for a draft that is certain (its q all on `draft`): keep `draft`
    with the probability p(draft) the sampler gives it, else draw from p without it,
    renormalised ((p - q)+). Either way a token t comes out with probability p(t): the draft
    changes how many tokens a step makes, never what is sampled. A greedy pick ignores the
    draft (the caller compares), so greedy replies are plain decoding's.
    """
    if params.repetition_penalty != 1.0 and recent:
        ids = torch.tensor(sorted(set(recent)), dtype=torch.long)
        seen = logits[ids]
        logits = logits.clone()
        logits[ids] = torch.where(seen > 0, seen / params.repetition_penalty, seen * params.repetition_penalty)
    if params.temperature == 0:
        return int(torch.argmax(logits))
    weights = _sampling_weights(logits, params)
    if draft is not None:
        # u * sum(w) < w[draft] is u < p(draft), without dividing.
        if float(torch.rand((), generator=rng)) * float(weights.sum()) < float(weights[draft]):
            return draft
        weights = weights.clone()
        weights[draft] = 0.0
    return int(torch.multinomial(weights, 1, generator=rng))


def _sampling_weights(logits: torch.Tensor, params: GenerationConfig) -> torch.Tensor:
    """What sampling draws from, up to a constant factor: the softmax at the temperature, with
    the tokens outside the top-p nucleus at zero."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return probs


def generate_tokens(
    model: PreTrainedModel,
    cache: DynamicCache,
    new_ids: list[int],
    params: GenerationConfig,
    eos_ids: set[int],
    matcher: FormatMatcher | None = None,
) -> Iterator[GeneratedToken]:
    """Yield tokens until an end-of-turn token or `max_new_tokens`; the caller may stop earlier.

    Args:
        model: the causal LM.
        cache: KV of everything before `new_ids`; extended in place.
        new_ids: the prompt tokens not yet in `cache` (at least one).
        params: decoding settings.
        eos_ids: tokens that end the reply (yielded, never fed).
        matcher: the reply format's matcher, if the reply has one.
    """
    if not new_ids:
        raise ValueError("at least one prompt token must be left to prefill")
    rng = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    recent: deque[int] = deque(maxlen=REPEAT_WINDOW)
    logits = forward(model, new_ids, cache)
    for step in range(params.max_new_tokens):
        generated = next_token(logits, params, rng, recent, matcher)
        yield generated
        if generated.token_id in eos_ids or step + 1 == params.max_new_tokens:
            return
        logits = forward(model, [generated.token_id], cache)
