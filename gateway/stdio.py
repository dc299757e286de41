"""stdio upstream transport: one process group per server, stderr into the log, nothing left behind.

Unlike the SDK's `stdio_client`, the whole process group is terminated on every stop (SIGTERM,
then SIGKILL after a grace period), including grandchildren (npx, shells) of a server that already
exited, and the server's stderr goes to the structured log line by line, rate-limited.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from gateway.bucket import TokenBucket
from gateway.direct import DirectChannel
from gateway.logs import get_logger, redact_text

log = get_logger("stdio")

STDIN_CLOSE_GRACE = 2.0
TERM_GRACE = 2.0
STDERR_LINES_PER_SECOND = 20.0
STDERR_BURST = 100
MAX_LINE = 64 * 1024 * 1024


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
        with suppress(Exception):
            await process.stdin.aclose()
    with anyio.move_on_after(STDIN_CLOSE_GRACE):
        await process.wait()
    if _signal_group(pgid, signal.SIGTERM) and not await _group_gone(pgid, TERM_GRACE):
        _signal_group(pgid, signal.SIGKILL)
        await _group_gone(pgid, TERM_GRACE)
    with anyio.move_on_after(TERM_GRACE):
        await process.wait()


def parse_line(line: bytes) -> SessionMessage | Exception:
    """One stdout line as a JSON-RPC message, or the parse error as a value for the session."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValidationError as exc:
        return exc


@asynccontextmanager
async def stdio_transport(
    server: str,
    command: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str | None,
    direct: DirectChannel | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Run `command` in its own process group and exchange newline-delimited JSON-RPC with it.

    With `direct`, answers to the channel's own requests are taken off stdout before the session sees them.
    """
    process = await anyio.open_process(
        [command, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**get_default_environment(), **env},
        cwd=cwd,
        start_new_session=True,
    )
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
        parts: list[bytes] = []  # a line's chunks so far: joined once, not re-copied per chunk
        size = 0
        garbage_budget = TokenBucket(1.0, 10)
        async for chunk in process.stdout:
            if b"\n" not in chunk:
                size += len(chunk)
                parts.append(chunk)
                if size > MAX_LINE:
                    log.warning("upstream stdout line too long; dropped", server=server)
                    parts, size = [], 0
                continue
            *lines, rest = (b"".join(parts) + chunk if parts else chunk).split(b"\n")
            parts, size = ([rest], len(rest)) if rest else ([], 0)
            for line in lines:
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
        budget = TokenBucket(STDERR_LINES_PER_SECOND, STDERR_BURST)
        dropped = 0
        buffer = b""
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if budget.take() > 0:
                        dropped += 1
                    else:
                        if dropped:
                            log.warning("upstream stderr lines suppressed", server=server, count=dropped)
                            dropped = 0
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
                log.info("upstream process stopped", server=server, pid=process.pid, code=process.returncode)
            tg.cancel_scope.cancel()
