"""stdio upstreams: one process group per server, its pipes, and the lean request channel that shares them.

As the SDK's `stdio_client` does, the whole process group is terminated on every stop (SIGTERM, then
SIGKILL after a grace period), including grandchildren (npx, shells) of a server that already exited. This
module runs the process itself for what the SDK's client does not do: the server's stderr goes to the
structured log line by line, rate-limited, and the lean channel below shares the server's pipes.

Calls go over `DirectChannel`: the request is written straight to the server's stdin and its answer
(and progress) is taken off stdout before the SDK's session would parse it, so the hot path pays for
one JSON encode and one decode. Direct requests use ids from 2**40 up, far from the session's own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp.types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from gateway.observe.logs import get_logger, redact_text
from gateway.policy.bucket import Throttle, TokenBucket
from gateway.protocol.errors import AnswerLost, NotSent
from gateway.protocol.jsonrpc import decode, encode, report_progress
from gateway.upstream.invoke import FIRST_ID
from gateway.upstream.transports.spawn import spawn

if TYPE_CHECKING:
    from gateway.upstream.sandbox import Sandbox

Json = dict[str, Any]


def encode_line(message: Json) -> bytes:
    """One newline-terminated JSON-RPC frame."""
    return encode(message) + b"\n"


def parse_line(line: bytes, message: Any = None) -> SessionMessage | Exception:
    """One stdout line (or its already decoded `message`) as a JSON-RPC message for the SDK session,
    or the parse error as a value."""
    try:
        if message is None:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False))
    except ValidationError as exc:
        return exc


class DirectChannel:
    """Direct request/response over newline-delimited JSON-RPC, sharing the pipes with an SDK session."""

    def __init__(self) -> None:
        self._write: Callable[[bytes], Awaitable[None]] | None = None
        self._pending: dict[int, asyncio.Future[Json]] = {}
        self._progress: dict[int, ProgressFnT] = {}
        self.closed = False

    def attach(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Bind the channel to the server's stdin writer."""
        self._write = write

    async def request(self, message: Json, headers: Mapping[str, str], progress: ProgressFnT | None) -> Json:
        """Send a request (its integer `id` from FIRST_ID up) and return the server's JSON-RPC response.

        Raises `NotSent` when the pipes were already closed, `AnswerLost` when they close before the answer.
        """
        if self._write is None or self.closed:
            raise NotSent("the server's pipes are closed")
        request_id: int = message["id"]
        future: asyncio.Future[Json] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if progress is not None:
            self._progress[request_id] = progress
        try:
            try:
                await self._write(encode_line(message))
            except anyio.ClosedResourceError:
                raise NotSent("the server's stdin is closed") from None
            except (OSError, anyio.BrokenResourceError) as e:
                raise AnswerLost(str(e) or "broken pipe") from None  # part of the line may have reached it
            return await future
        finally:
            self._pending.pop(request_id, None)
            self._progress.pop(request_id, None)

    async def notify(self, message: Json, headers: Mapping[str, str]) -> None:
        """Write a notification (e.g. a cancel); a closed pipe means there is nothing left to tell."""
        if self._write is None or self.closed:
            return
        with suppress(OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self._write(encode_line(message))

    async def take(self, line: bytes) -> SessionMessage | Exception | None:
        """Route one stdout line: None when it answered (or reported progress on) a direct call, else the
        message (or its parse error) for the SDK session."""
        try:
            message = decode(line)
        except ValueError:
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
        return parse_line(line, message)

    def close(self) -> None:
        """Fail every waiting call: the pipes are gone."""
        self.closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(AnswerLost("the server's pipes closed during the call"))


log = get_logger("stdio")

STDIN_CLOSE_GRACE = 2.0
TERM_GRACE = 2.0
STDERR_LINES_PER_SECOND = 20.0
STDERR_BURST = 100
MAX_LINE = 64 * 1024 * 1024
MAX_STDERR_LINE = 64 * 1024


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _group_gone(pgid: int, timeout: float) -> bool:
    with anyio.move_on_after(timeout):
        while _signal_group(pgid, 0):
            await anyio.sleep(0.02)
        return True
    return False


async def stop_process_group(process: anyio.abc.Process, pgid: int) -> None:
    """Close stdin, give the server a moment, then SIGTERM and finally SIGKILL its whole group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(STDIN_CLOSE_GRACE):
        await process.wait()
    if _signal_group(pgid, signal.SIGTERM) and not await _group_gone(pgid, TERM_GRACE):
        _signal_group(pgid, signal.SIGKILL)
        await _group_gone(pgid, TERM_GRACE)
    with anyio.move_on_after(TERM_GRACE):
        await process.wait()


class LineSplitter:
    """Splits a byte stream into lines of at most `limit` bytes; a longer line is dropped whole and counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dropped = 0
        self._parts: list[bytes] = []  # the current line's chunks: joined once, not re-copied per chunk
        self._size = 0
        self._skipping = False  # inside a line already over the limit

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that `chunk` completes (without their newlines)."""
        if b"\n" not in chunk:
            self._hold(chunk)
            return []
        first, *middle, rest = chunk.split(b"\n")
        lines = []
        if not self._skipping and self._size + len(first) <= self.limit:
            lines.append(b"".join((*self._parts, first)) if self._parts else first)  # one copy
        elif not self._skipping:
            self.dropped += 1
        self._parts, self._size, self._skipping = [], 0, False
        for line in middle:
            if len(line) <= self.limit:
                lines.append(line)
            else:
                self.dropped += 1
        self._hold(rest)
        return lines

    def _hold(self, piece: bytes) -> None:
        if self._skipping or not piece:
            return
        self._size += len(piece)
        if self._size > self.limit:
            self._parts, self._size, self._skipping = [], 0, True
            self.dropped += 1
        else:
            self._parts.append(piece)


async def _lines(stream: anyio.abc.ByteReceiveStream, limit: int, server: str, name: str) -> AsyncIterator[bytes]:
    """The lines of a process's output stream; a line over `limit` bytes is dropped and logged."""
    splitter = LineSplitter(limit)
    async for chunk in stream:
        lines = splitter.feed(chunk)
        if splitter.dropped:
            log.warning(f"upstream {name} line too long; dropped", server=server, limit=limit)
            splitter.dropped = 0
        for line in lines:
            yield line


def find_command(command: str, path: str | None) -> str:
    """A bare command name found on `path`, else next to the gateway's own interpreter (its venv's `bin`);
    a command with a directory part, or one found nowhere, is returned as given (the start then says so)."""
    if os.sep in command:
        return command
    found = shutil.which(command, path=path)
    if found is not None:
        return found
    beside = Path(sys.executable).parent / command
    return str(beside) if os.access(beside, os.X_OK) and beside.is_file() else command


@asynccontextmanager
async def stdio_transport(
    server: str,
    command: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str | None,
    direct: DirectChannel | None = None,
    sandbox: Sandbox | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Run `command` in its own process group and exchange newline-delimited JSON-RPC with it.

    With `direct`, answers to the channel's own requests are taken off stdout before the session sees them; with
    `sandbox`, the command runs inside it.
    """
    environment = {**get_default_environment(), **env}
    argv = [find_command(command, environment.get("PATH")), *args]
    if sandbox is not None:
        argv, environment, cwd = sandbox.wrap(argv, environment, cwd, env)
    process = await spawn(argv, environment, cwd)
    pgid = process.pid
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    log.info("upstream process started", server=server, pid=process.pid)
    assert process.stdin is not None
    if direct is not None:
        direct.attach(process.stdin.send)

    async def stdout_reader() -> None:
        async with read_writer:
            with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_lines()
            if direct is not None:
                direct.close()

    async def read_lines() -> None:
        assert process.stdout is not None
        garbage_budget = TokenBucket(1.0, 10)
        async for line in _lines(process.stdout, MAX_LINE, server, "stdout"):
            if line.strip():
                item = await direct.take(line) if direct is not None else parse_line(line)
                if item is None:
                    continue
                if isinstance(item, Exception) and garbage_budget.take() == 0:
                    log.warning("upstream wrote a line that is not JSON-RPC", server=server)
                await read_writer.send(item)

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()
        finally:
            if direct is not None:
                direct.close()

    async def stderr_reader() -> None:
        assert process.stderr is not None
        throttle = Throttle(STDERR_LINES_PER_SECOND, STDERR_BURST)
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for line in _lines(process.stderr, MAX_STDERR_LINE, server, "stderr"):
                if (dropped := throttle.admit()) is None:
                    continue
                if dropped:
                    log.warning("upstream stderr lines suppressed", server=server, count=dropped)
                text = redact_text(line.decode(errors="replace").rstrip())[:2000]
                log.info("upstream stderr", server=server, line=text)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(stderr_reader)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                write_stream.close()
                await stop_process_group(process, pgid)
                await process.aclose()
                log.info("upstream process stopped", server=server, pid=process.pid, code=process.returncode)
                if sandbox is not None:
                    await sandbox.exited(process.returncode)
            tg.cancel_scope.cancel()
