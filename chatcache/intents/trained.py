"""A bot's intent model as `chatcache train BOT` leaves it, found again by what it was trained on.

A trained model is a fine-tuned sentence encoder with a linear head over the bot's intents
(and `out_of_scope` when the bot gives examples of what it does not do), plus one temperature
that turns the head's logits into probabilities that mean what they say, and a familiarity
threshold under which a message is out of scope whatever its best intent (both fitted on
examples held out from training, and on the bot's calibration examples). It lives in
`<data dir>/intent_models/<key>/`, where the key hashes everything the model depends on: the
examples, the calibration examples, the base encoder and the training settings.
A bot whose examples change no longer matches its old model, so `chat`, `ask` and `serve`
never use a model that was trained on other examples; they fall back to the nearest-example
classifier and say how to train.

Files: `encoder/` (the fine-tuned sentence-transformers model, safetensors), `head.safetensors`
(the head's weight and bias) and `model.json` (the labels, the temperature, the settings and
what training measured). Nothing is unpickled: a data directory's files are read as tensors
and JSON only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file
from scipy.special import logsumexp, softmax
from scipy.stats import norm

from chatcache.dialog import OUT_OF_SCOPE, BotDefinition, IntentResult
from chatcache.dialog.definition import TrainingSettings

from ..config import default_data_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

FORMAT = 3
"""The layout of a stored model; a change makes every older key miss instead of misloading."""

READING_SETTINGS = {"reject_share", "reject_below"}
"""Training settings that only say how the trained model reads (when a message is out of
scope): they are not part of the model's key, so a bot's developer tunes them without training again."""


def familiarity(logits: np.ndarray, labels: list[str]) -> np.ndarray:
    """How much a message looks like what the model learned, a row of signals a message: the log
    of the summed exponentials of the in-scope logits (large when some intent's examples were
    like it), and, when the bot has a "none of these" class, the log-odds of any intent against
    it (the same sum less that class's logit).

    A learned "none of these" alone misses what its few examples did not cover (100 CLINC150
    queries against 150 intents), and a low best probability alone also rejects messages torn
    between two intents; the two signals together separate out-of-scope queries better than
    either (bench/README.md, "Out of scope"). Log-odds, not probabilities, since a probability
    that sits at 1.0 on every held-out example has no spread to measure an outlier by.
    `logits` are already divided by the temperature.
    """
    in_scope = [index for index, name in enumerate(labels) if name != OUT_OF_SCOPE]
    energy = np.asarray(logsumexp(logits[:, in_scope], axis=1))
    if OUT_OF_SCOPE not in labels:
        return energy.reshape(-1, 1)
    return np.stack([energy, energy - logits[:, labels.index(OUT_OF_SCOPE)]], axis=1)


@dataclass(frozen=True)
class FamiliarityRule:
    """Out of scope below a threshold on the familiarity signals, each standardised by its mean
    and spread over the held-out in-scope examples and summed; the threshold rejects a share of
    those examples (so a bot's developer sets how many of their customers' in-scope messages may
    go to the fallback, not a score with no unit). The held-out scores are kept, not one
    threshold, so that the share can change without training again (`threshold`)."""

    means: tuple[float, ...]
    spreads: tuple[float, ...]
    scores: tuple[float, ...]  # the held-out in-scope examples' standardised sums, ascending

    @classmethod
    def fit(cls, held_in_scope: np.ndarray) -> FamiliarityRule | None:
        """The rule from the familiarity signals of held-out in-scope examples; None with fewer than two."""
        if len(held_in_scope) < 2:
            return None
        means, spreads = held_in_scope.mean(axis=0), np.maximum(held_in_scope.std(axis=0), 1e-6)
        scores = np.sort(((held_in_scope - means) / spreads).sum(axis=1))
        return cls(tuple(map(float, means)), tuple(map(float, spreads)), tuple(map(float, scores)))

    def threshold(self, reject_share: float) -> float:
        """The score that rejects `reject_share` of the held-out examples: their quantile when
        there are enough of them to see that share (one in a hundred needs a hundred); fewer (a
        bot with a handful of examples an intent) would make it their least familiar one, which
        rejects much more than the share of what comes next, so it is then read from a normal
        fit of the scores."""
        scores = np.array(self.scores)
        if len(scores) * reject_share >= 1:
            return float(np.quantile(scores, reject_share))
        return float(scores.mean() + norm.ppf(reject_share) * scores.std())

    def familiar(self, signals: np.ndarray, threshold: float) -> np.ndarray:
        """One bool a row: whether the message scores at least `threshold` (`threshold`)."""
        scores = ((signals - np.array(self.means)) / np.array(self.spreads)).sum(axis=1)
        return np.asarray(scores >= threshold, dtype=bool)


def training_examples(bot: BotDefinition) -> dict[str, list[str]]:
    """The texts a bot's model learns from, by label: its intents' examples, and its
    out-of-scope examples under `out_of_scope` when it has any."""
    examples = {intent.name: list(intent.examples) for intent in bot.intents}
    if bot.out_of_scope_examples:
        examples[OUT_OF_SCOPE] = list(bot.out_of_scope_examples)
    return examples


def calibration_examples(bot: BotDefinition) -> dict[str, list[str]]:
    """The texts that only calibrate a bot's model, by label: the intents' `calibration_examples`
    (intents without any are left out)."""
    return {intent.name: list(intent.calibration_examples) for intent in bot.intents if intent.calibration_examples}


def model_key(examples: dict[str, list[str]], settings: TrainingSettings, calibration: dict[str, list[str]] | None = None) -> str:
    """A short hash of everything a trained model depends on: the examples, the calibration
    examples (they move the temperature), the settings that train it (not those that only read
    with it, `READING_SETTINGS`), and the base encoder's weights (a new version of the bundled
    package, or other files at the same path, is another encoder)."""
    trained_by = settings.model_dump(exclude=READING_SETTINGS)
    payload: dict[str, Any] = {"format": FORMAT, "examples": examples, "settings": trained_by, "encoder": encoder_identity(settings.encoder)}
    if calibration:  # absent rather than empty, so that the models of bots without any keep their keys
        payload["calibration"] = calibration
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def encoder_identity(name: str) -> dict[str, str]:
    """The SHA-256 of each weight file of an encoder on disk (the bundled one is), remembered in
    the data directory while the files are unchanged; a model id names itself."""
    from ..model.loading import embedder_source
    from ..model.weights_identity import weight_digests, weight_files

    source = Path(embedder_source(name))
    files = weight_files(source) if source.is_dir() else []
    return weight_digests(files) if files else {"name": name}


def model_dir(key: str, data_dir: Path | None = None) -> Path:
    """Where the model with this key is stored."""
    return (data_dir or default_data_dir()) / "intent_models" / key


@dataclass(frozen=True)
class TrainedModelInfo:
    """What `model.json` says of a stored model, as `chat` and `serve` report it at start."""

    key: str
    labels: list[str]
    temperature: float
    familiarity: FamiliarityRule | None
    settings: TrainingSettings
    measured: dict[str, Any]


class TrainedIntentClassifier:
    """Reads a message with a bot's trained intent model (an `IntentReader`)."""

    def __init__(self, directory: Path, device: str = "cpu", reading: TrainingSettings | None = None) -> None:
        """Load a stored model, to read as `reading`'s `READING_SETTINGS` say (default: as it was
        trained with; a bot's own settings may have changed them since).

        Raises:
            FileNotFoundError: the directory holds no complete model.
        """
        from sentence_transformers import SentenceTransformer

        record = directory / "model.json"
        if not record.is_file() or not (directory / "head.safetensors").is_file():
            raise FileNotFoundError(f"{directory}: no trained intent model there (model.json and head.safetensors)")
        meta = json.loads(record.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise FileNotFoundError(f"{directory}: a model stored in format {meta.get('format', 1)}, this chatcache reads {FORMAT}: train it again")
        self.info = TrainedModelInfo(
            key=directory.name,
            labels=list(meta["labels"]),
            temperature=float(meta["temperature"]),
            familiarity=FamiliarityRule(**meta["familiarity"]) if meta.get("familiarity") else None,
            settings=TrainingSettings.model_validate(meta["settings"]),
            measured=dict(meta.get("measured", {})),
        )
        reading = reading or self.info.settings
        self.reject_below = reading.reject_below
        rule = self.info.familiarity
        self._familiar_from = rule.threshold(reading.reject_share) if rule is not None else None
        head = load_file(str(directory / "head.safetensors"))
        self._weight, self._bias = head["weight"].to(device), head["bias"].to(device)
        self._encoder: SentenceTransformer = SentenceTransformer(str(directory / "encoder"), device=device)
        self._encoder.max_seq_length = self.info.settings.max_length
        # Sessions read their turns on their own threads; a fast tokenizer used by two threads at
        # once may refuse ("Already borrowed"), and a reading takes milliseconds: one at a time.
        self._reading = threading.Lock()

    def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
        """The verdict on one message.

        `embedding` is ignored: it comes from the engine's embedder, and this model reads the
        text with its own fine-tuned encoder.
        """
        return self.classify_many([text])[0]

    def classify_many(self, texts: list[str]) -> list[IntentResult]:
        """The verdicts on many messages, encoded in batches (what evaluations use)."""
        logits = self.scaled_logits(texts)
        rule, threshold = self.info.familiarity, self._familiar_from
        if rule is None or threshold is None:
            familiar = np.ones(len(texts), dtype=bool)
        else:
            familiar = rule.familiar(familiarity(logits, self.info.labels), threshold)
        return [self._verdict(row, known) for row, known in zip(softmax(logits, axis=1), familiar, strict=True)]

    def probabilities(self, texts: list[str]) -> np.ndarray:
        """Calibrated probabilities, one row per text, columns in `info.labels` order."""
        return np.asarray(softmax(self.scaled_logits(texts), axis=1))

    def scaled_logits(self, texts: list[str]) -> np.ndarray:
        """The head's logits divided by the calibrated temperature, one row per text."""
        with self._reading, torch.inference_mode():
            vectors = self._encoder.encode(texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)
            logits = vectors @ self._weight.T + self._bias
            return (logits / self.info.temperature).cpu().numpy().astype(np.float64)

    def _verdict(self, probabilities: np.ndarray, familiar: bool) -> IntentResult:
        """The best intent, unless "none of these" is likelier, the message is unfamiliar, or the
        best intent's confidence is below `reject_below`.

        `confidence` is the best intent's probability also when the verdict is out of scope
        (as `IntentClassifier` reports it), so a caller sees how close it came."""
        scores = {name: float(p) for name, p in zip(self.info.labels, probabilities) if name != OUT_OF_SCOPE}
        ranked = sorted(scores.values(), reverse=True)
        best = max(scores, key=scores.__getitem__)
        confidence = ranked[0]
        none_likelier = OUT_OF_SCOPE in self.info.labels and float(probabilities[self.info.labels.index(OUT_OF_SCOPE)]) > confidence
        accepted = familiar and not none_likelier and confidence >= self.reject_below
        return IntentResult(
            intent=best if accepted else OUT_OF_SCOPE,
            confidence=confidence,
            margin=confidence - (ranked[1] if len(ranked) > 1 else 0.0),
            scores=scores,
        )


def find_trained(bot: BotDefinition, data_dir: Path | None = None) -> Path | None:
    """The stored model trained on exactly this bot's examples with its training settings, if there is one."""
    directory = model_dir(model_key(training_examples(bot), bot.training, calibration_examples(bot)), data_dir)
    return directory if (directory / "model.json").is_file() else None


def load_trained(bot: BotDefinition, bot_name: str) -> TrainedIntentClassifier | None:
    """The bot's trained intent model when one matches its examples and today's settings, else
    None; either way the log says which reads the bot's intents (`chat`, `ask` and `serve` say
    so at start), and without a model how to train one."""
    directory = find_trained(bot)
    if directory is None:
        log.info("Intents: read by nearest examples; `chatcache train %s` trains a model on them (more accurate, calibrated)", bot_name)
        return None
    trained = TrainedIntentClassifier(directory, reading=bot.training)
    log.info("Intents: read by the model trained on this bot's examples (%s; held-out accuracy %s)", trained.info.key, trained.info.measured.get("accuracy"))
    return trained
