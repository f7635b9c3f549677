"""The bot definition: what a YAML bot file may say, as pydantic models.

Field-level checks (types, unknown keys, regexes that compile) live on the models. Checks
that relate one part of the file to another (a flow for an intent that does not exist, a
slot an intent names but nobody defines) live in `reference_errors`, which returns them with
a location path so the loader can point at the offending line just as it does for pydantic's
own errors. This module does not read files; see `loader.py`.
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

OUT_OF_SCOPE = "out_of_scope"
"""The label the classifier returns when no intent fits; no intent may take this name."""

Loc = tuple[str | int, ...]


class _Strict(BaseModel):
    # A misspelt key ("exmaples") must fail loudly, not be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Slot(_Strict):
    """A piece of information a flow needs, and how to find it in the user's text.

    `kind: amount` uses the built-in money/number extractor (a minus sign is kept: "-50" is
    refused, never read as 50), `kind: currency` the built-in currency names ("dollars", "$",
    "GBP": an ISO code); a `text` slot needs a `pattern` (first non-empty capture group, else
    the whole match) or a list of `values`. A slot with a `default` takes it when the user does
    not say one, and is never asked for. A value that does not match `valid` in full (or an
    amount not above zero) is refused with `invalid` (a template of `{value}`): the user hears
    why, and the flow asks again (`dialog.slots`).
    """

    name: str = Field(min_length=1)
    description: str = ""
    kind: Literal["text", "amount", "currency"] = "text"
    pattern: str | None = None
    values: list[str] | None = None
    default: str | None = Field(default=None, min_length=1)
    valid: str | None = None
    invalid: str | None = Field(default=None, min_length=1)

    @field_validator("pattern", "valid")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex: {exc}") from exc
        return pattern

    @field_validator("invalid")
    @classmethod
    def _invalid_names_only_the_value(cls, template: str | None) -> str | None:
        if template is not None:
            try:
                fields = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
            except ValueError as exc:
                raise ValueError(f"bad template: {exc}") from exc
            if fields - {"value"}:
                raise ValueError(f"the only placeholder is {{value}}, not {', '.join(sorted(fields - {'value'}))}")
        return template


class Intent(_Strict):
    """Something a user may want, taught to the classifier by example utterances.

    `answer` is the curated reply to a question intent (the knowledge base, usually its own
    file): given word for word whenever the intent is recognised, and in the model's context
    for what no intent covers. Examples may come from the bot's `examples_file` instead of the YAML.

    `calibration_examples` are messages of this intent that a trained model never learns from:
    they only tell how far its confidence can be trusted (`chatcache train` holds out a share of
    `examples` for that too, which for 40 examples an intent is too few to tell 98.5% right from
    99%: bench/README.md, "The bank bot's 98.8%").
    """

    name: str = Field(min_length=1)
    description: str = ""
    examples: list[str] = []
    calibration_examples: list[str] = []
    cacheable: bool = False
    slots: list[str] = []
    answer: str | None = Field(default=None, min_length=1)


class ExamplesFile(_Strict):
    """Intent examples from a labelled CSV with a header `text,category` (BANKING77's `train.csv`).

    Each intent named like a label gets that label's first `per_intent` texts (all when None)
    after its own; with `calibrate_on_rest` the label's texts after those become its
    `calibration_examples`. `path` is relative to the bot file and may hold `${VAR}` or
    `${VAR:-default}`.
    """

    path: str = Field(min_length=1)
    per_intent: int | None = Field(default=None, ge=1)
    calibrate_on_rest: bool = False

    @model_validator(mode="after")
    def _rest_needs_a_cut(self) -> ExamplesFile:
        if self.calibrate_on_rest and self.per_intent is None:
            raise ValueError("calibrate_on_rest needs per_intent: the rows after the first per_intent of a label calibrate")
        return self


class KnowledgeAnswer(_Strict):
    intent: str = Field(min_length=1)
    answer: str = Field(min_length=1)


class KnowledgeFile(_Strict):
    """The knowledge base: curated answers, one per question intent."""

    answers: list[KnowledgeAnswer] = Field(min_length=1)


class Flow(_Strict):
    """What the bot does once an intent is detected: ask, confirm, act; or hand off.

    `response` is what the user sees once `action` ran: a template of the intent's slots and
    the action's result (`{result.reference}`); `error_response` when the action failed, with why
    as `{reason}` (`dialog.actions.ActionRefused`; put before it when it has no `{reason}`). A flow
    without an action may have a `response` too: the intent's fixed reply, given once its slots
    are in (and confirmed), so the model never words it. A hand-off flow's `response` is what
    the bot says as it hands the conversation to a person.
    """

    ask: dict[str, str] = {}
    confirm: str | None = None
    action: str | None = None
    response: str | None = None
    error_response: str | None = None
    hand_off: bool = False


class ClassifierSettings(_Strict):
    """How sure the intent classifier must be before an intent counts (`dialog.classifier`);
    measure a bot's with `chatcache eval intents --bot BOT`."""

    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    margin: float = Field(default=0.0, ge=0.0)
    temperature: float = Field(default=0.03, gt=0.0)
    reject_score: float = 0.5


class TrainingSettings(_Strict):
    """How `chatcache train` trains the bot's intent model, and how it reads with it. Every field
    but `reject_share` and `reject_below` is part of the stored model's key, so `chat` and
    `serve` find the model trained with exactly these settings; those two only say when a
    message is out of scope, and change without training again.

    The encoder and a linear head learn together for `epochs`; `calibration_share` of each
    intent's examples is held out to calibrate the confidence and to set how unfamiliar a
    message must look to be out of scope whatever its best intent: unfamiliar enough to reject
    `reject_share` of the held-out in-scope examples (the share of customers' in-scope messages
    the bot may send to its fallback, traded against the out-of-scope messages it catches); and a
    familiar message whose best intent's calibrated confidence is below `reject_below` is out of
    scope too (torn between intents, as "a lot" is when asked for an amount).

    With `balance_intents` every intent weighs the same in the loss whatever its number of
    examples (each example weighted by the inverse of its intent's count): without it, an
    intent written with a handful of examples beside intents learned from forty is learned less
    firmly, reads as less familiar, and the pooled familiarity rule sends its own requests to
    the fallback.
    """

    encoder: str = Field(default="bundled", min_length=1)  # "bundled" (all-MiniLM-L6-v2), a model id or a path
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=32, ge=1)
    body_learning_rate: float = Field(default=1.5e-4, gt=0.0)
    head_learning_rate: float = Field(default=1e-2, gt=0.0)
    max_length: int = Field(default=64, ge=8)
    calibration_share: float = Field(default=0.1, gt=0.0, lt=1.0)  # every intent with two examples or more gives one
    reject_share: float = Field(default=0.01, gt=0.0, lt=0.5)
    reject_below: float = Field(default=0.4, ge=0.0, le=1.0)
    balance_intents: bool = False
    seed: int = 0


class BotDefinition(_Strict):
    """A whole bot: its persona, what it understands, and how it carries each request out."""

    system_prompt: str = Field(min_length=1)
    intents: list[Intent] = Field(min_length=1)
    slots: list[Slot] = []
    flows: dict[str, Flow] = {}
    actions: str | None = None  # the Python module of the flows' actions, beside the YAML (`dialog.actions`)
    examples_file: ExamplesFile | None = None
    knowledge: str | None = None  # the knowledge base's file (`KnowledgeFile`), beside the YAML
    classifier: ClassifierSettings = ClassifierSettings()
    # What the bot does not do, in its customers' words: a trained intent model learns "none of
    # these" from them as a class of its own (`chatcache train`); the nearest-example classifier
    # ignores them and rejects by score alone.
    out_of_scope_examples: list[str] = []
    training: TrainingSettings = TrainingSettings()
    # The reply to a message no intent fits, outside a flow (mid-flow the flow asks again);
    # without one the model answers it.
    fallback: str | None = Field(default=None, min_length=1)

    @property
    def instructions(self) -> str:
        """What the model is told: the system prompt, then every curated answer, so that what
        the model writes for what no intent covers rests on the bot's own answers."""
        answers = [f"- {i.description or i.name.replace('_', ' ')}: {i.answer}" for i in self.intents if i.answer]
        if not answers:
            return self.system_prompt
        return "\n\n".join([self.system_prompt, "What you know (answer only from this):", "\n".join(answers)])

    @property
    def wording(self) -> list[str]:
        """The bot's own words about what it does: every intent's name, description and examples
        (the answer cache tells a question about the bot from one about a customer's data by them)."""
        return [text for i in self.intents for text in (i.name.replace("_", " "), i.description, *i.examples)]

    def intent(self, name: str) -> Intent:
        """Return the intent called `name` (KeyError if there is none)."""
        for intent in self.intents:
            if intent.name == name:
                return intent
        raise KeyError(name)

    def flow(self, intent: str) -> Flow:
        """Return the flow of `intent`; an intent without one simply acts at once."""
        return self.flows.get(intent, Flow())


def reference_errors(bot: BotDefinition) -> list[tuple[Loc, str]]:
    """Find the places where one part of the bot contradicts another.

    Args:
        bot: A definition that already passed field validation.

    Returns:
        (location path, message) pairs, in file order; empty when the bot is consistent.
    """
    errors: list[tuple[Loc, str]] = []
    intent_names = [intent.name for intent in bot.intents]
    slot_names = {slot.name for slot in bot.slots}
    seen: set[str] = set()
    for i, intent in enumerate(bot.intents):
        if intent.name == OUT_OF_SCOPE:
            errors.append((("intents", i, "name"), f"'{OUT_OF_SCOPE}' is reserved for the fallback"))
        if intent.name in seen:
            errors.append((("intents", i, "name"), f"duplicate intent '{intent.name}'"))
        if not intent.examples:
            where = " (nor rows of that label in the examples file)" if bot.examples_file else ""
            errors.append((("intents", i, "examples"), f"intent '{intent.name}' has no examples{where}"))
        if intent.answer is not None and intent.name in bot.flows:
            errors.append((("intents", i, "answer"), f"intent '{intent.name}' has an answer and a flow; give it one of them"))
        seen.add(intent.name)
        for j, slot_name in enumerate(intent.slots):
            if slot_name not in slot_names:
                errors.append((("intents", i, "slots", j), f"unknown slot '{slot_name}'"))
        if intent.slots and intent.name not in bot.flows:
            errors.append((("intents", i, "slots"), f"intent '{intent.name}' has slots but no flow to ask for them"))
    seen = set()
    for k, slot in enumerate(bot.slots):
        if slot.name in seen:
            errors.append((("slots", k, "name"), f"duplicate slot '{slot.name}'"))
        seen.add(slot.name)
        if slot.kind == "text" and slot.pattern is None and not slot.values:
            errors.append((("slots", k), "a text slot needs a pattern or values to be extracted"))
        if slot.kind != "text" and (slot.pattern is not None or slot.values):
            errors.append((("slots", k, "kind"), f"a{'n' if slot.kind == 'amount' else ''} {slot.kind} slot takes no pattern or values"))
        if slot.valid is not None and slot.invalid is None:
            errors.append((("slots", k, "valid"), "a slot with `valid` needs `invalid`, the reply that says why a value is refused"))
    for name, flow in bot.flows.items():
        errors.extend(_flow_errors(name, flow, bot if name in intent_names else None))
    return errors


def _flow_errors(name: str, flow: Flow, bot: BotDefinition | None) -> list[tuple[Loc, str]]:
    if bot is None:
        return [(("flows", name), f"flow for unknown intent '{name}'")]
    errors: list[tuple[Loc, str]] = []
    slots = bot.intent(name).slots
    if flow.hand_off and (flow.ask or flow.confirm or flow.action):
        errors.append((("flows", name, "hand_off"), "a hand-off flow cannot also ask, confirm or act"))
    for slot in flow.ask:
        if slot not in slots:
            errors.append((("flows", name, "ask", slot), f"intent '{name}' has no slot '{slot}'"))
    defaults = {slot.name for slot in bot.slots if slot.default is not None}
    for slot in slots:
        if slot not in flow.ask and slot not in defaults and not flow.hand_off:
            errors.append((("flows", name, "ask"), f"no prompt for slot '{slot}'"))
    if flow.error_response and not flow.action:
        errors.append((("flows", name, "error_response"), "an error response needs an action that can fail"))
    for key, template, extra in (
        ("confirm", flow.confirm, set()),
        ("response", flow.response, {"result"} if flow.action else set()),
        ("error_response", flow.error_response, {"reason"}),
    ):
        if template is None:
            continue
        try:
            fields = {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(template) if field}
        except ValueError as exc:
            errors.append((("flows", name, key), f"bad template: {exc}"))
            continue
        for field in sorted(fields - set(slots) - extra):
            hint = " (or result.FIELD)" if "result" in extra else " (or reason)" if extra else ""
            errors.append((("flows", name, key), f"placeholder '{{{field}}}' is not a slot of '{name}'{hint}"))
    return errors
