"""HCAC: the dialogue state machine and drift detection steer the cache tiers, once per user turn.

Before the model runs, `ContextCoordinator.before_reply`:
  1. embeds the user turn (the classifier, drift detection and the turn tier all use it);
  2. steps the dialogue state machine (intent with confidence, slots, flow state);
  3. on a topic change (drift: judged against the assistant's last turn and whether the
     flow just completed a task), drops the session's turn-tier entries and moves the prompt
     window to start at this turn: older turns stay in the session tier, confirmed facts stay
     in the prompt, and the token tier then reuses only the stable prefix. The reset is soft
     for one informative turn: if that turn goes back to the dropped topic, the dropped turns
     come back into the prompt (a false drift costs a turn, not the conversation);
  4. keeps the turn's intent candidates and unconfirmed slots in the turn tier;
  5. promotes a confirmed intent (user confirmation, or confidence above the threshold) and
     its slots to session facts, which the system message shows from this turn on.
What changes in the session (dialogue state, prompt window, facts) changes on the conversation
in memory; the engine's commit at the end of the turn stores it, with the reply, in one go.
When the flow needs a slot or a confirmation, the bot's own question is the reply and the
model is not run. After the reply, `after_reply` closes an action the flow reached.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from cachetools import LRUCache

from chatcache.dialog import (
    OUT_OF_SCOPE,
    BotDefinition,
    DialogueEvent,
    DialogueManager,
    DialogueState,
    DialogueStateMachine,
    EventType,
    IntentClassifier,
    IntentReader,
    State,
)

from ..tiers.conversations import Conversation, Conversations
from .drift import DriftConfig, DriftDetector, is_low_information, returns_to_dropped
from .session_memory import SessionMemory

log = logging.getLogger(__name__)

Embed = Callable[[list[str]], np.ndarray]


@dataclass
class TurnContext:
    """What the dialogue layer decided about one user turn, before any reply exists."""

    embedding: np.ndarray | None = None
    intent: str | None = None
    confidence: float | None = None
    dialogue_state: str | None = None
    cacheable: bool = False
    confirmed: bool = False
    drift: bool = False
    drift_reasons: tuple[str, ...] = ()
    reset_undone: bool = False  # the turn went back to the topic the last turn's drift dropped
    bot_reply: str | None = None
    action: str | None = None
    promoted: bool = False
    awaiting_agent: bool = False  # handed off to a person: the bot does not answer


KEPT_EMBEDDINGS = 20_000
"""Texts whose embedding is kept per embedder (about 30 MB at MiniLM's 384 dimensions)."""

_kept: weakref.WeakKeyDictionary[Any, tuple[threading.Lock, LRUCache[str, np.ndarray]]] = weakref.WeakKeyDictionary()


def sentence_embed(model: Any) -> Embed:
    """A sentence-transformers model as an `Embed` function (unit-normalised rows), remembering
    what it embedded.

    Every engine on a bot embeds the bot's examples (the bank bot's are 3,000), and a server
    builds one engine per tenant: the vectors are kept per embedder model (most recently used
    first, `KEPT_EMBEDDINGS` of them), so the examples are embedded once per process. A kept
    vector equals a fresh one up to float rounding of the batch it was computed in.
    """
    compute = _computing(model)
    lock, kept = _kept.setdefault(model, (threading.Lock(), LRUCache(KEPT_EMBEDDINGS)))

    def embed(texts: list[str]) -> np.ndarray:
        with lock:
            found = {text: kept[text] for text in texts if text in kept}
        missing = [text for text in dict.fromkeys(texts) if text not in found]
        if missing:
            found.update(zip(missing, compute(missing)))
            with lock:
                kept.update((text, found[text]) for text in missing)
        if not texts:
            return compute(texts)
        return np.stack([found[text] for text in texts])

    return embed


def _computing(model: Any) -> Embed:
    """Every turn embeds one short text, where `encode`'s per-call bookkeeping costs about as
    much as the forward pass; for the common mean-pooling layout the forward pass runs
    directly (same vectors), anything else goes through `encode`."""
    if _is_mean_pooled(model):
        tokenizer, transformer = model.tokenizer, model[0].auto_model
        max_length = model.get_max_seq_length()

        def fast(texts: list[str]) -> np.ndarray:
            return np.concatenate([batch(texts[i : i + 32]) for i in range(0, len(texts), 32)] or [np.zeros((0, 0))])

        def batch(texts: list[str]) -> np.ndarray:
            with torch.inference_mode():
                features = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
                features = {k: v.to(transformer.device) for k, v in features.items()}
                hidden = transformer(**features).last_hidden_state
                mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()

        return fast

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False))

    return embed


def _is_mean_pooled(model: Any) -> bool:
    """Transformer, then mean pooling, then optional normalisation: nothing else changes the vector."""
    names = [type(module).__name__ for module in model]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return False
    pooling: str | None = model[1].get_config_dict().get("pooling_mode")
    return pooling == "mean"


def _domain_hint(intent: str | None) -> str | None:
    """An intent as drift evidence: out-of-scope says nothing about the topic."""
    return intent if intent not in (None, OUT_OF_SCOPE) else None


class ContextCoordinator:
    """Runs the dialogue layer and drift detection for a turn and applies their effects to the tiers."""

    def __init__(
        self,
        conversations: Conversations,
        embed: Embed,
        bot: BotDefinition | None,
        drift: DriftConfig | None,
        promote_threshold: float = 0.95,
        reader: IntentReader | None = None,
    ) -> None:
        """`reader` reads the bot's intents (a trained model); without one, the nearest-example
        classifier does, which is built anyway: its embedded examples are drift's topics."""
        self.conversations = conversations
        self.embed = embed
        nearest = IntentClassifier(bot, embed) if bot else None
        self.manager = (
            DialogueManager(bot, reader or nearest, promote_threshold=promote_threshold) if bot and nearest else None
        )
        # The bot's intents are the topics drift is judged against; their examples are embedded once.
        prototypes = nearest.prototypes() if nearest is not None else None
        self.drift = DriftDetector(drift, prototypes) if drift is not None else None

    @classmethod
    def steering(
        cls,
        conversations: Conversations,
        embed: Embed,
        bot: BotDefinition | None,
        drift: bool | DriftConfig,
        bundled_embedder: bool,
        promote_threshold: float,
        reader: IntentReader | None,
    ) -> ContextCoordinator | None:
        """The coordinator of an engine with a bot or drift detection; None for a plain chatbot
        without drift, which has nothing to steer. The learned drift model reads the bundled
        embedder's similarities only: with another embedder the hand-built rule decides."""
        if not drift and bot is None:
            return None
        config = drift if isinstance(drift, DriftConfig) else DriftConfig() if drift else None
        if config is not None and not bundled_embedder:
            config = replace(config, model=None)
        if config is not None:  # said once, so that a user with an embedder of their own learns which decides
            log.info(
                "drift is decided by %s",
                f"the learned model {config.model.name}" if config.model is not None
                else "the hand-built rule (the learned model reads the bundled embedder's similarities only)",
            )
        return cls(conversations, embed, bot, config, promote_threshold, reader)

    def before_reply(self, memory: SessionMemory, text: str, turn_id: str) -> TurnContext:
        """Read the turn and steer the session's memory (module docstring); what it read."""
        conversation = memory.conversation
        previous = conversation.turns[-1] if conversation.turns else None
        assistant_text = previous.content if previous is not None and previous.role == "assistant" else None
        # One batch: the assistant's last turn is context the new user turn is judged against.
        vectors = self.embed([text] if assistant_text is None or self.drift is None else [text, assistant_text])
        context = TurnContext(embedding=vectors[0])
        before = conversation.dialogue  # as the last turn left it (a record: stepping replaces it)
        if self.manager is not None:
            self._step_dialogue(memory, text, turn_id, context)
        if self.drift is not None:
            assistant = (assistant_text, vectors[1]) if assistant_text is not None else None
            self._judge_drift(self.drift, memory, text, vectors[0], assistant, before, context)
        memory.entries.put("embedding", vectors[0])
        return context

    def _judge_drift(
        self,
        detector: DriftDetector,
        memory: SessionMemory,
        text: str,
        embedding: np.ndarray,
        assistant: tuple[str, np.ndarray] | None,
        before: DialogueState | None,
        context: TurnContext,
    ) -> None:
        """Ask the detector about this turn; on a drift, drop the old topic from the turn tier and the prompt."""
        conversation = memory.conversation
        if conversation.reset_from is not None and not is_low_information(text, detector.config.open_task.min_content_words):
            if self._returns_to_dropped(conversation, embedding, detector.config.return_margin):
                context.reset_undone = True
                conversation.context_start = conversation.reset_from
                conversation.segments.ids.clear()
                memory.topic = None  # resumed below from the turns back in the window
            conversation.reset_from = None  # judged: the reset stands, or is undone
        if memory.topic is None:  # a new process, or a copy rebuilt: the topic is in the stored turns
            stored = [m.content for m in conversation.turns[conversation.context_start :] if m.role == "user"]
            memory.topic = detector.resume(stored, self.embed, _domain_hint(before.intent if before is not None else None))
        result = detector.observe(
            memory.topic,
            embedding,
            text,
            assistant_embedding=assistant[1] if assistant else None,
            assistant_text=assistant[0] if assistant else None,
            task_closed=before is not None and before.state == State.DONE,
            domain_hint=_domain_hint(context.intent),
        )
        if result.drift and conversation.turns:
            context.drift, context.drift_reasons = True, tuple(result.reasons)
            memory.entries.clear()
            conversation.reset_from = conversation.context_start  # the next informative turn may undo it
            conversation.context_start = len(conversation.turns)  # the turn's commit stores both
            conversation.segments.ids.clear()

    def _returns_to_dropped(self, conversation: Conversation, embedding: np.ndarray, margin: float) -> bool:
        """`returns_to_dropped` on the session's user turns the last reset dropped and those since.
        Embeddings of past turns are remembered (`sentence_embed`): this costs no model time."""
        assert conversation.reset_from is not None
        dropped = [m.content for m in conversation.turns[conversation.reset_from : conversation.context_start] if m.role == "user"]
        since = [m.content for m in conversation.turns[conversation.context_start :] if m.role == "user"]
        if not dropped or not since:
            return False
        vectors = self.embed(dropped + since)
        return returns_to_dropped(embedding, vectors[: len(dropped)], vectors[len(dropped) :], margin)

    def _step_dialogue(self, memory: SessionMemory, text: str, turn_id: str, context: TurnContext) -> None:
        assert self.manager is not None
        conversation = memory.conversation
        state = conversation.dialogue
        if state is not None and state.state == State.HANDED_OFF:  # a person answers until they hand it back
            context.awaiting_agent, context.dialogue_state = True, State.HANDED_OFF.value
            context.intent = state.intent
            return
        if state is not None and state.state == State.ACTING:
            machine = DialogueStateMachine.restore(state)  # a new user turn starts over
            machine.apply(DialogueEvent(EventType.RESET, event_id=f"{turn_id}:reset"))
            state = machine.snapshot()
        previous_text = next((turn.content for turn in reversed(conversation.turns) if turn.role == "user"), None)
        decision = self.manager.handle(state, text, turn_id, context.embedding, previous_text)
        conversation.dialogue = decision.state
        context.intent, context.confidence = decision.intent, decision.confidence
        context.dialogue_state = decision.state.state.value
        context.cacheable, context.bot_reply, context.action = decision.cacheable, decision.prompt, decision.action
        context.confirmed = decision.confirmed
        memory.entries.put("intent_candidate", (decision.intent, decision.confidence))
        slots = dict(decision.state.slots)
        if decision.confirmed and decision.intent != OUT_OF_SCOPE:
            context.promoted = self._promote(conversation, decision.intent, decision.confidence, slots)
        else:
            memory.entries.put("unconfirmed_slots", slots)

    def _promote(self, conversation: Conversation, intent: str, confidence: float, slots: dict[str, str]) -> bool:
        facts = [("intent", "current", intent, confidence)] + [
            ("slot", name, str(value), confidence) for name, value in sorted(slots.items())
        ]
        known = {(f.kind.value, f.name, f.value) for f in conversation.facts}
        if all((kind, name, value) in known for kind, name, value, _ in facts):
            return False  # nothing new: keep the system message (and its KV) as it is
        self.conversations.promote(conversation, facts, turn=len(conversation.turns) // 2 + 1)
        return True

    def after_reply(self, conversation: Conversation, context: TurnContext, turn_id: str) -> None:
        """The reply performed the flow's action: the machine moves on from ACTING."""
        if self.manager is None or context.dialogue_state != State.ACTING.value:
            return
        assert conversation.dialogue is not None
        machine = DialogueStateMachine.restore(conversation.dialogue)
        machine.apply(DialogueEvent(EventType.ACTED, {"action": context.action}, f"{turn_id}:acted"))
        conversation.dialogue = machine.snapshot()
        context.dialogue_state = machine.state.value
