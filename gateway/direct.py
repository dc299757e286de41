"""Direct calls over a stdio server's pipes, beside the SDK session that shares them.

A call's request is written straight to the server's stdin and its answer (and progress) is
taken off stdout before the SDK's session would parse it, so the hot path pays for one JSON
encode and one decode. Direct requests use ids from 2**40 up, far from the session's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import mcp.types as types
import orjson
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

Json = dict[str, Any]
FIRST_ID = 2**40


class ConnectionLost(Exception):
    """The server's pipes closed while a direct call waited for its answer."""


def encode_line(message: Json) -> bytes:
    """One newline-terminated JSON-RPC frame."""
    return orjson.dumps(message) + b"\n"


async def report_progress(params: Any, report: ProgressFnT) -> None:
    """Hand a `notifications/progress` params object to `report`, if it carries a numeric progress."""
    if isinstance(params, dict) and isinstance(progress := params.get("progress"), int | float):
        total = params.get("total")
        await report(progress, total if isinstance(total, int | float) else None, params.get("message"))


class DirectChannel:
    """Direct request/response over newline-delimited JSON-RPC, sharing the pipes with an SDK session."""

    def __init__(self) -> None:
        self._write: Callable[[bytes], Awaitable[None]] | None = None
        self._pending: dict[int, asyncio.Future[Json]] = {}
        self._progress: dict[int, ProgressFnT] = {}
        self.closed = False
        self._background: set[asyncio.Future[None]] = set()

    def attach(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Bind the channel to the server's stdin writer."""
        self._write = write

    async def request(self, message: Json, cancel: Json, progress: ProgressFnT | None = None) -> Json:
        """Send a request (its integer `id` from FIRST_ID up) and return the server's JSON-RPC response as a dict.

        Cancelling the wait sends the server `cancel` (its `notifications/cancelled`). Raises `ConnectionLost`.
        """
        if self._write is None or self.closed:
            raise ConnectionLost("the server's pipes are closed")
        request_id: int = message["id"]
        future: asyncio.Future[Json] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if progress is not None:
            self._progress[request_id] = progress
        try:
            await self._write(encode_line(message))
            return await future
        except asyncio.CancelledError:
            answered = future.done() and not future.cancelled()  # awaiting it, the cancel cancelled it too
            if not answered and not self.closed:
                task = asyncio.ensure_future(self._quiet_write(encode_line(cancel)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            raise
        except OSError as e:
            raise ConnectionLost(str(e)) from None
        finally:
            self._pending.pop(request_id, None)
            self._progress.pop(request_id, None)

    async def _quiet_write(self, data: bytes) -> None:
        try:
            if self._write is not None:
                await self._write(data)
        except Exception:  # the pipe went away: nothing left to cancel
            return

    async def take(self, line: bytes) -> SessionMessage | Exception | None:
        """Route one stdout line: None when it answered (or reported progress on) a direct call, else the
        message (or its parse error) for the SDK session."""
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            message = None
        if isinstance(message, dict):
            request_id = message.get("id")
            if type(request_id) is int and request_id >= FIRST_ID and "method" not in message:
                future = self._pending.get(request_id)
                if future is not None and not future.done():
                    future.set_result(message)
                return None
            if message.get("method") == "notifications/progress" and self._progress:
                params = message.get("params")
                token = params.get("progressToken") if isinstance(params, dict) else None
                report = self._progress.get(token) if type(token) is int else None
                if report is not None:
                    await report_progress(params, report)
                    return None
        try:
            if message is None:
                return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False))
        except ValidationError as exc:
            return exc

    def close(self) -> None:
        """Fail every waiting call: the pipes are gone."""
        self.closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionLost("the server's pipes closed during the call"))
