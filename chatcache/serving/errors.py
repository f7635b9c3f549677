"""The server's refusals in OpenAI's error shape: every error a client can cause is a 4xx."""

from __future__ import annotations

import math
from typing import Any

from chatcache.storage import (
    InvalidIdError,
    InvalidTextError,
    LeaseLostError,
    SessionBusyError,
    SessionClaimedError,
    SessionClosedError,
    SessionExistsError,
    StaleVersionError,
    StorageBusyError,
    StorageError,
    UnknownSessionError,
)

from ..errors import ChatCacheError, ContextWindowError
from .admission import Overloaded


class ApiError(Exception):
    """A request the server refuses, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.headers = status, kind, code, headers or {}


def error_body(message: str, kind: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def api_error(error: BaseException) -> ApiError:
    """The 4xx (or 503) a client gets for `error`; anything else is a bug, and raised (500)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, Overloaded):
        retry = str(math.ceil(error.retry_after_s))
        return ApiError(429, f"{error} Retry after {retry} s.", "rate_limit_exceeded", error.reason, {"Retry-After": retry})
    if isinstance(error, UnknownSessionError):
        return ApiError(404, "No such session.", "not_found_error", "session_not_found")
    if isinstance(error, SessionClaimedError):
        return ApiError(409, f"{error.holder} has already taken over this conversation.", "conflict_error", "session_claimed")
    if isinstance(error, SessionClosedError):
        return ApiError(409, "This session has ended; start a new one.", "conflict_error", "session_ended")
    if isinstance(error, (SessionExistsError, SessionBusyError)):
        return ApiError(409, str(error), "conflict_error", "session_conflict")
    if isinstance(error, (StorageBusyError, LeaseLostError, StaleVersionError)):
        return ApiError(503, f"{error} Try again.", "service_unavailable", "storage_busy", {"Retry-After": "1"})
    if isinstance(error, ContextWindowError):
        return ApiError(400, str(error), "invalid_request_error", "context_length_exceeded")
    if isinstance(error, (ChatCacheError, InvalidIdError, InvalidTextError)):
        return ApiError(400, str(error), "invalid_request_error", "invalid_request")
    if isinstance(error, StorageError):  # the database, not the request: worth a retry
        return ApiError(503, f"The session database failed: {error}", "service_unavailable", "storage_error", {"Retry-After": "5"})
    raise error
