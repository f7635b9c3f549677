"""The cache panel: how the last turn was served, the dialogue state, memory, and TTFT per turn.

Every line fits the panel's 26 columns at 80x24 (a wrapped figure reads as two), and a legend
at the end says what the tiers and figures mean.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Sparkline, Static

from chatcache import TokenTierStats
from chatcache.answer_cache import BoundStatus

from ..turns import TurnRecord

DRIFT_EVENT = "topic changed"


# The tier table's lines fit 26 columns; the prose around it wraps to the panel's width.
LEGEND = "\n".join(
    [
        "tier: where the prompt's KV (the model's context) came from:",
        "session kept in memory",
        "disk    spilled, restored",
        "prefix  only system prompt",
        "none    computed in full",
        "answer  cached answer",
        "dialog  asked by the flow",
        "",
        "reused: prompt tokens taken from the KV. prefilled: computed this turn. "
        "TTFT: time to the first token. hit rate: turns of this run served by the answer cache. "
        "topic changed: the turns before it left the prompt.",
    ]
)


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def served_by(turn: TurnRecord) -> str:
    """Who wrote the reply: a flow's question or a cached answer is not the model's."""
    if turn.answer_cache_hit:
        return "answer cache"
    return "bot's flow" if turn.tier == "dialog" else "model"


def describe_turn(turn: TurnRecord | None, number: int) -> str:
    if turn is None:
        return "no turn yet"

    def tokens(n: int | None) -> str:
        return "-" if n is None else f"{n} tok"

    # Drafted tokens only where the turn drafted: drafting is off by default.
    drafted = [f"drafted   {turn.accepted_tokens}/{turn.drafted_tokens} kept"] if turn.drafted_tokens else []
    return "\n".join(
        [
            f"turn      {number}",
            f"served by {served_by(turn)}",
            f"tier      {turn.tier}",
            f"reused    {tokens(turn.reused_tokens)}",
            f"prefilled {tokens(turn.prefilled_tokens)}",
            *drafted,
            f"TTFT      {turn.ttft_s * 1000:.0f} ms",
            f"finish    {turn.finish_reason or '-'}",
        ]
    )


def describe_dialogue(turn: TurnRecord | None, drift_turns: list[int]) -> str:
    state = (turn.dialogue_state if turn is not None else None) or "-"
    lines = [f"state     {state}", f"intent    {(turn.intent if turn is not None else None) or '-'}"]
    if turn is not None and turn.intent and turn.confidence is not None:
        lines.append(f"          confidence {turn.confidence:.2f}")
    lines += [f"turn {n}: {DRIFT_EVENT}" for n in drift_turns[-3:]]
    return "\n".join(lines)


def describe_bound(bound: BoundStatus | None) -> list[str]:
    """The answer cache's error bound, whether any scope may serve by meaning under it, and what
    the audits (every replica's) measured; nothing when no bound is set."""
    if bound is None or bound.max_error_rate is None:
        return []
    lines = [f"wrong     ≤ {percent(bound.max_error_rate)}, {round(bound.confidence * 100, 1):g}% sure"]
    lines.append(f"scopes    {bound.scopes_by_meaning} by meaning" if bound.scopes_by_meaning else "exact repeats only")
    if bound.estimate is None:
        return [*lines, "audits    none yet"]
    low, high = bound.interval
    return [
        *lines,
        f"audits    {bound.audit_errors}/{bound.audits} wrong",
        f"          {percent(bound.estimate)} [{percent(low)[:-1]}–{percent(high)}]",
    ]


def percent(share: float) -> str:
    """A share as a percentage with one decimal below 10% (where a bound lives), whole above, so
    "100% [2.5–100%]" still fits a line."""
    return f"{share:.1%}" if share < 0.1 else f"{share:.0%}"


def describe_memory(kv: TokenTierStats, answered: int, answer_hits: int, bound: BoundStatus | None) -> str:
    rate = f"{answer_hits / answered:.0%} ({answer_hits}/{answered})" if answered else "- (no turn yet)"
    return "\n".join(
        [
            f"KV        {size(kv.resident_bytes)} / {size(kv.budget_bytes)}",
            f"sessions  {kv.sessions_in_memory} in memory",
            f"spills    {kv.spills}  restores {kv.restores}",
            f"hit rate  {rate}",
            *describe_bound(bound),
        ]
    )


class CachePanel(VerticalScroll):
    """Read-only figures; the app calls `show_turns` and `show_memory` as things change."""

    def compose(self) -> ComposeResult:
        yield Label("Last turn", classes="heading")
        yield Static(describe_turn(None, 0), id="turn-stats", markup=False)
        yield Label("Dialogue", classes="heading")
        yield Static(describe_dialogue(None, []), id="dialogue", markup=False)
        yield Label("Memory", classes="heading")
        yield Static("", id="memory", markup=False)
        yield Label("TTFT per turn", classes="heading")
        yield Sparkline([], id="ttft")
        yield Label("Legend", classes="heading")
        yield Static(LEGEND, id="legend", classes="legend", markup=False)

    def show_turns(self, turns: list[TurnRecord]) -> None:
        """The session's turns, oldest first: the last one in detail, all of them in the sparkline."""
        last = turns[-1] if turns else None
        drift_turns = [i for i, t in enumerate(turns, 1) if t.drift]
        self.query_one("#turn-stats", Static).update(describe_turn(last, len(turns)))
        self.query_one("#dialogue", Static).update(describe_dialogue(last, drift_turns))
        self.query_one("#ttft", Sparkline).data = [t.ttft_s * 1000 for t in turns]

    def show_memory(self, kv: TokenTierStats, answered: int, answer_hits: int, bound: BoundStatus | None) -> None:
        self.query_one("#memory", Static).update(describe_memory(kv, answered, answer_hits, bound))
