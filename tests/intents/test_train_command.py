"""`chatcache train BOT` and the engine that then reads the bot's intents with what it trained."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from chatcache.cli import main

BOT = """\
system_prompt: A bank's assistant.
intents:
  - name: lost_card
    examples: [card lost, lost my card, card gone missing, my card is lost, lost card help, card lost again]
  - name: balance
    examples: [balance please, my balance, show balance, balance now, what balance, account balance]
out_of_scope_examples: [pizza recipe, weather forecast, football score, weather today]
training: {{encoder: "{encoder}", epochs: 20, batch_size: 8, body_learning_rate: 0.001, head_learning_rate: 0.05}}
"""


@pytest.fixture
def bot_file(tmp_path: Path, tiny_encoder_dir: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(BOT.format(encoder=tiny_encoder_dir))
    return path


def test_train_stores_the_model_once_and_says_so(bot_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(bot_file)]) == 0
    out = capsys.readouterr()
    assert "Trained:" in out.out and "training on" in out.err
    trained = list((Path(__import__("os").environ["CHATCACHE_DATA_DIR"]) / "intent_models").iterdir())
    assert len(trained) == 1 and (trained[0] / "model.json").is_file()
    assert main(["train", str(bot_file)]) == 0
    assert "is stored" in capsys.readouterr().out
    assert main(["train", str(bot_file), "--force"]) == 0
    assert "Trained:" in capsys.readouterr().out


def test_train_refuses_a_bot_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "no bot" in capsys.readouterr().err


def test_the_engine_reads_intents_with_the_trained_model_only_when_it_matches(  # type: ignore[no-untyped-def]
    bot_file: Path, tiny_model, toy_embed, make_engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="chatcache.intents.trained"):
        before = make_engine(tiny_model, bot=bot_file, embedder=toy_embed, drift=False)
    assert before.trained_intents is None
    assert "chatcache train toy" in caplog.text
    before.close()
    assert main(["train", str(bot_file)]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chatcache.intents.trained"):
        after = make_engine(tiny_model, bot=bot_file, embedder=toy_embed, drift=False)
    assert after.trained_intents is not None
    assert "trained on this bot's examples" in caplog.text
    reply = after.chat("s1", "I lost my card")
    assert reply.intent == "lost_card"
    after.close()
    bot_file.write_text(bot_file.read_text().replace("card lost again", "my card went missing"))
    changed = make_engine(tiny_model, bot=bot_file, embedder=toy_embed, drift=False)
    assert changed.trained_intents is None  # trained on other examples: not used
    changed.close()


def test_eval_intents_measures_the_trained_model_with_its_reliability(bot_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from chatcache.evals.intents import main as eval_intents

    rows = tmp_path / "test.csv"
    rows.write_text("text,category\nmy card is lost now,lost_card\nbalance today,balance\nweather forecast tomorrow,out_of_scope\n")
    plot = tmp_path / "reliability.png"
    assert eval_intents(["--bot", str(bot_file), "--test", str(rows), "--trained", "--plot", str(plot), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["classifier"]["trained"] and report["out_of_scope_examples"] == 4
    assert report["in_scope"] == 2 and report["out_of_scope"] == 1
    assert sum(row["rows"] for row in report["reliability"]) == 2  # every in-scope row in one bin
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert eval_intents(["--bot", str(bot_file), "--test", str(rows), "--epochs", "2"]) == 2
    assert "needs --trained" in capsys.readouterr().err
