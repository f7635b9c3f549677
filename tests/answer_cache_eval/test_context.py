"""`chatcache eval context`: the same follow-up in another conversation is never served its answer."""

from __future__ import annotations

import json
from pathlib import Path

from chatcache.cli import main
from chatcache.evals.context import evaluate_context


def dialogue(name: str, *exchanges: tuple[str, str]) -> str:
    turns = [{"speaker": who, "utterance": text} for user, system in exchanges for who, text in (("USER", user), ("SYSTEM", system))]
    return json.dumps({"dialogue_id": name, "turns": turns})


def test_a_follow_up_is_served_in_its_own_conversation_only(tmp_path: Path, toy_embed, capsys) -> None:  # type: ignore[no-untyped-def]
    """Warmed: a restaurant and a flight search that both end in "that works for me". Looked up:
    a hotel search ending the same way. Keyed by context, the hotel's follow-up gets nothing
    (its own answer was never stored) and the warmed ones get their own answers back; with one
    scope for everything, as context-free caches keep it, the hotel gets a restaurant's answer."""
    data = tmp_path / "dialogues.jsonl"
    data.write_text("\n".join([
        dialogue("r", ("Find me a sushi restaurant", "Sushi Zen is open"), ("That works for me", "Booking Sushi Zen")),
        dialogue("f", ("Find me a flight to Rome", "Alitalia leaves at noon"), ("That works for me", "Booking the flight")),
        dialogue("h", ("Find me a hotel in Oslo", "The Grand has rooms"), ("That works for me", "Booking the Grand")),
        dialogue("c", ("Find me a rental car", "A Toyota is free"), ("Is it automatic?", "Yes it is")),
    ]) + "\n")  # fmt: skip
    result = evaluate_context(data, dialogues=4, embed=toy_embed)
    assert result["dialogues"] == {"warmed": 2, "looked_up": 2}
    assert result["hit_rate"] == 1.0 and result["follow_ups_replayed"] == 2
    assert result["false_hit_rate"] == 0.0 and result["repeated_follow_ups"] == 1
    without = result["without_context"]
    assert without["repeated_follow_ups_served"] == 1 and without["false_hit_rate"] == 0.5
    assert main(["eval", "context", "--data", str(data), "--dialogues", "4"]) == 0
    assert "false_hit_rate=0.0000" in capsys.readouterr().out
