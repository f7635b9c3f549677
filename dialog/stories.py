"""Conversation tests of a bot (as Rasa's end-to-end tests): stories of user turns and what each must get.

A story file is YAML:

    stories:
      - name: transfer, happy path
        turns:
          - user: I want to transfer money
            intent: transfer_money
            bot: How much would you like to transfer?
          - user: 250 dollars to account 12345678
            slots: {amount: "250", to_account: "12345678"}
          - user: yes
            action: {name: transfer, arguments: {amount: "250", to_account: "12345678"}}
            bot: Sent 250 to 12345678, reference T-1.

Each story runs in a new session. Every key but `user` is optional and checked only when
given: the intent recognised, the slots filled so far (those named), the action the turn ran
with its arguments (`action: none` when no action may run), the bot's reply word for word, and
whether the session is handed off. `chatcache test-bot` runs them (`chatcache.evals.stories`);
loading them is `dialog.load_stories`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpectedAction(_Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, str] = {}


class StoryTurn(_Strict):
    """One user message and what the bot must make of it."""

    user: str = Field(min_length=1)
    intent: str | None = None
    slots: dict[str, str] | None = None
    action: ExpectedAction | Literal["none"] | None = None
    bot: str | None = None
    handed_off: bool | None = None

    @field_validator("user", mode="before")
    @classmethod
    def _said_as_text(cls, value: object) -> object:
        if isinstance(value, bool):  # YAML reads a bare yes, no, on or off as a boolean
            raise ValueError('a bare yes or no is a YAML boolean: quote it, user: "yes"')
        return value


class Story(_Strict):
    name: str = Field(min_length=1)
    turns: list[StoryTurn] = Field(min_length=1)


class StoryFile(_Strict):
    stories: list[Story] = Field(min_length=1)
