"""Starting a stdio server's process so that its pipes reach that process alone.

uvloop's spawn (libuv) leaves the child's ends of its pipes open in the child a second time, under other numbers
and inheritable, so every process the server starts in turn holds the gateway's pipes too. A server that dies while
a child of its own lives on (a browser, a daemon, a shell's background job) then never closes its output, and the
gateway never learns it is gone. The standard library's `subprocess` closes every descriptor but the three; the
running loop's own pipe transports carry them from there.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO

import anyio
import anyio.abc

EXIT_POLL = 0.02  # seconds between looks at a process that is expected to exit


class _PipeReader(anyio.abc.ByteReceiveStream):
    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
        self._reader, self._transport = reader, transport

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        self._transport.close()


class _PipeWriter(anyio.abc.ByteSendStream):
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, item: bytes) -> None:
        if self._writer.is_closing():
            raise anyio.ClosedResourceError
        try:
            self._writer.write(item)
            await self._writer.drain()
        except (ConnectionResetError, BrokenPipeError) as e:
            raise anyio.BrokenResourceError from e

    async def aclose(self) -> None:
        self._writer.close()


class SpawnedProcess(anyio.abc.Process):
    """A child process started by `spawn`, with its three pipes as anyio streams."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: _PipeWriter, stdout: _PipeReader, stderr: _PipeReader):
        self._popen = popen
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr

    async def wait(self) -> int:
        while (code := self._popen.poll()) is None:
            await anyio.sleep(EXIT_POLL)
        return code

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, sig: signal.Signals) -> None:
        self._popen.send_signal(sig)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    @property
    def stdin(self) -> anyio.abc.ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def aclose(self) -> None:
        """Close the three pipes (the process itself is left as it is)."""
        for stream in (self._stdin, self._stdout, self._stderr):
            await stream.aclose()


async def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> SpawnedProcess:
    """Start `argv` with three pipes and no other descriptor of the gateway's, in a session of its own."""
    # A fork and exec, in the loop's thread as uvloop's own spawn is.
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
        bufsize=0,
    )
    try:
        return SpawnedProcess(
            popen, await _writer(popen.stdin), await _reader(popen.stdout), await _reader(popen.stderr)
        )
    except BaseException:
        popen.kill()
        raise


async def _reader(pipe: IO[bytes] | None) -> _PipeReader:
    assert pipe is not None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return _PipeReader(reader, transport)


async def _writer(pipe: IO[bytes] | None) -> _PipeWriter:
    assert pipe is not None
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop), pipe
    )
    return _PipeWriter(asyncio.StreamWriter(transport, protocol, None, loop))
