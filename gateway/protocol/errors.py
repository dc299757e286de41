"""Where an upstream stands, and how a call to it can fail."""

from __future__ import annotations

import enum

import httpx2
from mcp import MCPError

from gateway.observe.logs import redact_text


class EgressDenied(Exception):
    """The URL may not be used by a server that passes the egress rules; the message says why."""


class State(enum.StrEnum):
    """Where a server's connection stands."""

    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    DISABLED = "disabled"


class CallFailed(Exception):
    """A call did not reach a result. The message says why, for the model to read.

    `transient` failures may be retried for read-only and idempotent tools; `repeatable` ones never
    reached the tool, so any tool may be retried; `dropped` ones ended the connection they travelled on (a
    retry waits for the next); `outcome` is the metrics outcome.
    """

    def __init__(
        self, message: str, *, outcome: str, transient: bool, repeatable: bool = False, dropped: bool = False
    ) -> None:
        super().__init__(message)
        self.outcome, self.transient, self.repeatable, self.dropped = outcome, transient, repeatable, dropped


def unavailable(server: str, reason: str, *, repeatable: bool = False) -> CallFailed:
    """The server cannot take the call now (down, connecting, dropped); transient."""
    return CallFailed(
        f"server '{server}' is unavailable: {reason}", outcome="unavailable", transient=True, repeatable=repeatable
    )


class ChannelError(Exception):
    """A lean channel's exchange ended without an answer. Subclasses say whether the request went out."""


class NotSent(ChannelError):
    """The request never reached the server (the connection was found closed before a byte was written)."""


class AnswerLost(ChannelError):
    """The request went out and the connection closed before the answer: the call may have run."""


class SessionExpired(ChannelError):
    """The server no longer knows the session (HTTP 404 on a session): it did not run the request."""


class HttpStatus(ChannelError):
    """The server answered the request with an HTTP error status and no JSON-RPC error."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}" if status else "an HTTP error status")
        self.status = status


class Unauthorized(ChannelError):
    """The server answered HTTP 401: it refused the request's credentials, so the request did not run."""


class NoToken(ChannelError):
    """No access token could be had for the server (the message says why, never a secret); nothing was sent."""


class BadAnswer(ChannelError):
    """The server answered with something that is not a JSON-RPC answer; `code` is the error to pass on."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def describe(exc: BaseException) -> str:
    """A short, secret-free reason for a failure (ExceptionGroups unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        text = exc.error.message
    elif isinstance(exc, httpx2.ConnectError):
        text = "connection refused or host unreachable"
    elif isinstance(exc, httpx2.TimeoutException):
        text = "HTTP timeout"
    elif isinstance(exc, httpx2.HTTPStatusError):
        text = f"HTTP {exc.response.status_code}"
    elif isinstance(exc, FileNotFoundError):
        text = f"command not found: {exc.filename}" if exc.filename else "command not found"
    elif isinstance(exc, EgressDenied):
        text = f"egress check failed: {exc}"
    elif isinstance(exc, TimeoutError):
        text = str(exc) or "timed out"
    else:
        text = str(exc) or type(exc).__name__
    return redact_text(text.splitlines()[0] if text else type(exc).__name__)[:300]


# Exceptions that mean the code is wrong, not that the server or the network failed.
PROGRAMMING_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    AttributeError,
    NameError,
    LookupError,
    AssertionError,
    ArithmeticError,
    NotImplementedError,
)


def programming_error(exc: BaseException) -> bool:
    """Whether `exc` (or one in its group) is a fault of the code, worth a traceback, rather than a failure of the
    server or the network."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(lambda e: isinstance(e, PROGRAMMING_ERRORS)) is not None
    return isinstance(exc, PROGRAMMING_ERRORS)
