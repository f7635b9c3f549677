"""Bot files may not use YAML aliases: a "billion laughs" file is refused at once, naming its line."""

from __future__ import annotations

import time

import pytest

from chatcache.dialog import BotDefinitionError, parse_bot


def laughs(levels: int) -> str:
    """A bot file whose examples expand to 9**levels strings through nested aliases."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nsystem_prompt: hi\nintents:\n  - name: x\n    examples: *l{levels - 1}\n"


def test_a_billion_laughs_bot_file_is_refused_in_well_under_a_second() -> None:
    # 9**8 = 43 million strings: expanding them took about 26 s to fail before aliases were refused.
    text = laughs(8)
    started = time.perf_counter()
    with pytest.raises(BotDefinitionError) as caught:
        parse_bot(text, source="bomb.yaml")
    elapsed = time.perf_counter() - started
    assert caught.value.problems == [
        "bomb.yaml line 2: YAML alias *l0 is not allowed in a bot file; write the value out in full"
    ]
    assert elapsed < 0.5


def test_even_one_alias_is_refused_and_the_same_file_written_out_loads() -> None:
    aliased = "system_prompt: hi\nexamples: &ex [hello, hi]\nintents:\n  - name: greet\n    examples: *ex\n"
    with pytest.raises(BotDefinitionError, match="line 5: YAML alias \\*ex"):
        parse_bot(aliased)
    written_out = "system_prompt: hi\nintents:\n  - name: greet\n    examples: [hello, hi]\n"
    assert parse_bot(written_out).intents[0].examples == ["hello", "hi"]


def test_a_merge_key_is_an_alias_too() -> None:
    text = "base: &base {description: d}\nsystem_prompt: hi\nintents:\n  - <<: *base\n    name: x\n    examples: [a]\n"
    with pytest.raises(BotDefinitionError, match="line 4: YAML alias \\*base"):
        parse_bot(text)
