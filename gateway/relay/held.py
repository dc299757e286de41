"""Held calls: a 2025-era server's requests of the user, put to a 2026-era caller as `input_required` rounds.

A 2026-07-28 client cannot be sent a request mid-call. When the server of its call asks something
(sampling, elicitation, roots), the call is held open upstream, the caller's request is answered
with an `input_required` result naming what the server asked, and the client's retry (with
`inputResponses` and the `requestState` it was given) delivers the answers to the waiting server.
A held call nobody comes back for is cancelled after the server's timeout. A held call is its caller's: its
`requestState` opens it only for the same caller (token, or OAuth rule and subject) retrying the same tool.
Held calls live in the process that holds them open upstream; the key begins with that process's `origin`, so
a retry that reaches another replica is handed over to this one (see `downstream.replicas`).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError

from gateway.observe import tracing

Json = dict[str, Any]
STATE_PREFIX = "manifold-held:"
GATHER_SECONDS = 0.05  # requests a server sends together are put to the caller together


@dataclass
class Held:
    """One call held open upstream while its caller answers the server's requests."""

    key: str
    capabilities: Json
    deadline: float
    labels: Json = field(default_factory=dict)
    owner: str = ""  # who called (its token, or OAuth rule and subject): the only caller that may answer
    tool: str = ""  # the public name called: the only tool a retry may name
    asks: dict[str, tuple[Json, anyio.Event]] = field(default_factory=dict)
    answers: dict[str, Json] = field(default_factory=dict)
    result: Json | None = None
    error: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    changed: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    _ids: Any = field(default_factory=itertools.count)

    @property
    def session(self) -> str:
        """The held call's own key: its requests go to no other caller."""
        return self.key

    async def ask(self, method: str, params: Json) -> Json:
        """Called on behalf of the server: wait for the caller's answer to one request."""
        name = f"manifold-{next(self._ids)}"
        answered = anyio.Event()
        self.asks[name] = ({"method": method, "params": params}, answered)
        self._poke()
        await answered.wait()
        answer = self.answers.pop(name)
        self.asks.pop(name, None)
        if "__error__" in answer:
            raise MCPError(types.INVALID_REQUEST, str(answer["__error__"]))
        return answer

    async def log(self, params: Json) -> None:
        """Log lines of a held call have no stream to go to."""

    @property
    def wants_logs(self) -> bool:
        """A held call has no stream for log lines."""
        return False

    def _poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def unanswered(self) -> dict[str, Json]:
        """The requests still waiting for an answer."""
        return {name: request for name, (request, answered) in self.asks.items() if not answered.is_set()}

    def answer(self, responses: Json) -> None:
        """Hand the caller's answers to the waiting requests; one left unanswered fails the server's request."""
        for name, (_, answered) in list(self.asks.items()):
            if answered.is_set():
                continue
            response = responses.get(name)
            self.answers[name] = (
                response if isinstance(response, dict) else {"__error__": f"the client gave no answer to {name}"}
            )
            answered.set()


class HeldCalls:
    """The held calls of this process, sealed into `requestState` with a key only this process knows."""

    def __init__(self, origin: str, key: bytes | None = None) -> None:
        self.origin = origin
        self._key = key or secrets.token_bytes(32)
        self._held: dict[str, Held] = {}

    def _tag(self, key: str, owner: str, tool: str) -> str:
        bound = "\0".join((key, owner, tool)).encode()
        return hmac.new(self._key, bound, hashlib.sha256).hexdigest()[:32]

    def state(self, held: Held) -> str:
        """The `requestState` that brings a retry back to `held`: bound to its caller and its tool."""
        return f"{STATE_PREFIX}{held.key}.{self._tag(held.key, held.owner, held.tool)}"

    def find(self, state: str | None, owner: str, tool: str) -> Held | None:
        """The held call a `requestState` names, for `owner` retrying `tool`; None when it is not ours, was
        altered, expired, or is another caller's or another tool's (all alike, so nothing is revealed)."""
        if not state or not state.startswith(STATE_PREFIX):
            return None
        key, _, tag = state[len(STATE_PREFIX) :].partition(".")
        if not hmac.compare_digest(tag, self._tag(key, owner, tool)):
            return None
        held = self._held.get(key)
        return held if held is not None and (held.owner, held.tool) == (owner, tool) else None

    @staticmethod
    def ours(state: str | None) -> bool:
        """Whether a `requestState` was made by the gateway (else it is the server's own, passed through)."""
        return bool(state and state.startswith(STATE_PREFIX))

    @staticmethod
    def origin_of(state: str) -> str | None:
        """The origin of the process holding the call a gateway's `requestState` names."""
        if not state.startswith(STATE_PREFIX):
            return None
        origin, dash, _ = state[len(STATE_PREFIX) :].partition("-")
        return origin if dash else None

    def open(self, capabilities: Json, timeout: float, labels: Json | None = None, *, owner: str, tool: str) -> Held:
        """A new held call of `owner` to `tool`, for a caller with `capabilities`, cancelled unless done or
        answered within `timeout`; `labels` go in the `_meta` of each `input_required` round (which server
        asks, how far to trust it)."""
        held = Held(
            f"{self.origin}-{secrets.token_hex(12)}",
            capabilities,
            anyio.current_time() + timeout,
            dict(labels or {}),
            owner,
            tool,
        )
        held.scope.deadline = held.deadline
        self._held[held.key] = held
        return held

    def close(self, held: Held) -> None:
        """Forget a held call."""
        self._held.pop(held.key, None)

    async def run(self, held: Held, call: Callable[[], Awaitable[Json]]) -> None:
        """The held call's own task: run the call to its end (or its deadline), then wake whoever waits."""
        tracer = tracing.ACTIVE
        try:
            with held.scope, tracer.internal("held call") if tracer is not None else tracing.NO_SPAN:
                held.result = await call()
            if held.scope.cancelled_caught:
                held.error = MCPError(types.REQUEST_TIMEOUT, "the call was held for answers that never came")
        except BaseException as e:  # the waiting caller gets it
            held.error = e
            if isinstance(e, anyio.get_cancelled_exc_class()):
                raise
        finally:
            held.done.set()
            held._poke()
            if held.error is not None or held.result is not None:
                self.close(held)

    async def next_answer(self, held: Held) -> Json:
        """Wait until the call ends or asks something; its result, or an `input_required` result."""
        while True:
            if held.done.is_set():
                if held.error is not None:
                    if isinstance(held.error, anyio.get_cancelled_exc_class()):
                        raise MCPError(types.REQUEST_TIMEOUT, "the held call was cancelled")
                    raise held.error
                assert held.result is not None
                return held.result
            pending = held.unanswered()
            if pending:
                await anyio.sleep(GATHER_SECONDS)
                return {
                    "resultType": "input_required",
                    "inputRequests": held.unanswered(),
                    "requestState": self.state(held),
                    "_meta": held.labels,
                }
            changed = held.changed
            await changed.wait()
