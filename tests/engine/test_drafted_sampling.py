"""Sampled replies keep their distribution when drafted: the speculative-sampling rule.

A drafted token is kept with the probability the sampler gives it, else a token is drawn from
the rest (`generation.pick`), so every token has the probability plain sampling gives it. Each
test compares draws with drafts against draws without by a chi-square test at significance
`ALPHA`, and shows it has the power to see a broken rule: keeping every drafted token gives a
distribution it rejects. Every draw is seeded, so each test gives the same verdict every run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from collections.abc import Callable, Hashable, Sequence

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare
from transformers import DynamicCache

from chatcache.config import GenerationConfig
from chatcache.model import generation
from chatcache.model.drafts import DraftSource
from chatcache.model.generation import generate_tokens, pick
from chatcache.model.scheduler import Scheduler

ALPHA = 0.01  # the significance each test rejects "same distribution" at
# The tiny model's replies at this temperature are concentrated enough for drafts to be kept often.
SAMPLED = GenerationConfig(max_new_tokens=4, temperature=0.5, top_p=0.9)


def _keep_every_draft(real: Callable[..., int]) -> Callable[..., int]:
    """A broken rule, for the tests' power: a drafted token is always kept."""

    def broken(logits: torch.Tensor, params: GenerationConfig, rng: torch.Generator | None, recent: Sequence[int] = (), draft: int | None = None) -> int:
        return draft if draft is not None else real(logits, params, rng, recent)

    return broken


def _homogeneity_p(first: Sequence[Hashable], second: Sequence[Hashable]) -> float:
    """The chi-square test's p-value that two samples come from one distribution; outcomes
    rarer than 5 in both together are pooled, as the test's approximation needs."""
    pooled = Counter([*first, *second])
    common = {outcome for outcome, count in pooled.items() if count >= 5}
    table = [[sum(1 for x in sample if x == outcome) for outcome in common] + [sum(1 for x in sample if x not in common)] for sample in (first, second)]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    return float(chi2_contingency(table).pvalue)


def _fits(picks: Counter[int], probabilities: torch.Tensor) -> bool:
    """Whether `picks` pass a chi-square goodness-of-fit test against `probabilities` at `ALPHA`."""
    support = [token for token in range(len(probabilities)) if probabilities[token] > 0]
    if set(picks) - set(support):
        return False
    observed = [picks[token] for token in support]
    expected = probabilities[support].double()
    return bool(chisquare(observed, (expected / expected.sum() * sum(observed)).tolist()).pvalue > ALPHA)


def test_a_drafted_pick_has_the_samplers_distribution() -> None:
    """On fixed logits, picks where a draft proposed the likeliest token, a rarer one, and one
    outside the top-p nucleus follow the sampler's own probabilities; keeping the draft does not."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -3.0])
    params = GenerationConfig(temperature=0.8, top_p=0.95)
    # The sampler's distribution written out: the logits are in falling order, so the nucleus is
    # the tokens before the one where the cumulative probability reaches top_p.
    probabilities = torch.softmax(logits / params.temperature, dim=-1)
    probabilities[torch.cumsum(probabilities, dim=-1) - probabilities >= params.top_p] = 0.0
    assert probabilities[5] == 0 and probabilities[3] > 0  # 5 is outside the nucleus, 3 inside
    rng = torch.Generator().manual_seed(0)
    for draft in (0, 3, 5):
        assert _fits(Counter(pick(logits, params, rng, draft=draft) for _ in range(3000)), probabilities)
    broken = _keep_every_draft(pick)
    assert not _fits(Counter(broken(logits, params, rng, draft=3) for _ in range(3000)), probabilities)


def _sampled(tiny_model, prompt: list[int], seeds: range, answer: list[int] | None) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """Each seed's sampled reply: plainly (the uncached path) without an answer, else on a
    scheduler drafting from it, all submitted at once. A row's draws do not depend on the rows
    decoded beside it (as `test_drafted_decoding`'s sampled rows reply as alone), so every draw
    is the same each run."""
    model = tiny_model.model
    if answer is None:
        return [tuple(t.token_id for t in generate_tokens(model, DynamicCache(config=model.config), prompt, replace(SAMPLED, seed=seed), set())) for seed in seeds]
    scheduler = Scheduler(model, draft_tokens=2)
    try:
        requests = [
            scheduler.submit(DynamicCache(config=model.config), prompt, replace(SAMPLED, seed=seed), set(), drafts=DraftSource(prompt, [answer]))
            for seed in seeds
        ]
        return [tuple(token.token_id for token in request) for request in requests]
    finally:
        scheduler.close()


def test_sampled_replies_drafted_from_an_answer_keep_their_distribution(tiny_model, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The tiny model's sampled replies drafted from its greedy reply (as a cached answer: at
    this temperature about a quarter of the drafted tokens are kept, so drafts are both kept and
    rejected often) go on as undrafted ones do after their first token; with every draft kept
    they do not."""
    model = tiny_model.model
    prompt = list(tiny_model.tokenizer.encode("the cat sat on the mat and the cat sat on the hat"))
    greedy = [t.token_id for t in generate_tokens(model, DynamicCache(config=model.config), prompt, GenerationConfig(max_new_tokens=8), set())]
    checked = slice(1, 3)  # the reply's second and third tokens: where drafts are checked
    plain = [reply[checked] for reply in _sampled(tiny_model, prompt, range(0, 400), answer=None)]
    drafted = [reply[checked] for reply in _sampled(tiny_model, prompt, range(1000, 1160), answer=greedy)]
    assert _homogeneity_p(plain, drafted) > ALPHA  # 0.47 at these seeds
    monkeypatch.setattr(generation, "pick", _keep_every_draft(pick))
    broken = [reply[checked] for reply in _sampled(tiny_model, prompt, range(2000, 2040), answer=greedy)]
    assert _homogeneity_p(plain, broken) < ALPHA  # 3e-16 at these seeds
