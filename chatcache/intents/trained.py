"""A bot's intent model as `chatcache train BOT` leaves it, found again by what it was trained on.

A trained model is a fine-tuned sentence encoder with a linear head over the bot's intents
(and `out_of_scope` when the bot gives examples of what it does not do), plus one temperature
that turns the head's logits into probabilities that mean what they say (fitted on examples
held out from training). It lives in `<data dir>/intent_models/<key>/`, where the key hashes
everything the model depends on: the examples, the base encoder and the training settings.
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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file

from dialog import OUT_OF_SCOPE, BotDefinition, IntentResult
from dialog.definition import TrainingSettings

from ..config import default_data_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

FORMAT = 1
"""The layout of a stored model; a change makes every older key miss instead of misloading."""


def training_examples(bot: BotDefinition) -> dict[str, list[str]]:
    """The texts a bot's model learns from, by label: its intents' examples, and its
    out-of-scope examples under `out_of_scope` when it has any."""
    examples = {intent.name: list(intent.examples) for intent in bot.intents}
    if bot.out_of_scope_examples:
        examples[OUT_OF_SCOPE] = list(bot.out_of_scope_examples)
    return examples


def model_key(examples: dict[str, list[str]], settings: TrainingSettings) -> str:
    """A short hash of everything a trained model depends on: the examples, the settings, and
    the base encoder's weights (a new version of the bundled package, or other files at the
    same path, is another encoder)."""
    payload = {"format": FORMAT, "examples": examples, "settings": settings.model_dump(), "encoder": encoder_identity(settings.encoder)}
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
    settings: TrainingSettings
    measured: dict[str, Any]


class TrainedIntentClassifier:
    """Reads a message with a bot's trained intent model (an `IntentReader`)."""

    def __init__(self, directory: Path, device: str = "cpu") -> None:
        """Load a stored model.

        Raises:
            FileNotFoundError: the directory holds no complete model.
        """
        from sentence_transformers import SentenceTransformer

        record = directory / "model.json"
        if not record.is_file() or not (directory / "head.safetensors").is_file():
            raise FileNotFoundError(f"{directory}: no trained intent model there (model.json and head.safetensors)")
        meta = json.loads(record.read_text(encoding="utf-8"))
        self.info = TrainedModelInfo(
            key=directory.name,
            labels=list(meta["labels"]),
            temperature=float(meta["temperature"]),
            settings=TrainingSettings.model_validate(meta["settings"]),
            measured=dict(meta.get("measured", {})),
        )
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
        probabilities = self.probabilities(texts)
        return [self._verdict(row) for row in probabilities]

    def probabilities(self, texts: list[str]) -> np.ndarray:
        """Calibrated probabilities, one row per text, columns in `info.labels` order."""
        with self._reading, torch.inference_mode():
            vectors = self._encoder.encode(texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)
            logits = vectors @ self._weight.T + self._bias
            return torch.softmax(logits / self.info.temperature, dim=-1).cpu().numpy().astype(np.float64)

    def _verdict(self, probabilities: np.ndarray) -> IntentResult:
        """The best intent, unless "none of these" is likelier or the best is below `reject_below`.

        `confidence` is the best intent's probability also when the verdict is out of scope
        (as `IntentClassifier` reports it), so a caller sees how close it came."""
        scores = {name: float(p) for name, p in zip(self.info.labels, probabilities) if name != OUT_OF_SCOPE}
        ranked = sorted(scores.values(), reverse=True)
        best = max(scores, key=scores.__getitem__)
        confidence = ranked[0]
        none_likelier = OUT_OF_SCOPE in self.info.labels and float(probabilities[self.info.labels.index(OUT_OF_SCOPE)]) > confidence
        accepted = not none_likelier and confidence >= self.info.settings.reject_below
        return IntentResult(
            intent=best if accepted else OUT_OF_SCOPE,
            confidence=confidence,
            margin=confidence - (ranked[1] if len(ranked) > 1 else 0.0),
            scores=scores,
        )


def find_trained(bot: BotDefinition, data_dir: Path | None = None) -> Path | None:
    """The stored model trained on exactly this bot's examples with its training settings, if there is one."""
    directory = model_dir(model_key(training_examples(bot), bot.training), data_dir)
    return directory if (directory / "model.json").is_file() else None


def load_trained(bot: BotDefinition) -> TrainedIntentClassifier | None:
    """The bot's trained intent model when one matches its examples and today's settings, else None."""
    directory = find_trained(bot)
    return TrainedIntentClassifier(directory) if directory is not None else None
