"""The Python functions a bot's flows call, and the replies rendered from what they return.

A bot names a module of actions next to its YAML (`actions: actions.py`); each function in it
marked `@action("block_card")` is the code behind the flows whose `action` is that name. A flow
that reaches ACTING calls it with the flow's slot values, typed by their slot's kind (an amount
is a `Decimal`, text a `str`), and an `ActionContext` if it asks for one (who is asking, and a
key that is the same when a turn is retried, for backends that must not act twice). It returns
a JSON-able mapping, and the user sees the flow's `response` template filled with the slots and
`{result.FIELD}`: the reply to an action is never the model's invention. An action that raises,
or returns something that is not JSON, gets the flow's `error_response` (or a default offering
a human) and is logged; the flow ends either way, so the dialogue state stays consistent.

Why it failed reaches the user when the action says it for them: `raise ActionRefused("Your
balance of 2,200.00 EUR does not cover 1,000,000.00 EUR.")` fills `{reason}` in the flow's
`error_response`, and goes before it when the template has no `{reason}`, so no bot can hide a
refusal's reason behind a generic apology. Any other exception is a fault of the bot's code or
its backend: its text may hold internals, so `{reason}` is `UNEXPECTED_REASON` instead.

An action that only reads may keep its result for a while (`cache_ttl_s`), and one that changes
what others read drops their kept results (`invalidates`): `dialog.results`.

Loading a bot's actions runs its module: it is the bot developer's code, as a YAML file is
their configuration. Nothing here imports a model library.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from .definition import BotDefinition
from .results import ToolResults

log = logging.getLogger("chatcache.actions")
MARK = "__chatcache_action__"
DEFAULT_ERROR_RESPONSE = "Sorry, I could not do that: {reason} Would you like me to put you through to a human agent?"
UNEXPECTED_REASON = "Something went wrong on our side."
"""`{reason}` when an action failed with anything but `ActionRefused`."""
Function = TypeVar("Function", bound=Callable[..., Any])


@dataclass(frozen=True)
class ActionSpec:
    """What `@action` says of a function: its name, how long its result may be kept (None: it
    runs every time), and the actions whose kept results it makes stale."""

    name: str
    cache_ttl_s: float | None = None
    invalidates: tuple[str, ...] = ()


def action(name: str, *, cache_ttl_s: float | None = None, invalidates: Sequence[str] = ()) -> Callable[[Function], Function]:
    """Mark a function as the action `name` of the bot whose actions module defines it.

    Args:
        name: the name flows call it by.
        cache_ttl_s: keep its result this long per tenant, user and arguments; only for an
            action that reads (a balance for seconds, opening hours for a day).
        invalidates: actions whose kept results, for every user of the tenant, are dropped once
            this one runs, also when it fails (a transfer invalidates the balance).
    """
    if cache_ttl_s is not None and cache_ttl_s <= 0:
        raise ValueError(f"action {name!r}: cache_ttl_s must be positive, or None to run it every time")
    spec = ActionSpec(name, cache_ttl_s, tuple(invalidates))

    def mark(function: Function) -> Function:
        setattr(function, MARK, spec)
        return function

    return mark


@dataclass(frozen=True)
class ActionContext:
    """Who an action acts for; `idempotency_key` is the same for every retry of one turn."""

    tenant: str
    user_id: str
    session_id: str
    idempotency_key: str


@dataclass(frozen=True)
class ActionOutcome:
    """What an action did: its arguments, its result (None if it failed) and the reply shown."""

    name: str
    arguments: dict[str, str]
    result: dict[str, Any] | None
    reply: str
    error: str | None = None
    cached: bool = False  # the result was a kept one: the function did not run

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "result": self.result, "error": self.error, "cached": self.cached}


class ActionRefused(Exception):
    """Raised by an action that will not do what was asked, with why, written for the user
    ("That is your own account; a transfer goes to someone else's."): it becomes `{reason}`."""


class ActionError(ValueError):
    """An actions module that does not fit its bot: a missing action, a parameter no slot fills."""


class Actions:
    """A bot's actions by name.

    Args:
        bot: the bot whose flows call them.
        functions: action name to function (marked `@action`, or taken as run every time).

    Raises:
        ActionError: a flow's action has no function, a function takes a parameter that is
            neither one of its intent's slots nor `context`, or it invalidates an action the
            module does not define.
    """

    def __init__(self, bot: BotDefinition, functions: Mapping[str, Callable[..., Any]]) -> None:
        self.bot = bot
        self._functions = dict(functions)
        self._specs = {name: getattr(function, MARK, ActionSpec(name)) for name, function in functions.items()}
        self.results = ToolResults()
        problems = [problem for intent, flow in bot.flows.items() if flow.action for problem in self._check(intent, flow.action)]
        problems += [
            f"action '{spec.name}' invalidates '{other}', which the actions module does not define"
            for spec in self._specs.values()
            for other in spec.invalidates
            if other not in self._functions
        ]
        if problems:
            raise ActionError("; ".join(problems))

    @classmethod
    def load(cls, bot: BotDefinition) -> Actions | None:
        """The actions of `bot`'s module (its `actions` path), or None if it names none.

        Raises:
            ActionError: the module cannot be imported or does not fit the bot.
        """
        if bot.actions is None:
            return None
        path = Path(bot.actions)
        spec = importlib.util.spec_from_file_location(f"chatcache_bot_actions.{path.stem}_{abs(hash(path))}", path)
        if spec is None or spec.loader is None:
            raise ActionError(f"cannot import the actions module {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look their module up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ActionError(f"the actions module {path} failed to import: {exc!r}") from exc
        functions = {getattr(value, MARK).name: value for value in vars(module).values() if callable(value) and hasattr(value, MARK)}
        return cls(bot, functions)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        """The function of the action `name`."""
        return self._functions[name]

    def _check(self, intent: str, name: str) -> list[str]:
        function = self._functions.get(name)
        if function is None:
            return [f"flow '{intent}' calls action '{name}', which the actions module does not define"]
        slots = set(self.bot.intent(intent).slots)
        return [
            f"action '{name}' takes '{parameter}', which is neither a slot of '{intent}' nor 'context'"
            for parameter in inspect.signature(function).parameters
            if parameter not in slots and parameter != "context"
        ]

    def perform(self, intent: str, slots: Mapping[str, str], context: ActionContext) -> ActionOutcome:
        """Call the action of `intent`'s flow, or take its kept result, and render its reply; a
        failure is an outcome too (never kept, and it invalidates what the action would have)."""
        flow = self.bot.flow(intent)
        assert flow.action is not None
        function, spec = self._functions[flow.action], self._specs[flow.action]
        arguments = {name: slots[name] for name in self.bot.intent(intent).slots if name in slots}
        scope = ToolResults.scope(context.tenant, context.user_id, spec.name, arguments)
        if spec.cache_ttl_s is not None and (kept := self.results.get(scope)) is not None:
            return ActionOutcome(flow.action, arguments, kept, _render(flow.response or "Done.", arguments, kept), cached=True)
        try:
            result = function(**self._typed(function, arguments, context))
            if not isinstance(result, Mapping):
                raise TypeError(f"returned {type(result).__name__}, not a mapping")
            result = json.loads(json.dumps(dict(result)))  # JSON-able, and a copy the action cannot change later
        except ActionRefused as refusal:
            log.info("action %r refused for session %r: %s", flow.action, context.session_id, refusal)
            reply = _refusal_reply(flow.error_response, arguments, str(refusal))
            return ActionOutcome(flow.action, arguments, None, reply, error=repr(refusal))
        except Exception as exc:  # noqa: BLE001 - any failure of the bot's code gets the defined reply
            log.exception("action %r failed for session %r", flow.action, context.session_id)
            reply = _render(flow.error_response or DEFAULT_ERROR_RESPONSE, {**arguments, "reason": UNEXPECTED_REASON}, {})
            return ActionOutcome(flow.action, arguments, None, reply, error=repr(exc))
        finally:  # even a failed transfer may have moved money before it raised
            if spec.invalidates:
                self.results.invalidate(context.tenant, spec.invalidates)
        if spec.cache_ttl_s is not None:
            self.results.put(scope, result, spec.cache_ttl_s)
        return ActionOutcome(flow.action, arguments, result, _render(flow.response or "Done.", arguments, result))

    def _typed(self, function: Callable[..., Any], arguments: Mapping[str, str], context: ActionContext) -> dict[str, Any]:
        kinds = {slot.name: slot.kind for slot in self.bot.slots}
        typed: dict[str, Any] = {name: Decimal(value) if kinds.get(name) == "amount" else value for name, value in arguments.items()}
        if "context" in inspect.signature(function).parameters:
            typed["context"] = context
        return typed


class _Fields:
    """`{result.reference}` in a template: a result's keys read as attributes."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None


def _refusal_reply(error_response: str | None, slots: Mapping[str, str], reason: str) -> str:
    """The flow's error response with `{reason}` filled; the reason first when it has no place for it."""
    template = error_response or DEFAULT_ERROR_RESPONSE
    if "{reason}" not in template:
        template = "{reason} " + template
    return _render(template, {**slots, "reason": reason}, {})


def _render(template: str, slots: Mapping[str, str], result: Mapping[str, Any]) -> str:
    """The template with its slots and result fields; a field the result lacks is left as written."""
    try:
        return string.Formatter().vformat(template, (), {**slots, "result": _Fields(result)})
    except (KeyError, AttributeError, IndexError, ValueError):
        log.warning("response template %r has a field the action's result lacks", template)
        return template
