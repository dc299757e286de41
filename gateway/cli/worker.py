"""`manifold worker`: offer a local stdio MCP server through a gateway that cannot reach it.

The worker starts the server with the SDK's stdio client, dials the gateway's `/workers` WebSocket
with its token and the name to offer, and relays JSON-RPC messages both ways: the gateway is the
server's client. It answers the gateway's pings itself, so a busy server is not taken for a dead
worker. When the connection or the server ends, both are closed and the worker dials again with
backoff (a fresh server process for each connection); a refusal that dialling again cannot mend (bad
token, a name the token may not offer) ends it with exit status 1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import anyio
import mcp.types as types
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from gateway.observe.logs import get_logger
from gateway.policy.backoff import Backoff
from gateway.upstream.transports.stdio import find_command
from gateway.upstream.transports.websocket import FATAL

log = get_logger("worker")
TOKEN_ENV = "MANIFOLD_WORKER_TOKEN"
LAUNCHERS = frozenset({"python", "python3", "node", "npx", "uv", "uvx", "deno", "bun", "sh", "bash", "env", "docker"})
INTERNAL_ERROR = -32603


class Refused(Exception):
    """The gateway refused the worker, or ended its connection, with a close code and a reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (close code {code})" if reason else f"close code {code}")
        self.code, self.reason = code, reason


def workers_url(connect_to: str, name: str) -> str:
    """The `/workers` WebSocket URL for a gateway URL given as `http(s)://host[:port][/...]` or `ws(s)://...`."""
    parts = urlsplit(connect_to)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"--connect takes the gateway's URL (http://, https://, ws:// or wss://), got {connect_to!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/mcp"):
        path = path[: -len("/mcp")]
    if not path.endswith("/workers"):
        path += "/workers"
    return urlunsplit((scheme, parts.netloc, path, urlencode({"name": name}), ""))


def derive_name(command: str) -> str:
    """The name to offer a server under when `--name` is not given: its command's file name, without a suffix.
    A launcher (`python`, `node`, `npx`, ...) says nothing of what it runs: then `--name` is required."""
    stem = Path(command).name.rsplit(".", 1)[0] if "." in Path(command).name else Path(command).name
    if stem in LAUNCHERS or re.fullmatch(r"python3(\.\d+)?", stem):
        raise ValueError(f"{command!r} is a launcher and says nothing of what it serves: name the offer with --name")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-")[:64]
    if not name:
        raise ValueError(f"no name can be made of {command!r}: name the offer with --name")
    return name


def child_environment() -> dict[str, str]:
    """The server's environment: the worker's own (it is the user's command), without the worker's token."""
    return {k: v for k, v in os.environ.items() if k != TOKEN_ENV}


def too_big_answer(message: types.JSONRPCMessage, size: int, limit: int) -> str | None:
    """An error answer in place of a response over `limit` bytes (None when the message is not a response)."""
    request_id = getattr(message, "id", None)
    if request_id is None or hasattr(message, "method"):
        return None
    text = f"the server's answer is {size} bytes, over the worker's limit of {limit} (--max-message-bytes)"
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": INTERNAL_ERROR, "message": text}})


class Worker:
    """One worker: dial, serve until either end closes, dial again."""

    def __init__(self, url: str, token: str, command: str, args: Sequence[str], *, max_message_bytes: int) -> None:
        self.url, self._token = url, token
        self.command, self.args = command, list(args)
        self.max_message_bytes = max_message_bytes
        self._server_exited = False

    async def run(self) -> int:
        """Serve until refused for good (exit status 1), or until SIGTERM or SIGINT (0): the server is stopped
        with the connection, its process group included."""
        status = 0
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                nonlocal status
                status = await self._serve()
                tg.cancel_scope.cancel()

            tg.start_soon(serve)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for received in signals:
                    log.info("stopping", signal=signal.Signals(received).name)
                    tg.cancel_scope.cancel()
                    break
        return status

    async def _serve(self) -> int:
        backoff = Backoff(1.0, 30.0, healthy_after=30.0)
        while True:
            started = time.monotonic()
            served = False
            try:
                served = await self._once()
                log.info("connection ended; dialling again", url=self.url)
            except Refused as e:
                if e.code in FATAL:
                    log.error("the gateway refused this worker", url=self.url, reason=e.reason, code=e.code)
                    return 1
                log.warning("the gateway ended the connection", url=self.url, reason=e.reason, code=e.code)
                served = True
            except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as e:
                log.warning("cannot reach the gateway", url=self.url, reason=str(e) or type(e).__name__)
            healthy_for = time.monotonic() - started if served else 0.0
            delay = backoff.delay(healthy_for)
            log.info("next dial scheduled", delay_s=round(delay, 2))
            await anyio.sleep(delay)

    async def _once(self) -> bool:
        """One connection: True once it was open. Raises `Refused` when the gateway closed it with a reason."""
        headers = {"Authorization": f"Bearer {self._token}"}
        async with connect(
            self.url,
            additional_headers=headers,
            max_size=self.max_message_bytes,
            ping_interval=5,
            ping_timeout=10,
            open_timeout=10,
            close_timeout=2,
        ) as ws:
            log.info("connected to the gateway", url=self.url)
            self._server_exited = False
            params = StdioServerParameters(command=self.command, args=self.args, env=child_environment())
            try:
                async with stdio_client(params) as (read, write), anyio.create_task_group() as tg:
                    tg.start_soon(self._to_server, ws, write, tg.cancel_scope)
                    tg.start_soon(self._to_gateway, ws, read, tg.cancel_scope)
            except OSError as e:
                log.error("the local server cannot be started", command=self.command, reason=str(e))
                self._server_exited = True
                await ws.close(1011, "the worker's local server cannot be started")
            code, reason = ws.close_code, ws.close_reason or ""
        if not self._server_exited and code is not None and (code >= 4000 or code in (1001, 1008, 1009, 1011, 1012)):
            raise Refused(code, reason)
        return True

    async def _to_server(self, ws: ClientConnection, write: Any, done: anyio.CancelScope) -> None:
        """Gateway to server; the gateway's pings are answered here."""
        try:
            async for data in ws:
                try:
                    message = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
                except ValidationError:
                    log.warning("the gateway sent a message that is not JSON-RPC; dropped")
                    continue
                if isinstance(message, types.JSONRPCRequest) and message.method == "ping":
                    await ws.send(json.dumps({"jsonrpc": "2.0", "id": message.id, "result": {}}))
                    continue
                await write.send(SessionMessage(message))
        except ConnectionClosed:
            pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.warning("the local server stopped reading")
        done.cancel()

    async def _to_gateway(self, ws: ClientConnection, read: Any, done: anyio.CancelScope) -> None:
        """Server to gateway; an answer over the size limit becomes an error answer."""
        try:
            async for item in read:
                if isinstance(item, Exception):
                    log.warning("the local server wrote something that is not JSON-RPC", reason=str(item)[:200])
                    continue
                text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                size = len(text.encode())
                if size > self.max_message_bytes:
                    replacement = too_big_answer(item.message, size, self.max_message_bytes)
                    log.warning("message over the size limit", size=size, limit=self.max_message_bytes)
                    if replacement is None:
                        continue
                    text = replacement
                await ws.send(text)
            log.warning("the local server exited; closing the connection")
            self._server_exited = True
            await ws.close(1011, "the worker's local server exited")
        except ConnectionClosed:
            pass
        done.cancel()


def run_worker(
    connect_to: str, token: str | None, command: Sequence[str], *, name: str | None, max_message_bytes: int
) -> int:
    """`manifold worker`: the exit status."""
    if not command:
        log.error("give the server's command after --, e.g. `manifold worker --connect URL -- mcp-server-time`")
        return 2
    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        log.error(f"give the worker's token with --token or ${TOKEN_ENV}")
        return 2
    try:
        url = workers_url(connect_to, name or derive_name(command[0]))
    except (ValueError, InvalidURI) as e:
        log.error(str(e))
        return 2
    program = find_command(command[0], os.environ.get("PATH"))
    if not (os.sep in program and os.access(program, os.X_OK)):
        log.error("command not found", command=command[0])
        return 2
    worker = Worker(url, token, program, command[1:], max_message_bytes=max_message_bytes)
    try:
        return anyio.run(worker.run)
    except KeyboardInterrupt:
        return 130
