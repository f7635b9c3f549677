"""A bot's trained intent model: trained, stored under the key of what it learned from, found, calibrated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chatcache.dialog import OUT_OF_SCOPE, BotDefinition, Intent
from chatcache.intents.trained import FamiliarityRule, calibration_examples, TrainedIntentClassifier, familiarity, find_trained, load_trained, model_key, training_examples
from chatcache.intents.training import balanced_weights, fit_temperature, split_for_calibration, train_intent_model

WORDS = {
    "lost_card": ["card lost", "lost my card", "card gone missing", "card lost again", "my card is lost", "lost card help"],
    "balance": ["balance please", "my balance", "show balance", "balance now", "what balance", "account balance"],
    "hours": ["opening hours", "hours today", "branch hours", "your hours", "hours on sunday", "what hours"],
}
NONE_OF_THESE = ["pizza recipe", "weather forecast", "football score", "pizza tonight", "weather today", "football game"]


def toy_bot(encoder: Path, **changes: object) -> BotDefinition:
    """Three intents and out-of-scope examples that a tiny encoder can tell apart by their words."""
    intents = [Intent(name=name, examples=examples) for name, examples in WORDS.items()]
    # Three held-out examples (one an intent) are too few to say how unfamiliar a toy encoder's
    # unseen phrasing may be: the familiarity threshold is set far out and tested on its own below.
    training = {
        "encoder": str(encoder), "epochs": 30, "batch_size": 8, "body_learning_rate": 1e-3, "head_learning_rate": 5e-2,
        "calibration_share": 0.2, "reject_share": 1e-4,
    }
    bot = BotDefinition(system_prompt="A bank.", intents=intents, out_of_scope_examples=NONE_OF_THESE, training=training)
    return bot.model_copy(update=changes)


@pytest.fixture(scope="module")
def trained(tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[BotDefinition, Path, Path]:
    """The toy bot's model, trained once for the module into its own data directory."""
    bot = toy_bot(tiny_encoder_dir)
    data_dir = tmp_path_factory.mktemp("data")
    return bot, data_dir, train_intent_model(training_examples(bot), bot.training, data_dir, progress=lambda line: None)


def test_the_model_is_stored_under_the_key_of_its_examples_and_settings_as_tensors_and_json(trained) -> None:  # type: ignore[no-untyped-def]
    bot, data_dir, directory = trained
    assert directory.name == model_key(training_examples(bot), bot.training)
    assert find_trained(bot, data_dir) == directory
    assert {path.name for path in directory.iterdir()} == {"encoder", "head.safetensors", "model.json"}
    assert not [path for path in directory.rglob("*") if path.suffix in (".pkl", ".pickle", ".joblib", ".bin")]
    assert not list(directory.parent.glob("*.partial"))  # no half-written model left beside it


def test_a_changed_example_or_setting_misses_the_stored_model(trained) -> None:  # type: ignore[no-untyped-def]
    bot, data_dir, _ = trained
    more = [*bot.intents[:2], bot.intents[2].model_copy(update={"examples": [*WORDS["hours"], "when are you open"]})]
    assert find_trained(bot.model_copy(update={"intents": more}), data_dir) is None
    assert find_trained(bot.model_copy(update={"training": bot.training.model_copy(update={"epochs": 41})}), data_dir) is None
    assert find_trained(bot.model_copy(update={"training": bot.training.model_copy(update={"balance_intents": True})}), data_dir) is None


def test_calibration_examples_calibrate_are_never_learned_and_key_the_model(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bot, data_dir, plain = trained
    extra = {"lost_card": ["I misplaced my card", "where did my card go"], "balance": ["how much money is there"]}
    calibrated = bot.model_copy(update={"intents": [intent.model_copy(update={"calibration_examples": extra.get(intent.name, [])}) for intent in bot.intents]})
    assert calibration_examples(calibrated) == extra
    assert find_trained(calibrated, data_dir) is None  # another temperature: another model
    directory = train_intent_model(training_examples(calibrated), calibrated.training, tmp_path, progress=lambda line: None, calibration=extra)
    assert find_trained(calibrated, tmp_path) == directory and directory.name != plain.name
    held_out = json.loads((plain / "model.json").read_text())["measured"]["held_out"]
    assert json.loads((directory / "model.json").read_text())["measured"]["held_out"] == held_out + 3
    # Learned from the same examples with the same seed: the same weights; only the calibration moved.
    assert (directory / "head.safetensors").read_bytes() == (plain / "head.safetensors").read_bytes()
    with pytest.raises(ValueError, match="calibration examples of labels the model does not learn: transfer"):
        train_intent_model(training_examples(bot), bot.training, tmp_path, progress=lambda line: None, calibration={"transfer": ["send 5"]})


def test_the_reading_settings_change_without_training_again(trained) -> None:  # type: ignore[no-untyped-def]
    bot, data_dir, directory = trained
    stricter = bot.training.model_copy(update={"reject_share": 0.4, "reject_below": 0.6})
    assert find_trained(bot.model_copy(update={"training": stricter}), data_dir) == directory
    as_trained, strict = TrainedIntentClassifier(directory), TrainedIntentClassifier(directory, reading=stricter)
    texts = [text for examples in WORDS.values() for text in examples]
    rejected = [sum(r.intent == OUT_OF_SCOPE for r in model.classify_many(texts)) for model in (as_trained, strict)]
    assert rejected[1] > rejected[0]  # the same model, asked to send more of what it learned to the fallback
    assert strict.reject_below == 0.6
    assert find_trained(bot.model_copy(update={"out_of_scope_examples": NONE_OF_THESE[:3]}), data_dir) is None


def test_the_trained_model_reads_intents_and_learns_out_of_scope(trained) -> None:  # type: ignore[no-untyped-def]
    _, _, directory = trained
    model = TrainedIntentClassifier(directory)
    assert model.classify("I lost my card").intent == "lost_card"
    assert model.classify("what is my balance").intent == "balance"
    assert model.classify("branch opening hours").intent == "hours"
    verdict = model.classify("a pizza recipe for tonight")
    assert verdict.intent == OUT_OF_SCOPE
    assert set(verdict.scores) == set(WORDS)  # "none of these" is no intent a caller may be given
    rows = model.probabilities(["card lost", "weather"])
    assert rows.shape == (2, 4) and np.allclose(rows.sum(axis=1), 1.0)


def test_one_message_reads_as_it_does_among_many(trained) -> None:  # type: ignore[no-untyped-def]
    model = TrainedIntentClassifier(trained[2])
    texts = ["I lost my card", "balance now please", "football"]
    for text, together in zip(texts, model.classify_many(texts), strict=True):
        alone = model.classify(text)
        assert alone.intent == together.intent  # padding beside longer texts changes the floats' last bits only
        assert alone.confidence == pytest.approx(together.confidence, abs=1e-4)


def test_other_weights_at_the_same_encoder_path_miss_the_stored_model(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    bot, data_dir, _ = trained
    copy = tmp_path / "encoder"
    shutil.copytree(bot.training.encoder, copy)
    moved = bot.model_copy(update={"training": bot.training.model_copy(update={"encoder": str(copy)})})
    key = model_key(training_examples(moved), moved.training)
    (weights,) = copy.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\1")  # one value changed
    assert model_key(training_examples(moved), moved.training) != key


def test_sessions_reading_on_their_own_threads_get_what_one_reader_gets(trained) -> None:  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    model = TrainedIntentClassifier(trained[2])
    texts = [text for examples in WORDS.values() for text in examples] * 4
    alone = [model.classify(text) for text in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(model.classify, texts))
    assert [r.intent for r in together] == [r.intent for r in alone]
    assert [r.confidence for r in together] == pytest.approx([r.confidence for r in alone], abs=1e-6)


def test_load_trained_finds_the_model_in_the_data_directory(trained, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """It says at start which reads the bot's intents, and without a model how to train one."""
    bot, data_dir, directory = trained
    monkeypatch.setenv("CHATCACHE_DATA_DIR", str(data_dir))
    with caplog.at_level("INFO", logger="chatcache.intents.trained"):
        model = load_trained(bot, "demo")
        assert model is not None and model.info.key == directory.name and model.info.settings == bot.training
        assert f"read by the model trained on this bot's examples ({directory.name};" in caplog.text
        monkeypatch.setenv("CHATCACHE_DATA_DIR", str(data_dir / "elsewhere"))
        assert load_trained(bot, "demo") is None
        assert "`chatcache train demo` trains a model on them" in caplog.text


def test_a_directory_without_a_whole_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no trained intent model"):
        TrainedIntentClassifier(tmp_path)


def test_a_model_stored_in_another_format_is_refused_with_what_to_do(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    older = tmp_path / "older"
    shutil.copytree(trained[2], older)
    record = json.loads((older / "model.json").read_text())
    del record["format"]  # as the first format wrote it
    (older / "model.json").write_text(json.dumps(record))
    with pytest.raises(FileNotFoundError, match="format 1, this chatcache reads 3: train it again"):
        TrainedIntentClassifier(older)


def test_training_needs_two_labels_with_examples(tiny_encoder_dir: Path, tmp_path: Path) -> None:
    bot = toy_bot(tiny_encoder_dir)
    with pytest.raises(ValueError, match="two labels or more"):
        train_intent_model({"only": ["one", "two"]}, bot.training, tmp_path)
    with pytest.raises(ValueError, match="without any: empty"):
        train_intent_model({"a": ["x", "y"], "empty": []}, bot.training, tmp_path)


def test_calibration_split_keeps_an_example_of_every_label_to_train_on() -> None:
    train, held = split_for_calibration({"a": ["1", "2", "3", "4", "5"], "b": ["6", "7"], "c": ["8"]}, 0.4, seed=0)
    assert {label: len(texts) for label, texts in held.items()} == {"a": 2, "b": 1, "c": 0}
    assert {label: len(texts) for label, texts in train.items()} == {"a": 3, "b": 1, "c": 1}
    assert sorted(train["a"] + held["a"]) == ["1", "2", "3", "4", "5"]
    assert split_for_calibration({"a": ["1", "2", "3", "4", "5"]}, 0.4, seed=0) == split_for_calibration({"a": ["1", "2", "3", "4", "5"]}, 0.4, seed=0)


def test_balanced_weights_make_every_label_weigh_the_same_and_an_example_one_on_average() -> None:
    counts = [2, 6, 40]
    weights = balanced_weights(counts).numpy()
    totals = weights * np.array(counts)
    assert np.allclose(totals, totals[0])  # a label written with 2 examples weighs as much as one with 40
    assert float(totals.sum()) == pytest.approx(sum(counts))  # the loss keeps its scale
    assert np.allclose(balanced_weights([5, 5]).numpy(), 1.0)


def test_the_fitted_temperature_recovers_the_one_the_labels_were_drawn_with() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 4.0, size=(4000, 5))
    true = 2.0
    probs = np.exp(logits / true)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(5, p=row) for row in probs])
    assert fit_temperature(logits, labels) == pytest.approx(true, rel=0.1)
    overconfident = fit_temperature(logits * 3, labels)
    assert overconfident == pytest.approx(3 * true, rel=0.1)


def test_a_calibration_share_of_nothing_is_refused_rather_than_holding_out_one_anyway() -> None:
    from pydantic import ValidationError

    from chatcache.dialog.definition import TrainingSettings

    with pytest.raises(ValidationError, match="calibration_share"):
        TrainingSettings(calibration_share=0.0)


def test_the_familiarity_rule_rejects_its_share_of_held_out_in_scope_examples_and_what_lies_beyond() -> None:
    rng = np.random.default_rng(0)
    held = rng.normal([8.0, 4.0], [1.5, 1.0], size=(2000, 2))
    rule = FamiliarityRule.fit(held)
    assert rule is not None
    threshold = rule.threshold(0.05)
    assert (~rule.familiar(held, threshold)).mean() == pytest.approx(0.05, abs=0.002)
    unseen = rng.normal([8.0, 4.0], [1.5, 1.0], size=(2000, 2))  # more of the same kind: about the same share
    assert (~rule.familiar(unseen, threshold)).mean() == pytest.approx(0.05, abs=0.02)
    unlike = rng.normal([2.0, -1.0], [1.5, 1.0], size=(200, 2))  # low logits, "none of these" likely
    assert (~rule.familiar(unlike, threshold)).mean() > 0.99
    assert (~rule.familiar(unseen, rule.threshold(0.01))).mean() == pytest.approx(0.01, abs=0.01)  # another share, no refit
    few = FamiliarityRule.fit(held[:20])  # too few to see 1 in 100: read from a normal fit, not their least familiar one
    assert few is not None and few.threshold(0.01) < min(few.scores)
    assert FamiliarityRule.fit(held[:1]) is None  # one example has no spread to measure by


def test_familiarity_signals_are_the_in_scope_log_sum_exp_and_its_log_odds_against_none_of_these() -> None:
    logits = np.array([[2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    signals = familiarity(logits, ["a", "b", OUT_OF_SCOPE])
    in_scope = np.log(np.exp(logits[:, :2]).sum(axis=1))
    assert signals[:, 0] == pytest.approx(in_scope)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert signals[:, 1] == pytest.approx(np.log(probabilities[:, :2].sum(axis=1) / probabilities[:, 2]))
    assert familiarity(logits[:, :2], ["a", "b"]) == pytest.approx(in_scope[:, None])  # no "none of these" to weigh


def test_the_stored_scores_decide_out_of_scope_whatever_the_best_intent(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    directory = trained[2]
    stored = json.loads((directory / "model.json").read_text())["familiarity"]
    assert set(stored) == {"means", "spreads", "scores"} and len(stored["means"]) == 2
    assert len(stored["scores"]) == 3 and stored["scores"] == sorted(stored["scores"])  # one held out an intent
    assert TrainedIntentClassifier(directory).classify("I lost my card").intent == "lost_card"
    unreachable = tmp_path / "unreachable"
    shutil.copytree(directory, unreachable)
    record = json.loads((unreachable / "model.json").read_text())
    record["familiarity"]["scores"] = [1e6, 1e6 + 1.0]  # held-out examples far more familiar than anything
    (unreachable / "model.json").write_text(json.dumps(record))
    verdict = TrainedIntentClassifier(unreachable).classify("I lost my card")
    assert verdict.intent == OUT_OF_SCOPE and max(verdict.scores, key=verdict.scores.__getitem__) == "lost_card"


def test_the_temperature_is_raised_until_readings_above_the_promotion_threshold_are_right_99_percent() -> None:
    from scipy.special import softmax
    from chatcache.intents.training import PROMOTION_ACCURACY, accuracy_bound, promotion_safe

    rng = np.random.default_rng(1)
    targets = rng.integers(0, 4, size=3000)
    logits = rng.normal(0.0, 1.0, size=(3000, 4))
    logits[np.arange(3000), targets] += rng.uniform(0.0, 12.0, size=3000)  # mostly right, surer the larger
    wrong = rng.choice(3000, size=150, replace=False)
    logits[wrong] = rng.normal(0.0, 1.0, size=(150, 4))
    logits[wrong, (targets[wrong] + 1) % 4] += rng.uniform(3.0, 7.0, size=150)  # wrong, and fairly sure
    labels = ["a", "b", "c", OUT_OF_SCOPE]

    def sure_accuracy(temperature: float) -> float:
        probabilities = softmax(logits / temperature, axis=1)
        sure = (probabilities.max(axis=1) > 0.95) & (probabilities.argmax(axis=1) != 3)
        return float((probabilities.argmax(axis=1)[sure] == targets[sure]).mean())

    def sure_counts(temperature: float) -> tuple[int, int]:
        probabilities = softmax(logits / temperature, axis=1)
        sure = (probabilities.max(axis=1) > 0.95) & (probabilities.argmax(axis=1) != 3)
        return int((probabilities.argmax(axis=1)[sure] == targets[sure]).sum()), int(sure.sum())

    fitted = fit_temperature(logits, targets)
    assert sure_accuracy(fitted) < PROMOTION_ACCURACY
    safe, shown = promotion_safe(logits, targets, fitted, labels)
    assert shown and safe > fitted and accuracy_bound(*sure_counts(safe)) >= PROMOTION_ACCURACY
    assert sure_accuracy(safe) > PROMOTION_ACCURACY  # the bound asks for a margin above the point itself
    assert accuracy_bound(*sure_counts(safe / 1.02)) < PROMOTION_ACCURACY  # raised no further than needed
    assert promotion_safe(logits, targets, safe, labels) == (safe, True)  # already safe: kept


def test_the_accuracy_bound_is_the_exact_one_sided_binomial_bound() -> None:
    from scipy.stats import binom
    from chatcache.intents.training import PROMOTION_ASSURANCE, accuracy_bound

    for right, count in ((230, 230), (995, 1000), (60, 61)):
        bound = accuracy_bound(right, count)
        # At the bound, `right` or more of `count` happen with probability 1 - assurance.
        assert binom.sf(right - 1, count, bound) == pytest.approx(1.0 - PROMOTION_ASSURANCE, rel=1e-6)
    assert accuracy_bound(229, 229) < 0.99 <= accuracy_bound(230, 230)  # with none wrong, 230 sure readings show 99%
    assert accuracy_bound(0, 5) == 0.0


def test_too_few_held_out_examples_keep_the_first_temperature_right_99_percent_and_say_so() -> None:
    from chatcache.intents.training import promotion_safe

    targets = np.array([0] * 100 + [1] * 100)
    logits = np.zeros((200, 2))
    logits[np.arange(200), targets] = 6.0  # all right and sure at 1: too few to show 99% by the bound
    assert promotion_safe(logits, targets, 1.0, ["a", "b"]) == (1.0, False)
    logits[0] = [0.0, 6.0]  # one sure reading wrong: 99.5% right, still kept
    assert promotion_safe(logits, targets, 1.0, ["a", "b"]) == (1.0, False)


def test_a_familiar_message_below_the_confidence_floor_is_out_of_scope(trained) -> None:  # type: ignore[no-untyped-def]
    model = TrainedIntentClassifier(trained[2])
    floor = model.reject_below
    labels = model.info.labels  # balance, hours, lost_card, out_of_scope
    torn = np.array([floor - 0.01, 0.25, 0.25, 0.51 - floor])  # the best intent just under the floor
    sure = np.array([floor + 0.01, 0.25, 0.25, 0.49 - floor])
    assert labels == ["balance", "hours", "lost_card", OUT_OF_SCOPE]
    # Private: the verdict rule alone, on probabilities no message can be made to give exactly.
    assert model._verdict(torn, familiar=True).intent == OUT_OF_SCOPE
    assert model._verdict(sure, familiar=True).intent == "balance"
    assert model._verdict(sure, familiar=False).intent == OUT_OF_SCOPE
