"""What a server asks of the user (sampling, elicitation, roots) and its log lines, sent to the caller of its call.

A server's request carries no mark of the call it belongs to (on stdio there is nothing to carry it),
so it goes to the caller session with calls in flight on that server. When calls of several
sessions are in flight, nobody can tell whose it is: the server gets a clean error, and no caller
sees another's question. A capability the caller did not declare, or the server's `relay` option
turned off, also ends in an error for the server; the caller never sees such a request.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.client.session import ClientRequestContext
from pydantic import BaseModel, ValidationError

from gateway.catalog.labels import META_PREFIX
from gateway.config.servers import ServerSpec
from gateway.observe import tracing
from gateway.observe.logs import get_logger
from gateway.policy.bucket import Throttle

Json = dict[str, Any]
log = get_logger("asks")

# Each request a server may make of the user, and the client capability it needs.
CAPABILITY = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
ASKING = tuple(CAPABILITY.values())  # the client capabilities a server may ask through
REFUSALS_PER_SECOND, REFUSALS_BURST = 1.0, 10  # refused requests of one server logged at most, as stderr lines are


class Caller(Protocol):
    """The downstream end of a call in flight: who can be asked, and where its log lines go."""

    @property
    def session(self) -> str:
        """The caller's session (a 2025 session id, or a key of its own for a sessionless call)."""

    @property
    def capabilities(self) -> Json:
        """The client capabilities the caller declared (wire form)."""

    async def ask(self, method: str, params: Json) -> Json:
        """Send `method` to the caller's client and return its result; raises `MCPError`."""

    async def log(self, params: Json) -> None:
        """Pass on one `notifications/message`."""

    @property
    def wants_logs(self) -> bool:
        """Whether the caller asked for log lines (a 2025 session's level, a 2026 request's opt-in)."""


class Mute:
    """The caller of a call that cannot be asked anything (a plain call the shortcut serves): a session of its own."""

    capabilities: Json = {}
    wants_logs = False

    def __init__(self) -> None:
        self.session = f"mute:{id(self)}"

    async def ask(self, method: str, params: Json) -> Json:
        """Never reached: `Callers.ask_of` refuses first, as no capability is declared."""
        raise MCPError(types.INVALID_REQUEST, f"{method} cannot be relayed: the client did not declare the capability")

    async def log(self, params: Json) -> None:
        """Log lines of such a call go nowhere."""


def asks_through(capabilities: Mapping[str, Any] | None) -> bool:
    """Whether client `capabilities` (wire form) let a server ask the user something through the gateway."""
    return capabilities is not None and any(capabilities.get(k) is not None for k in ASKING)


def talks(caller: Caller | None) -> bool:
    """Whether a server's log lines or requests have somewhere to go: then a tool call takes the SDK's session,
    which hears them, not the lean channel."""
    return caller is not None and (caller.wants_logs or asks_through(caller.capabilities))


def wanted(spec: ServerSpec, capability: str) -> bool:
    """Whether the server's `relay` option lets it make requests needing `capability`."""
    return bool(getattr(spec.relay, capability))


def declared(spec: ServerSpec, capabilities: Json) -> Json:
    """The part of a caller's `capabilities` this server may use: the ones it may ask for, plus the rest."""
    return {k: v for k, v in capabilities.items() if k not in CAPABILITY.values() or wanted(spec, k)}


class Callers:
    """The calls in flight on one server, by caller; routes the server's requests and log lines to theirs."""

    def __init__(self, spec: ServerSpec) -> None:
        self._spec = spec
        self._live: dict[int, Caller] = {}
        self._ids = itertools.count()
        self._passing = 0
        self._passed = anyio.Event()
        self._refusals = Throttle(REFUSALS_PER_SECOND, REFUSALS_BURST)  # a server may ask in a loop

    @contextmanager
    def serving(self, caller: Caller | None) -> Iterator[None]:
        """Mark a call of `caller` as in flight for the duration of the block."""
        if caller is None:
            yield
            return
        key = next(self._ids)
        self._live[key] = caller
        try:
            yield
        finally:
            del self._live[key]

    def current(self) -> Caller | None:
        """The one caller session with calls in flight (its oldest call), or None when none or several."""
        callers = iter(self._live.values())
        first = next(callers, None)
        if first is None or any(c.session != first.session for c in callers):
            return None
        return first

    async def ask(self, method: str, params: Json) -> Json:
        """Relay one request of the server to its caller; raises `MCPError` with a reason the server can read."""
        caller = self.current()
        if caller is None:
            why = "no call of this server is in flight" if not self._live else "calls of several clients are in flight"
            if (dropped := self._refusals.admit()) is not None:
                if dropped:
                    log.warning("server request refusals suppressed", server=self._spec.name, count=dropped)
                log.warning("server request refused", server=self._spec.name, method=method, reason=why)
            raise MCPError(types.INVALID_REQUEST, f"{method} cannot be relayed: {why}")
        return await self.ask_of(caller, method, params)

    async def ask_of(self, caller: Caller, method: str, params: Json) -> Json:
        """Relay one request of the server to `caller`, if the server may make it and the caller can answer it."""
        capability = CAPABILITY.get(method)
        server = self._spec.name
        if capability is None:
            raise MCPError(types.METHOD_NOT_FOUND, f"{method} is not a request a server may make of the user")
        if not wanted(self._spec, capability):
            raise MCPError(types.METHOD_NOT_FOUND, f"the gateway does not relay {method} from '{server}'")
        if caller.capabilities.get(capability) is None:
            raise MCPError(
                types.INVALID_REQUEST,
                f"{method} cannot be relayed: the client did not declare the {capability} capability",
            )
        meta = params.get("_meta")
        marked = {**(meta if isinstance(meta, dict) else {}), f"{META_PREFIX}server": server}
        marked[f"{META_PREFIX}trust"] = "trusted" if self._spec.trusted else "outside"
        log.info("server request relayed", server=server, method=method)
        tracer = tracing.ACTIVE
        if tracer is None:
            with anyio.fail_after(self._spec.timeout):
                return await caller.ask(method, {**params, "_meta": marked})
        with tracer.internal(f"relay {method}", {"mcp.method.name": method, "manifold.server": server}):
            with anyio.fail_after(self._spec.timeout):
                return await caller.ask(method, {**params, "_meta": marked})

    async def log(self, params: Json) -> None:
        """Pass a log line to the caller in flight, naming the server; dropped when there is none."""
        caller = self.current()
        if caller is None:
            log.debug("server log line dropped: no caller in flight", server=self._spec.name)
            return
        logger = params.get("logger")
        named = {**params, "logger": f"{self._spec.name}/{logger}" if logger else self._spec.name}
        self._passing += 1
        try:
            await caller.log(named)
        finally:
            self._passing -= 1
            if not self._passing:
                self._passed.set()
                self._passed = anyio.Event()

    async def settle(self) -> None:
        """Let the log lines that arrived before a result reach the caller first (bounded)."""
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        with anyio.move_on_after(1):
            while self._passing:
                await self._passed.wait()

    def callbacks(self) -> dict[str, Any]:
        """The SDK client session's callbacks for the requests this server may make (its declared capabilities)."""
        chosen: dict[str, Any] = {"logging_callback": self._on_log}
        if wanted(self._spec, "sampling"):
            chosen["sampling_callback"] = self._on_sampling
        if wanted(self._spec, "elicitation"):
            chosen["elicitation_callback"] = self._on_elicitation
        if wanted(self._spec, "roots"):
            chosen["list_roots_callback"] = self._on_roots
        return chosen

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        await self.log(params.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def _on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        answer = await self._relay("sampling/createMessage", params)
        if isinstance(answer, types.ErrorData):
            return answer
        model: type[BaseModel] = types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        return self._validated(model, answer)  # type: ignore[return-value]

    async def _on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        answer = await self._relay("elicitation/create", params)
        return answer if isinstance(answer, types.ErrorData) else self._validated(types.ElicitResult, answer)  # type: ignore[return-value]

    async def _on_roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        answer = await self._relay("roots/list", None)
        return answer if isinstance(answer, types.ErrorData) else self._validated(types.ListRootsResult, answer)  # type: ignore[return-value]

    async def _relay(self, method: str, params: BaseModel | None) -> Json | types.ErrorData:
        wire = params.model_dump(by_alias=True, mode="json", exclude_none=True) if params is not None else {}
        try:
            return await self.ask(method, wire)
        except MCPError as e:
            return types.ErrorData(code=e.code, message=e.error.message, data=e.error.data)
        except TimeoutError:
            return types.ErrorData(
                code=types.REQUEST_TIMEOUT,
                message=f"the client did not answer {method} within {self._spec.timeout:g} s",
            )

    def _validated(self, model: type[BaseModel], answer: Json) -> BaseModel | types.ErrorData:
        try:
            return model.model_validate(answer)
        except ValidationError as e:
            return types.ErrorData(code=types.INVALID_PARAMS, message=f"the client's answer is malformed: {e}")
