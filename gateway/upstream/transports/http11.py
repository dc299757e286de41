"""A lean HTTP/1.1 client for tool calls to streamable HTTP servers: keep-alive sockets, httptools parsing.

The SDK's client sends each request through memory streams, a task per POST and a general HTTP stack;
on the hot path that cost more CPU than the rest of the gateway. This client sends one POST per call
on a pooled keep-alive connection and reads the answer as JSON or as an SSE stream (relaying
progress). Status handling mirrors the SDK's transport, so failures map the same way. Everything
else (negotiation, listings, listen streams, GET streams) stays on the SDK's session.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from functools import cache
from typing import Any, Protocol, cast
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import httptools
import httpx2
from mcp.shared.dispatcher import ProgressFnT

from gateway import __version__
from gateway.protocol.errors import (
    AnswerLost,
    BadAnswer,
    ChannelError,
    HttpStatus,
    NotSent,
    SessionExpired,
    Unauthorized,
)
from gateway.protocol.jsonrpc import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    decode,
    encode,
    lines_in,
    report_progress,
)

Json = dict[str, Any]
MAX_IDLE = 64
MAX_IDLE_SECONDS = 2.0
MAX_ANSWER = 64 * 1024 * 1024
NOTIFY_TIMEOUT = 5.0


class Bearer(Protocol):
    """Where a server's access tokens come from (`gateway.upstream.tokens.TokenSource`)."""

    async def token(self) -> str:
        """A good access token."""
        ...

    async def refused(self, value: str) -> str:
        """The server refused `value`: the token to try once more."""
        ...


def uses_proxy(url: str) -> bool:
    """Whether the environment routes this URL through a proxy (the lean client does not speak to proxies)."""
    parts = urlsplit(url)
    proxies = getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not proxy_bypass(parts.hostname or "")


class _Exchange:
    """One response as it arrives: status and headers, then body chunks."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.head: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = False
        self.error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _arrival(self) -> bool:
        """Wait until more of the body is here (True) or it has ended (False). Raises `AnswerLost` if the
        connection broke."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return True

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        if not await self._arrival():
            return None
        data = b"".join(self.chunks)
        self.chunks.clear()
        return data

    async def read(self) -> bytes:
        """The whole body, joined once."""
        parts: list[bytes] = []
        while await self._arrival():
            parts += self.chunks
            self.chunks.clear()
        return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls the on_* methods as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reusable = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(AnswerLost(f"malformed HTTP answer: {e}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        exchange = self.exchange
        if exchange is not None and not exchange.complete:
            self._fail(AnswerLost("the server closed the connection"))

    def _fail(self, error: Exception) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        exchange.error = error
        if not exchange.head.done():
            exchange.head.set_exception(error)
        exchange.wake()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.exchange is not None:
            self.exchange.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.status = self.parser.get_status_code()
            if not exchange.head.done():
                exchange.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.size += len(body)
            if exchange.size > MAX_ANSWER:
                self._fail(AnswerLost(f"the answer is over {MAX_ANSWER // (1024 * 1024)} MiB"))
                self.close()
                return
            exchange.chunks.append(body)
            exchange.wake()

    def on_message_complete(self) -> None:
        exchange = self.exchange
        self.reusable = self.parser.should_keep_alive()
        if exchange is not None:
            exchange.complete = True
            exchange.wake()

    def send(self, data: bytes) -> _Exchange:
        """Write a request; raises `NotSent` when the connection is found closed before a byte is written."""
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            raise NotSent("the connection was closed before the request was written")
        self.exchange = _Exchange()
        self.reusable = False
        try:
            transport.write(data)
        except RuntimeError:  # uvloop refuses a write to a transport closed under it, before writing anything
            raise NotSent("the connection was closed before the request was written") from None
        return self.exchange

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_LONE_CR = re.compile(rb"\r(?!\n)")


def _has_lone_cr(chunk: bytes) -> bool:
    """Whether a CR in `chunk` is not followed by an LF (a chunk's last byte counts as lone)."""
    at = chunk.find(b"\r")
    while at >= 0:
        if chunk[at + 1 : at + 2] != b"\n":
            return True
        at = chunk.find(b"\r", at + 2)
    return False


class SseEvents:
    """The data of a server-sent event stream's events, taken as the stream's chunks arrive.

    Lines end in LF, CRLF or a lone CR. Each byte is looked at once: a 1 MiB answer on one `data:` line
    costs one copy out of the buffer, not one per chunk that brought it.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # where the search for the next line end resumes
        self._data: list[bytearray] = []
        self._after_cr = False  # the last chunk ended in a CR, already taken as a line end

    def feed(self, chunk: bytes) -> list[bytes | bytearray]:
        """Add a chunk; returns the data of the events it completed, in order."""
        if not chunk:
            return []
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = chunk[-1:] == b"\r"
        if _has_lone_cr(chunk):
            chunk = _LONE_CR.sub(b"\n", chunk)
        buffer = self._buffer
        buffer += chunk
        events: list[bytes | bytearray] = []
        start = 0
        while (newline := buffer.find(b"\n", self._scanned)) >= 0:
            end = newline - 1 if newline > start and buffer[newline - 1] == 13 else newline
            if end == start:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
            elif buffer.startswith(b"data:", start):
                value = start + 5
                if value < end and buffer[value] == 32:
                    value += 1
                self._data.append(buffer[value:end])
            start = self._scanned = newline + 1
        del buffer[:start]  # cheap: a bytearray drops its front without moving the rest
        self._scanned = len(buffer)
        return events


@cache
def tls_context() -> ssl.SSLContext:
    """The TLS context, built once: as the SDK's client builds it (trust store, SSL_CERT_FILE and friends)."""
    return httpx2.create_ssl_context()


class HttpWire:
    """POSTs requests to one MCP endpoint over pooled keep-alive connections.

    A request is sent again only when it provably never left: the pooled connection was found closed
    before a byte was written. A connection that breaks after that raises `AnswerLost`: the request
    may have run. Idle connections are reused for at most `MAX_IDLE_SECONDS`, under the keep-alive
    timeout of common servers, so a server closing an idle connection rarely meets a request in flight.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        session_id: Callable[[], str | None],
        *,
        address: str | None = None,
        forwarded: Callable[[], Mapping[str, str] | None] = lambda: None,
        connect_timeout: float = 30.0,
        auth: Bearer | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._address = address or self.host
        self._ssl: ssl.SSLContext | None = tls_context() if parts.scheme == "https" else None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        host = self.host if ":" not in self.host else f"[{self.host}]"
        authority = host if default_port else f"{host}:{self.port}"
        self._line = f"POST {target} HTTP/1.1\r\n".encode()
        fixed = {
            "host": authority,
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "user-agent": f"manifold/{__version__}",
            **{k.lower(): v for k, v in headers.items()},
        }
        self._fixed = fixed
        self._session_id = session_id
        self._forwarded = forwarded
        self._connect_timeout = connect_timeout
        self._auth = auth
        self._idle: list[tuple[float, _Connection]] = []
        self._busy: set[_Connection] = set()
        self._refusals: set[asyncio.Task[None]] = set()
        self.closed = False

    def _release(self, conn: _Connection) -> None:
        """Back to the pool after a complete answer; closed when it cannot be reused or the pool is closed."""
        self._busy.discard(conn)
        if conn.reusable and not conn.closed and not self.closed and len(self._idle) < MAX_IDLE:
            conn.exchange = None
            self._idle.append((time.monotonic(), conn))
        else:
            conn.close()

    def _take_idle(self) -> _Connection | None:
        fresh_after = time.monotonic() - MAX_IDLE_SECONDS
        while self._idle:
            since, conn = self._idle.pop()
            transport = conn.transport
            if since >= fresh_after and not conn.closed and transport is not None and not transport.is_closing():
                return conn
            conn.close()
        return None

    async def _open(self) -> _Connection:
        """A connection to send on: a pooled one still open, else a new one. Raises `NotSent`."""
        if self.closed:
            raise NotSent("the connection pool is closed")
        conn = self._take_idle()
        if conn is None:
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._connect_timeout):
                    _, conn = await loop.create_connection(
                        _Connection,
                        self._address,
                        self.port,
                        ssl=self._ssl,
                        server_hostname=self.host if self._ssl is not None else None,
                    )
            except (OSError, TimeoutError) as e:
                raise NotSent(f"cannot connect: {e.__class__.__name__}") from None
        self._busy.add(conn)
        return conn

    def _head(self, body: bytes, extra: Mapping[str, str], token: str | None = None) -> bytes:
        headers = dict(self._fixed)
        session_id = self._session_id()
        if session_id:
            headers["mcp-session-id"] = session_id
        for name, value in extra.items():
            headers[name.lower()] = value
        for name, value in (self._forwarded() or {}).items():
            headers[name.lower()] = value
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        headers["content-length"] = str(len(body))
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return self._line + lines.encode("latin-1") + b"\r\n" + body

    async def request(self, message: Json, headers: Mapping[str, str], progress: ProgressFnT | None) -> Json:
        """POST one request and return the JSON-RPC response to it. With an access token, a 401 answer renews the
        token and sends the request once more (the server refused it, so it did not run).

        Raises `NotSent`, `AnswerLost`, `SessionExpired`, `Unauthorized`, `NoToken`, `HttpStatus` or `BadAnswer`.
        """
        body = encode(message)
        if self._auth is None:
            return await self._send(body, message.get("id"), headers, progress, None)
        token = await self._auth.token()
        try:
            return await self._send(body, message.get("id"), headers, progress, token)
        except Unauthorized:
            token = await self._auth.refused(token)
        try:
            return await self._send(body, message.get("id"), headers, progress, token)
        except Unauthorized:
            raise Unauthorized("HTTP 401, also with a renewed access token") from None

    async def _send(
        self, body: bytes, request_id: Any, headers: Mapping[str, str], progress: ProgressFnT | None, token: str | None
    ) -> Json:
        data = self._head(body, headers, token)
        conn = await self._open()
        try:
            exchange = conn.send(data)
            await exchange.head
            reply = await self._answer(exchange, request_id, progress, headers)
        except Unauthorized:
            self._release(conn)  # a whole answer: the connection stays usable
            raise
        except BaseException:
            self._busy.discard(conn)
            conn.close()  # on the 2026 wire, dropping the POST is the cancellation
            raise
        self._release(conn)
        return reply

    async def _answer(
        self, exchange: _Exchange, request_id: Any, progress: ProgressFnT | None, headers: Mapping[str, str]
    ) -> Json:
        status = exchange.status
        content_type = exchange.headers.get(b"content-type", b"").lower()
        if status == 202:
            await exchange.read()
            raise BadAnswer(INVALID_REQUEST, "server answered a request with 202 Accepted")
        if 300 <= status < 400:
            await exchange.read()
            raise BadAnswer(INVALID_REQUEST, f"the server redirected the call (HTTP {status}); not followed")
        if status == 401:
            await exchange.read()
            raise Unauthorized("HTTP 401: the server refused the credentials")
        if status >= 400:
            raw = await exchange.read()
            if content_type.startswith(b"application/json"):
                with suppress(ValueError):
                    parsed = decode(raw)
                    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                        return {"jsonrpc": "2.0", "id": request_id, "error": parsed["error"]}
            if status == 404:
                if self._session_id() is None:
                    raise BadAnswer(METHOD_NOT_FOUND, "Not Found")
                raise SessionExpired("HTTP 404 on the session")
            raise HttpStatus(status)
        if content_type.startswith(b"application/json"):
            body = await exchange.read()
            try:
                # one value, the common case: parsed at once (searching the body for line breaks first cost more
                # than the parse: a byte-by-byte search of the whole answer)
                reply = decode(body)
            except ValueError:
                # several values, one per line (some servers answer a request with its notices, then its answer)
                if (several := lines_in(body)) is None:
                    raise BadAnswer(PARSE_ERROR, "Failed to parse JSON response") from None
                for message in several:
                    if (answer := await self._take(message, request_id, progress, headers)) is not None:
                        return answer
                raise BadAnswer(PARSE_ERROR, "the JSON body held no answer to the request") from None
            if not isinstance(reply, dict):
                raise BadAnswer(PARSE_ERROR, "Failed to parse JSON response")
            return reply
        if content_type.startswith(b"text/event-stream"):
            return await self._stream(exchange, request_id, progress, headers)
        await exchange.read()
        raise BadAnswer(INVALID_REQUEST, f"Unexpected content type: {content_type.decode('latin-1')[:80]}")

    async def _stream(
        self, exchange: _Exchange, request_id: Any, progress: ProgressFnT | None, headers: Mapping[str, str]
    ) -> Json:
        events = SseEvents()
        while (chunk := await exchange.next_chunk()) is not None:
            for data in events.feed(chunk):
                try:
                    message = decode(data)
                except ValueError:
                    continue
                if (answer := await self._take(message, request_id, progress, headers)) is not None:
                    await _drain(exchange)
                    return answer
        raise AnswerLost("the event stream ended without an answer")

    async def _take(
        self, message: Any, request_id: Any, progress: ProgressFnT | None, headers: Mapping[str, str]
    ) -> Json | None:
        """One message that came with the answer: the answer itself (returned), a progress notice, or a request
        of the server's (refused)."""
        if not isinstance(message, dict):
            return None
        if message.get("id") == request_id and ("result" in message or "error" in message):
            return message
        if message.get("method") == "notifications/progress" and progress is not None:
            await report_progress(message.get("params"), progress)
        elif "method" in message and "id" in message:
            self._refuse(message, headers)
        return None

    def _refuse(self, request: Json, headers: Mapping[str, str]) -> None:
        """Answer a server's request made during a lean call: its caller cannot be asked anything."""
        reason = f"{request.get('method')} cannot be relayed: the client did not declare the capability"
        refusal = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": INVALID_REQUEST, "message": reason}}
        task = asyncio.get_running_loop().create_task(self.notify(refusal, headers))
        self._refusals.add(task)
        task.add_done_callback(self._refusals.discard)

    async def notify(self, message: Json, headers: Mapping[str, str]) -> None:
        """POST one notification (e.g. a 2025-era cancel); failures are ignored, the connection closed on one."""
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(NOTIFY_TIMEOUT):
                token = await self._auth.token() if self._auth is not None else None
                conn = await self._open()
                exchange = conn.send(self._head(encode(message), headers, token))
                await exchange.head
                await exchange.read()
        except (ChannelError, OSError, TimeoutError, RuntimeError):
            if conn is not None:
                self._busy.discard(conn)
                conn.close()
            return
        self._release(conn)

    def close(self) -> None:
        """Close every connection, pooled or in use; calls still in flight end with `AnswerLost`."""
        self.closed = True
        for _, conn in self._idle:
            conn.close()
        self._idle.clear()
        for conn in list(self._busy):
            conn.close()
        self._busy.clear()


async def _drain(exchange: _Exchange) -> None:
    """Read what is left of an answered stream, so its connection can be reused."""
    if exchange.complete:
        return
    with suppress(AnswerLost, TimeoutError):
        async with asyncio.timeout(1.0):
            await exchange.read()
