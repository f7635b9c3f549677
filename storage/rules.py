"""What the session tier accepts, checked before any write so every backend behaves alike.

SQLite stores almost anything and never enforces a column's length; PostgreSQL refuses a
NUL in text and a string longer than its `VARCHAR`, and no driver can encode a lone
surrogate. Rather than let each backend fail (or not) in its own way halfway through a
transaction, `SessionStore` checks its arguments against these rules first, and the engine
uses `text_problem` to refuse a user message before it records anything.

It does not clean text up: a value is taken as given or refused, never silently changed.
"""

from __future__ import annotations

import unicodedata

from chatcache.storage.errors import InvalidIdError, InvalidTextError

ID_LENGTH = 128  # the `String(128)` of `sessions.id`, `user_id` and `bot`
TITLE_LENGTH = 200  # the `String(200)` of `sessions.title`
AGENT_LENGTH = 64  # the `String(64)` of `sessions.claimed_by`


def check_id(what: str, value: object) -> str:
    """Return `value` if it can be a session, user or bot id on every backend.

    Args:
        what: How the error names the value, e.g. "session id".
        value: The id to check.

    Raises:
        InvalidIdError: `value` is not a string, is empty, is longer than 128 characters,
            or holds a control character (NUL, newline, ...) or a lone surrogate.
    """
    if not isinstance(value, str):
        raise InvalidIdError(what, value, f"is a {type(value).__name__}, not a string")
    if not value:
        raise InvalidIdError(what, value, "is empty")
    if len(value) > ID_LENGTH:
        raise InvalidIdError(what, value, f"is {len(value)} characters long")
    # Cc: NUL, newlines, escapes; Cs: lone surrogates. Ids show up in logs, file names and UIs.
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in value):
        raise InvalidIdError(what, value, "contains a control character or a lone surrogate")
    return value


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored on every backend, or None if it can."""
    if "\x00" in text:
        return "contains a NUL character (\\x00)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate ({text[exc.start]!r}) that is not valid Unicode text"
    return None


def check_text(what: str, text: str, max_length: int | None = None) -> None:
    """Refuse `text` that some backend cannot store, before anything is written.

    Raises:
        InvalidTextError: `text` holds a NUL or a lone surrogate, or is over `max_length`.
    """
    problem = text_problem(text)
    if problem is None and max_length is not None and len(text) > max_length:
        problem = f"is {len(text)} characters long, over the limit of {max_length}"
    if problem is not None:
        raise InvalidTextError(what, problem)
