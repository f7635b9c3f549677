"""Model-free dialogue layer: bot definitions, intent classification, slots and flow state.

Nothing here imports a model library; the intent classifier is handed an embedding function.
"""

from .actions import ActionContext, ActionError, ActionOutcome, ActionRefused, Actions, action
from .classifier import Embed, IntentClassifier, IntentReader, IntentResult, PreviousTurn, read_in_context
from .definition import OUT_OF_SCOPE, BotDefinition, Flow, Intent, Slot
from .dialogue_state import DialogueState, State, dialogue_from_json, dialogue_to_json
from .loader import BotDefinitionError, load_bot, load_stories, parse_bot
from .manager import DialogueManager, TurnDecision
from .shipped import shipped_bots
from .slots import SlotExtractor
from .state_machine import (
    TRANSITIONS,
    DialogueEvent,
    DialogueStateMachine,
    EventType,
    IllegalTransitionError,
    apply_with_retry,
)

__all__ = [
    "OUT_OF_SCOPE",
    "ActionContext",
    "ActionError",
    "ActionOutcome",
    "ActionRefused",
    "Actions",
    "action",
    "TRANSITIONS",
    "DialogueEvent",
    "DialogueManager",
    "DialogueState",
    "DialogueStateMachine",
    "EventType",
    "IllegalTransitionError",
    "State",
    "TurnDecision",
    "apply_with_retry",
    "dialogue_from_json",
    "dialogue_to_json",
    "BotDefinition",
    "BotDefinitionError",
    "Embed",
    "Flow",
    "Intent",
    "IntentClassifier",
    "IntentReader",
    "PreviousTurn",
    "read_in_context",
    "IntentResult",
    "Slot",
    "SlotExtractor",
    "load_bot",
    "load_stories",
    "parse_bot",
    "shipped_bots",
]
