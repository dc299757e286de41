"""The WebSocket a worker dials in on, as the transport of the gateway's client session to the worker's server:
JSON-RPC text messages, one per WebSocket message, with the close codes that tell a worker why it was ended."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import mcp.types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

# WebSocket close codes the gateway ends a worker's connection with. A worker should not dial again after
# the first three: only a change of its token, name or the gateway's config can help.
BAD_REQUEST = 4000
UNAUTHORIZED = 4001
FORBIDDEN = 4003
TIMEOUT = 4008
CONFLICT = 4009
TOO_MANY = 4013
GOING_AWAY = 1001
TOO_BIG = 1009
FATAL = frozenset({BAD_REQUEST, UNAUTHORIZED, FORBIDDEN})
MAX_REASON_BYTES = 123  # what a close frame can carry


class Refusal(Exception):
    """Why the gateway refuses or ends a worker's connection: a close code, the reason sent with it, and a short
    `kind` for metrics and logs (a bounded set of words)."""

    def __init__(self, code: int, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.code, self.reason, self.kind = code, reason, kind

    @property
    def frame_reason(self) -> str:
        """The reason cut to what a close frame carries, on a character boundary."""
        return self.reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


class SocketEnd:
    """The gateway's end of one worker's WebSocket, as the two streams an SDK client session reads and writes.

    Each link has its own send queue (`queue` messages) and its own pumps, so a worker that reads slowly
    holds up only the calls to it; a message that cannot be sent within `send_timeout` ends its link.
    Messages over `max_bytes` end it too (close 1009), as a POST body over the limit is refused.
    """

    def __init__(self, websocket: WebSocket, *, max_bytes: int, queue: int, send_timeout: float) -> None:
        self.websocket = websocket
        self._max_bytes, self._queue, self._send_timeout = max_bytes, queue, send_timeout
        self.problem: Refusal | None = None  # why the pumps ended the connection, if they did

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[tuple[Any, Any]]:
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](self._queue)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](self._queue)

        async def reader() -> None:
            async with read_writer:
                while True:
                    try:
                        message = await self.websocket.receive()
                    except (WebSocketDisconnect, RuntimeError):
                        return
                    if message["type"] == "websocket.disconnect":
                        if message.get("code") == TOO_BIG:  # the server refused a frame over its size limit
                            self.problem = Refusal(TOO_BIG, f"a message over {self._max_bytes} bytes", "too_big")
                        return
                    data = message.get("text")
                    if data is None:
                        data = message.get("bytes") or b""
                    if len(data) > self._max_bytes:
                        self.problem = Refusal(TOO_BIG, f"a message over {self._max_bytes} bytes", "too_big")
                        return
                    try:
                        parsed = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
                    except ValidationError as e:
                        await read_writer.send(ValueError(f"a message that is not JSON-RPC ({e.error_count()} errors)"))
                        continue
                    await read_writer.send(SessionMessage(parsed))

        async def writer() -> None:
            async with write_reader:
                async for item in write_reader:
                    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    with anyio.move_on_after(self._send_timeout) as waited:
                        try:
                            await self.websocket.send_text(text)
                        except (WebSocketDisconnect, RuntimeError, OSError):
                            break
                    if waited.cancelled_caught:
                        self.problem = Refusal(
                            TIMEOUT, f"a message could not be sent within {self._send_timeout:g} s", "slow"
                        )
                        break
            read_writer.close()  # the session sees the end, as when the worker closes

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()

    async def close(self, refusal: Refusal) -> None:
        """Close the connection with `refusal`'s code and reason, unless either side already has."""
        ws = self.websocket
        if ws.application_state is not WebSocketState.CONNECTED or ws.client_state is not WebSocketState.CONNECTED:
            return
        with anyio.move_on_after(2, shield=True), suppress(RuntimeError, OSError, WebSocketDisconnect):
            await ws.close(refusal.code, refusal.frame_reason)
