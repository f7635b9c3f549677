"""How many tokens a reply drafts in its next step, following how many of its drafts were kept.

A drafted step feeds a row its last token and k drafted ones, and costs more than a plain step
by the extra positions; a rejected draft's positions are wasted. At one conversation on the
bundled model, prompt-lookup drafts of 8 tokens a step were accepted 13% of the time and made
decoding slower (bench/README.md, "Drafted decode steps"; there a step fed 3 tokens a row cost
1.3 times a plain one at one row, and one fed 9 tokens 2.3 times). So a reply drafts `GROWTH`
tokens first, then as many as it kept in its last drafted step, and two more than it was fed
while it keeps them all (as transformers' "heuristic" schedule for assisted generation grows
its drafts), up to the scheduler's limit. A reply whose last drafts were all rejected stops
drafting, and tries one drafted token again after `PROBE_AFTER` plain steps, so that a reply
that turns to quoting its prompt or a cached answer later drafts again. The aim is the issue's
bound (no turn slower by more than 10% than without drafts): a reply that never has a draft
kept pays one step fed 3 tokens, then one position more in about one step of `PROBE_AFTER + 1`.

Not done here: weighing a draft by the batch it is in (a row's longer draft pads every other
row's step), which only a measured cost per fed position could decide.
"""

from __future__ import annotations

from dataclasses import dataclass

GROWTH = 2  # tokens a reply drafts first, and adds to its drafts after a step that kept every one
PROBE_AFTER = 8  # plain steps a reply that stopped drafting takes before it drafts one token again


@dataclass
class DraftLength:
    """One reply's draft length: what it kept decides what it drafts next.

    Attributes:
        length: tokens to draft next, before the scheduler's limit.
        plain_steps: steps since the reply last had a draft checked.
    """

    length: int = GROWTH
    plain_steps: int = 0

    def next(self, limit: int) -> int:
        """Tokens to draft in the reply's next step, at most `limit` (the scheduler's `draft_tokens`)."""
        if self.length == 0:
            return min(limit, 1) if self.plain_steps >= PROBE_AFTER else 0
        return min(limit, self.length)

    def record(self, drafted: int, accepted: int) -> None:
        """Note one step of the reply: `drafted` tokens checked (none in a plain step, or when
        nothing could be drafted), of which the model kept `accepted`, in order."""
        if drafted == 0:
            self.plain_steps += 1
            return
        self.plain_steps = 0
        self.length = drafted + GROWTH if accepted == drafted else accepted
