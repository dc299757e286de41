"""One call to an upstream: a slot in its queue, a deadline, the channel it travels on, and what a failure means.

A call goes over the server's lean channel (stdio pipes or pooled HTTP/1.1) when it has one, else
through the SDK's session. Either way a failure ends as a `CallFailed` the model can read (with
whether it may be retried) or as the `MCPError` the server answered with. Failures are told apart by
type: the channels raise `ChannelError` subclasses, and the SDK's stand-ins are translated in one
place (`gateway.internals.sdk.channel_error`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp.types as types
from mcp import ClientSession, MCPError
from mcp.shared.dispatcher import ProgressFnT
from pydantic import ValidationError

from gateway.config.servers import ServerSpec
from gateway.internals.sdk import channel_error, send_unchecked, stamp
from gateway.protocol.era import LATEST_HANDSHAKE, Era
from gateway.protocol.errors import (
    AnswerLost,
    BadAnswer,
    CallFailed,
    ChannelError,
    HttpStatus,
    NoToken,
    NotSent,
    SessionExpired,
    Unauthorized,
    unavailable,
)

Json = dict[str, Any]
FIRST_ID = 2**40  # ids of calls on the lean channels: far from the SDK session's own
CANCEL_REASON = "the gateway's caller cancelled or timed out"


class Channel(Protocol):
    """A lean request channel to one server: stdio pipes or pooled HTTP/1.1."""

    async def request(self, message: Json, headers: Mapping[str, str], progress: ProgressFnT | None) -> Json:
        """Send a request and return the server's JSON-RPC response to it. Raises `ChannelError`."""

    async def notify(self, message: Json, headers: Mapping[str, str]) -> None:
        """Send a notification; failures are ignored."""
        ...


@dataclass(frozen=True)
class Line:
    """What one call needs of the connection it travels on, taken as the call starts: the SDK's session, the
    lean channel beside it (None: the session carries every call), the revision negotiated, how a cancel is
    told, and where work that must outlive the caller runs (it ends with the connection)."""

    session: ClientSession
    channel: Channel | None
    protocol_version: str | None
    cancels_by_notice: bool
    spawn: Callable[..., None]


class Health(Protocol):
    """What a failed call tells the connection it travelled on."""

    def lost(self) -> None:
        """The connection broke: end it, and connect again with backoff."""

    def reconnect(self) -> None:
        """The server forgot the connection (an expired session): connect again at once."""


class Deadline(Protocol):
    """A call's deadline, moved on by progress; `asyncio.timeout_at` is one."""

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to loop time `when`."""
        ...

    def expired(self) -> bool:
        """Whether the deadline ran out (and the block was cancelled for it)."""
        ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc_info: Any) -> bool | None: ...


class ScopeDeadline:
    """A deadline on an anyio cancel scope, raising `TimeoutError` as `asyncio.timeout_at` does.

    For requests through the SDK's session. The SDK sends its `notifications/cancelled` from the cancelled task,
    under a shield. A shield holds off anyio cancellations but not a native `Task.cancel`, which is how
    `asyncio.timeout` cancels; so when something else cancelled the call first (a held call's end, a caller gone)
    and the timeout ran out while that notice was being written, the notice was lost and the server went on.
    """

    def __init__(self, when: float) -> None:
        self._scope = anyio.CancelScope(deadline=when)

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to loop time `when` (None: no deadline)."""
        self._scope.deadline = math.inf if when is None else when

    def expired(self) -> bool:
        """Whether the deadline ran out and cancelled the block."""
        return self._scope.cancelled_caught

    async def __aenter__(self) -> ScopeDeadline:
        self._scope.__enter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool:
        if self._scope.__exit__(*exc_info):
            raise TimeoutError
        return False


def plausible_result(result: Any) -> bool:
    """A cheap shape check of a tool result forwarded without model validation."""
    if not isinstance(result, dict):
        return False
    content = result.get("content", [])
    if not isinstance(content, list) or not all(
        isinstance(c, dict) and isinstance(c.get("type"), str) for c in content
    ):
        return False
    return isinstance(result.get("isError", False), bool) and isinstance(result.get("structuredContent", {}), dict)


def busy(server: str, why: str) -> CallFailed:
    """The server has no room for the call; never retried."""
    return CallFailed(f"server '{server}' is busy: {why}", outcome="busy", transient=False)


def answer_lost(server: str, *, dropped: bool = False) -> CallFailed:
    """The request went out and no answer came: it may have run, so only retryable tools are tried again
    (`dropped`: the connection itself ended)."""
    return CallFailed(
        f"server '{server}': the connection closed before the answer; the call may have run",
        outcome="unavailable",
        transient=True,
        dropped=dropped,
    )


class Slots:
    """A server's call slots: how many calls may be in flight, and how many wait for one. Every connection that
    carries the server's calls shares them (its main connection and the 2025-era session beside it)."""

    def __init__(self, size: int) -> None:
        self.free = asyncio.Semaphore(size)
        self.queued = 0


class Invoker:
    """The calls of one upstream: at most `max_concurrent` in flight, `max_queued` waiting, each with a deadline.

    It knows the server's spec and what to tell the connection of a failure (`health`); each call brings the
    connection it travels on (`Line`)."""

    def __init__(self, spec: ServerSpec, health: Health) -> None:
        self._spec = spec
        self._name = spec.name
        self._health = health
        self.slots = Slots(spec.max_concurrent)
        self._ids = itertools.count(FIRST_ID)

    async def request(
        self,
        line: Line,
        method: str,
        params: Json,
        report: ProgressFnT | None = None,
        *,
        lean: bool = False,
        capabilities: Json | None = None,
    ) -> Json:
        """Send any request (`tools/call` by its ORIGINAL name, `prompts/get`, `resources/read`, ...) under the
        server's slots and deadline; the server's raw result comes back.

        Plain tool calls (`lean`: nobody to relay the server's requests or log lines to) take the lean channel
        when there is one, the rest the SDK's session. A 2026-era request declares `capabilities` (those of the
        caller it is sent for; None: the gateway's own). `timeout` bounds silence (each progress notice restarts
        the clock) and `max_call_time` the whole call; a call that runs out is cancelled upstream. Raises
        `CallFailed`, or `MCPError` for an error the upstream answered with.
        """
        spec, name = self._spec, self._name
        slots = self.slots
        if slots.free.locked() and slots.queued >= spec.max_queued:
            raise busy(name, f"{spec.max_concurrent} calls in flight and {slots.queued} waiting; try again later")
        lean = lean and method == "tools/call"
        # asyncio's own semaphore and, on a lean channel, timeout: neither yields to the loop when a slot is free
        # (anyio's do); through the SDK's session the timeout is a cancel scope (see `ScopeDeadline`)
        loop = asyncio.get_running_loop()
        now = loop.time()
        hard = now + spec.max_call_time if spec.max_call_time else math.inf
        first = min(now + spec.timeout, hard)
        deadline: Deadline = asyncio.timeout_at(first) if lean and line.channel is not None else ScopeDeadline(first)
        acquired = False

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            deadline.reschedule(min(loop.time() + spec.timeout, hard))
            if report is not None:
                await report(progress, total, message)

        try:
            async with deadline:
                slots.queued += 1
                try:
                    await slots.free.acquire()
                finally:
                    slots.queued -= 1
                acquired = True
                try:
                    return await self._send(line, method, params, on_progress, lean, capabilities)
                finally:
                    slots.free.release()
        except TimeoutError:
            if not deadline.expired():
                raise
        if not acquired:
            raise busy(name, f"no free slot within the {spec.timeout:g} s timeout")
        raise CallFailed(
            f"server '{name}' did not answer within {self._limit_text(hard - now)}; the call was cancelled",
            outcome="timeout",
            transient=True,
        )

    async def _send(
        self,
        line: Line,
        method: str,
        params: Json,
        progress: ProgressFnT,
        lean: bool,
        capabilities: Json | None,
    ) -> Json:
        """The request, holding a slot: over the lean channel (a plain tool call, `lean`, when the server has one)
        or the SDK's session, its failures classified."""
        try:
            channel = line.channel if lean else None
            if channel is not None:
                answer = await self._over_channel(line, channel, params, progress, capabilities)
                return self._result_of(method, answer, line.protocol_version)
            # Answers are taken as the server sent them and shape-checked here, not held to the negotiated
            # revision's schema by the SDK: servers that claim a revision often miss one of its fields
            # (a 2026 `resultType`, say), and task results are outside the SDK's tables anyway.
            task_id = params.get("taskId")
            name = task_id if isinstance(task_id, str) else None
            raw = await send_unchecked(
                line.session, method, params, progress=progress, name=name, capabilities=capabilities
            )
            return self._result_of(method, {"result": raw}, line.protocol_version)
        except MCPError as e:
            failure = channel_error(e)
            if failure is None:
                raise self.classify_code(e) from None
            if isinstance(failure, AnswerLost):
                self._health.lost()  # one interrupted answer closes the SDK's whole session: start afresh
            raise self.classify(failure, line.protocol_version) from None
        except ChannelError as e:
            raise self.classify(e, line.protocol_version) from None

    async def _over_channel(
        self,
        line: Line,
        channel: Channel,
        params: Json,
        progress: ProgressFnT | None,
        capabilities: Json | None,
    ) -> Json:
        """The call over the lean channel, stamped as the SDK's session would stamp it."""
        message: Json = {"jsonrpc": "2.0", "method": "tools/call", "params": params}
        headers = stamp(line.session, message, capabilities)
        message["id"] = request_id = next(self._ids)
        if progress is not None:
            message.setdefault("params", {}).setdefault("_meta", {})["progressToken"] = request_id
        try:
            return await channel.request(message, headers, progress)
        except NotSent:
            raise
        except BaseException:
            if line.cancels_by_notice:
                cancel: Json = {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": request_id, "reason": CANCEL_REASON},
                }
                cancel_headers = stamp(line.session, cancel)
                line.spawn(channel.notify, cancel, cancel_headers)
            raise

    def _result_of(self, method: str, reply: Json, protocol_version: str | None) -> Json:
        error = reply.get("error")
        if error is not None:
            try:
                data = types.ErrorData.model_validate(error)
            except ValidationError:
                data = types.ErrorData(code=types.INTERNAL_ERROR, message="malformed error response")
            raise MCPError(data.code, data.message, data.data)
        result = reply.get("result")
        if method != "tools/call":
            if not isinstance(result, dict):
                raise CallFailed(
                    f"server '{self._name}' answered {method} without a result", outcome="invalid", transient=False
                )
            return result
        if not plausible_result(result):
            raise CallFailed(
                f"server '{self._name}' answered with something that is not a tool result",
                outcome="invalid",
                transient=False,
            )
        assert isinstance(result, dict)
        foreign = Era.of(protocol_version or LATEST_HANDSHAKE).later_fields("tools/call")
        if not foreign.isdisjoint(result):
            result = {k: v for k, v in result.items() if k not in foreign}
        return result

    def _limit_text(self, total: float) -> str:
        if total <= self._spec.timeout or math.isinf(total):
            return f"the {self._spec.timeout:g} s timeout"
        return f"max_call_time ({total:g} s)"

    def classify(self, failure: ChannelError, protocol_version: str | None) -> CallFailed | MCPError:
        """What a channel failure means for the call, and for the connection (told through `health`)."""
        name, health = self._name, self._health
        if isinstance(failure, NotSent):
            health.lost()
            return unavailable(name, "the connection closed before the request was sent", repeatable=True)
        if isinstance(failure, AnswerLost):
            # Over HTTP only this exchange broke (a pooled connection): the server's other calls and its session
            # go on. Over stdio the pipes are the connection: it ended (the transport reports that itself).
            return answer_lost(name, dropped=self._spec.kind == "stdio")
        if isinstance(failure, SessionExpired):
            health.reconnect()
            return CallFailed(
                f"server '{name}' ended the session", outcome="unavailable", transient=True, repeatable=True
            )
        if isinstance(failure, Unauthorized):
            return CallFailed(
                f"server '{name}' refused the gateway's credentials ({failure})",
                outcome="unavailable",
                transient=False,
            )
        if isinstance(failure, NoToken):
            health.lost()  # a server without a token cannot be used: down (saying why) until a connection gets one
            return CallFailed(
                f"server '{name}' is unavailable: no access token: {failure}", outcome="unavailable", transient=False
            )
        if isinstance(failure, HttpStatus):
            if not Era.of(protocol_version).modern:
                # Session servers that forgot the session (a restart) often answer 400, not 404: start afresh.
                health.reconnect()
            return unavailable(name, "it answered with an HTTP error status")
        if isinstance(failure, BadAnswer):
            return MCPError(failure.code, str(failure))
        return unavailable(name, str(failure))

    def classify_code(self, e: MCPError) -> CallFailed | MCPError:
        """What an error answer means: a timeout the SDK ran out, or the server's own error, passed on."""
        if e.code == types.REQUEST_TIMEOUT:
            return CallFailed(f"server '{self._name}' timed out", outcome="timeout", transient=True)
        return e
