"""A call that may have reached the server is never sent twice, unless the tool is read-only or idempotent.

Between the gateway and a real HTTP upstream sits a TCP proxy on loopback that forwards everything, and
once armed, cuts the connection that carries the next `tools/call` of a chosen tool: the request goes
to the server, the server runs the tool and answers, and the proxy drops the answer and closes the
gateway's side of the connection. The cut call is the second call on a reused keep-alive connection,
the case the gateway's lean HTTP client once answered by sending the request again on a fresh one.
Both eras, with the fast path (the lean client) and without it (the SDK's client).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.fixtures.servers import run_http_fixture
from tests.integration.conftest import ERAS, EraClient, Gateway, connect, run_gateway, wait_until

pytestmark = pytest.mark.anyio

MAY_HAVE_RUN = "the connection closed before the answer; the call may have run"
ANSWER_WAIT = 10.0


@dataclass
class _Link:
    """One proxied connection: its number, the requests it carried so far, and whether it is to be cut."""

    number: int
    requests: int = 0
    cut: bool = False


@dataclass(frozen=True)
class Cut:
    """Where a cut happened: the connection and which request on it (1 = the first)."""

    connection: int
    request: int


class CuttingProxy:
    """A loopback TCP proxy for HTTP/1.1 that can cut the connection carrying one chosen request."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.bodies: list[bytes] = []  # every request body passed to the server, in order
        self.cuts: list[Cut] = []
        self._armed: re.Pattern[bytes] | None = None
        self._server: asyncio.Server | None = None
        self._links = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def url(self, path: str = "/mcp") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def arm(self, tool: str) -> None:
        """Cut the connection of the next `tools/call` of `tool` (its original name), once."""
        self._armed = re.compile(rb'"name"\s*:\s*"' + re.escape(tool.encode()) + rb'"')

    def calls_of(self, tool: str) -> int:
        """How many `tools/call` requests of `tool` reached the server."""
        pattern = re.compile(rb'"name"\s*:\s*"' + re.escape(tool.encode()) + rb'"')
        return sum(1 for b in self.bodies if b'"tools/call"' in b and pattern.search(b))

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every proxied connection; their handlers then end by themselves."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._links += 1
        link = _Link(self._links)
        self._writers.add(client_writer)
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            self._tasks.discard(task)
            return
        self._writers.add(server_writer)
        requests = asyncio.ensure_future(self._requests(link, client_reader, server_writer))
        try:
            await self._answers(link, server_reader, client_writer)
        finally:
            client_writer.transport.abort()
            server_writer.transport.abort()
            await asyncio.wait([requests], timeout=5)
            self._writers.difference_update((client_writer, server_writer))
            self._tasks.discard(task)

    async def _requests(
        self, link: _Link, client_reader: asyncio.StreamReader, server_writer: asyncio.StreamWriter
    ) -> None:
        """Gateway to server, one whole HTTP request at a time (so a request is judged by its body)."""
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            while True:
                head = await client_reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                    elif name.strip().lower() == b"transfer-encoding":
                        raise AssertionError("the proxy does not handle chunked requests")
                body = await client_reader.readexactly(length) if length else b""
                link.requests += 1
                if self._armed is not None and b'"tools/call"' in body and self._armed.search(body):
                    self._armed = None
                    link.cut = True
                    self.cuts.append(Cut(link.number, link.requests))
                self.bodies.append(body)
                server_writer.write(head + body)
                await server_writer.drain()
        server_writer.transport.abort()

    async def _answers(
        self, link: _Link, server_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        """Server to gateway, verbatim; on a connection to cut, wait for the server's answer (so the tool
        surely ran), drop it, and close the gateway's side."""
        held = b""
        with contextlib.suppress(ConnectionError, TimeoutError):
            while True:
                data = (
                    await asyncio.wait_for(server_reader.read(65536), ANSWER_WAIT)
                    if link.cut
                    else (await server_reader.read(65536))
                )
                if not data:
                    return
                if link.cut:
                    held += data
                    if b'"result"' in held or b'"error"' in held:
                        return  # the caller's side is closed by _accept, the answer never reaches it
                    continue
                client_writer.write(data)
                await client_writer.drain()


@asynccontextmanager
async def cutting_proxy(target_port: int) -> AsyncIterator[CuttingProxy]:
    proxy = CuttingProxy(target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def _states(gw: Gateway, server: str) -> list[str]:
    """The states the gateway has logged for `server`, oldest first."""
    return [e["state"] for e in gw.log_events() if e.get("event") == "upstream state" and e.get("server") == server]


async def _settled(gw: Gateway, client: EraClient, seen: int) -> None:
    """Wait until `web` is up and listed again, if the lost answer made the gateway reconnect at all."""
    await anyio.sleep(0.5)  # a reconnect starts within milliseconds of the failed call

    def settled() -> bool:
        states = _states(gw, "web")
        return len(states) == seen or states[-1:] == ["up"]

    await wait_until(settled, 20, "web to be up again")
    await client.wait_for(lambda n: {"web__tick", "web__ticks", "web__echo"} <= set(n))


async def _quiet(proxy: CuttingProxy, period: float = 0.3) -> None:
    """Wait until no request has reached the proxy for `period` seconds, so every pooled connection is idle
    (a listing the gateway sends after a reconnect, or an answer still being read, would take one up)."""
    with anyio.fail_after(10):
        while True:
            seen = len(proxy.bodies)
            await anyio.sleep(period)
            if len(proxy.bodies) == seen:
                return


async def _call_on_a_reused_connection(client: EraClient, proxy: CuttingProxy, tool: str) -> Any:
    """Warm the gateway's pooled connection with a call, then call `tool` with the proxy armed for it."""
    await _quiet(proxy)
    warm = await client.call("web__echo", {"text": "warm"})
    assert warm.is_error is False, warm.content[0].text
    await _quiet(proxy)
    proxy.arm(tool)
    return await client.call(f"web__{tool}")


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sdk-path"])
@pytest.mark.parametrize("era", ERAS)
async def test_a_call_whose_answer_was_lost_is_not_sent_again(tmp_path: Path, era: str, fast_path: bool) -> None:
    with run_http_fixture(name="web") as web:
        async with cutting_proxy(web.port) as proxy:
            config = {"fast_path": fast_path, "servers": {"web": {"url": proxy.url()}}}
            with run_gateway(tmp_path, config) as gw:
                async with connect(gw.url, era) as client:
                    await client.wait_for(lambda n: {"web__tick", "web__ticks", "web__echo"} <= set(n))

                    # A tool that is neither read-only nor idempotent: the cut call ran once and is not re-sent.
                    seen = len(_states(gw, "web"))
                    result = await _call_on_a_reused_connection(client, proxy, "tick")
                    assert len(proxy.cuts) == 1, "the proxy never saw the tick call"
                    assert proxy.cuts[0].request >= 2, f"the cut call was not on a reused connection: {proxy.cuts}"
                    assert proxy.calls_of("tick") == 1, f"tick reached the server {proxy.calls_of('tick')} times"
                    assert result.is_error is True, f"expected an error, got {result.content}"
                    text = result.content[0].text
                    assert "server 'web'" in text, text
                    assert MAY_HAVE_RUN in text, text

                    if fast_path:
                        # Only that exchange broke: the server stays up and its next call goes straight through.
                        at_once = await client.call("web__ticks")
                        assert at_once.is_error is False and at_once.content[0].text == "1", at_once.content
                        assert len(_states(gw, "web")) == seen, f"web reconnected: {_states(gw, 'web')}"

                    # The server's own count agrees.
                    await _settled(gw, client, seen)
                    count = await client.call("web__ticks")
                    assert count.is_error is False, count.content[0].text
                    assert count.content[0].text == "1"

                    # A read-only tool through the same cut is retried and succeeds.
                    retried = await _call_on_a_reused_connection(client, proxy, "ticks")
                    assert len(proxy.cuts) == 2, "the proxy never saw the ticks call"
                    assert proxy.cuts[1].request >= 2, f"the cut call was not on a reused connection: {proxy.cuts}"
                    assert retried.is_error is False, retried.content[0].text
                    assert retried.content[0].text == "1"
                    assert proxy.calls_of("tick") == 1
                    assert proxy.calls_of("ticks") >= 3  # the count, the cut call and its retry
