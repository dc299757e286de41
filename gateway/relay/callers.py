"""The caller of a request served by the SDK's server, as the upstream side sees it (`relay.asks.Caller`).

A 2025-era caller is asked over its call's own SSE stream and gets log lines there, filtered by the
level its session set. A 2026-era caller cannot be asked anything mid-call (the protocol forbids
server-to-client requests); its log lines are sent when the request opted in with a log level.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ValidationError

from gateway.observe.logs import get_logger
from gateway.protocol.era import LOG_LEVEL_KEY, Era

Json = dict[str, Any]
ANSWERS: dict[str, type[BaseModel]] = {
    "sampling/createMessage": types.CreateMessageResult,
    "elicitation/create": types.ElicitResult,
    "roots/list": types.ListRootsResult,
}
log = get_logger("callers")
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def declared_capabilities(ctx: ServerRequestContext[Any]) -> Json:
    """The client capabilities the caller declared (its session's, or this request's envelope in 2026)."""
    capabilities = ctx.session.client_capabilities
    if capabilities is None:
        return {}
    return capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)


class SessionCaller:
    """The caller of one request served by the SDK's server."""

    def __init__(
        self,
        ctx: ServerRequestContext[Any],
        session: str,
        level: str | None,
        *,
        asking: AbstractAsyncContextManager[None] | None = None,
    ) -> None:
        self._ctx = ctx
        self._asking = asking  # marks a question out while it waits (replicas pass its answer here)
        self.session = session
        self._level = level
        self.modern = Era.of(ctx.protocol_version).modern
        self.level = None if self.modern else level
        self.capabilities = declared_capabilities(ctx)
        if self.modern:
            meta = ctx.meta or {}
            self._level = meta.get(LOG_LEVEL_KEY) if isinstance(meta, dict) else None  # type: ignore[assignment]
        self.wants_logs = self._level is not None

    async def ask(self, method: str, params: Json) -> Json:
        """Send the request on the call's stream and return the client's answer."""
        if self.modern:
            raise MCPError(types.INVALID_REQUEST, f"{method} cannot be sent to a 2026-07-28 client mid-call")
        try:
            request = types.server_request_adapter.validate_python({"method": method, "params": params})
        except ValidationError as e:
            raise MCPError(types.INVALID_PARAMS, f"malformed {method} request: {e.errors()[0]['msg']}") from None
        metadata = ServerMessageMetadata(related_request_id=self._ctx.request_id)
        model = types.CreateMessageResultWithTools if params.get("tools") else ANSWERS[method]
        async with self._asking if self._asking is not None else nullcontext():
            answer = await self._ctx.session.send_request(request, model, metadata=metadata)
        result: Json = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        return result

    async def log(self, params: Json) -> None:
        """Send one log line on the call's stream, if the caller's level lets it through."""
        level = params.get("level")
        if self.modern and self._level is None:
            return  # 2026 logging is opt-in per request
        if not isinstance(level, str) or not at_least(level, self._level):
            return
        try:
            await self._ctx.session.send_log_message(
                level,  # type: ignore[arg-type]
                params.get("data"),
                params.get("logger"),
                related_request_id=self._ctx.request_id,
            )
        except Exception as e:
            log.debug("log line not delivered", reason=str(e))


def at_least(level: str, threshold: str | None) -> bool:
    """Whether a log line of `level` passes a session's `threshold` (None: everything passes)."""
    if threshold is None or level not in LEVELS or threshold not in LEVELS:
        return True
    return LEVELS.index(level) >= LEVELS.index(threshold)
