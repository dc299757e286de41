"""uvicorn's private names: the exit status after a drain, and the HTTP limits of the connections it serves."""

from __future__ import annotations

import asyncio
import http
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.protocol.jsonrpc import encode, error_body


def keep_exit_status_clean(server: uvicorn.Server) -> None:
    """Forget the signals uvicorn caught, so it exits 0 after a drain instead of re-raising SIGTERM."""
    server._captured_signals.clear()


@dataclass(frozen=True)
class ConnectionLimits:
    """What one HTTP connection may hold: the bytes of a request's head, the seconds its head and its body may
    take to arrive, and how many connections are open at once."""

    max_header_bytes: int
    header_timeout: float
    body_timeout: float
    max_connections: int


class _LimitedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, bounded (httptools itself sets no bound on a request's head):

    - the head (request line and headers) may hold `max_header_bytes`: past them, 431 and the connection closes;
    - the head must be whole `header_timeout` seconds after the connection opened, or after its first byte came
      on a kept-alive connection: else 408 and it closes (an idle new connection, a head sent byte by byte);
    - the body must be whole `body_timeout` seconds after the request started: else 408 and it closes, and the
      app sees the client gone (the gate then acts on no part of the body);
    - past `max_connections` open connections, a new one gets 503 and is closed at once.
    """

    limits: ClassVar[ConnectionLimits]
    on_refusal: ClassVar[Callable[[str], None]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the bytes that come next belong to a request's head
        self._head_bytes = 0
        self._heads_done = 0  # heads completed, to tell whether one completed within a chunk
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "connections", f"over {self.limits.max_connections} connections are open")
            return
        self._arm(self.limits.header_timeout, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        whole_chunk_in_head = self._in_head
        if self._in_head and self._deadline is None:
            self._arm(self.limits.header_timeout, "header_timeout")
        heads_done = self._heads_done
        super().data_received(data)
        if self._refused or self.transport.is_closing() or not self._in_head:
            return
        if whole_chunk_in_head and heads_done == self._heads_done:
            # The chunk is all head. (A head that began inside a chunk, after another request, is counted from
            # its next chunk on: at most one read more is held.)
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(431, "header_too_large", f"request head over {self.limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._heads_done += 1
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._disarm()
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if cycle.more_body:  # its body is still coming: it has `body_timeout` from now
            self._arm(self.limits.body_timeout, "body_timeout")
        super()._start_asgi_task(cycle, app)

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the WebSocket protocol has the connection from here
        super().handle_websocket_upgrade()

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, reason: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if reason == "header_timeout" and cycle is not None and not cycle.response_complete:
            self._refuse(None, reason, "")  # a response is under way: no room for another
        elif reason == "body_timeout" and cycle is not None:
            cycle.disconnected = True  # the app's receive() says the client is gone; what it sends is dropped
            cycle.message_event.set()
            self._refuse(None if cycle.response_started else 408, reason, "the request body did not arrive in time")
        else:
            self._refuse(408, reason, "the request head did not arrive in time")

    def _refuse(self, status: int | None, reason: str, message: str) -> None:
        """Answer `status` (None: nothing) and close the connection; count `reason`."""
        self._refused = True
        self._disarm()
        type(self).on_refusal(reason)
        if status is not None:
            body = encode(error_body(-32600, message[:200]))
            head = f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            head += f"content-length: {len(body)}\r\nconnection: close\r\n"
            head += "retry-after: 1\r\n" if status == 503 else ""
            self.transport.write(head.encode() + b"\r\n" + body)
        self.transport.close()


def limited_http(limits: ConnectionLimits, on_refusal: Callable[[str], None]) -> type[asyncio.Protocol]:
    """uvicorn's `http` protocol class, held to `limits`; `on_refusal` is told each refusal's reason
    (`header_too_large`, `header_timeout`, `body_timeout`, `connections`)."""
    return type("LimitedHttp", (_LimitedHttp,), {"limits": limits, "on_refusal": staticmethod(on_refusal)})


async def _no_app(scope: object, receive: object, send: object) -> None:
    return None


def _cycle() -> RequestResponseCycle:
    return RequestResponseCycle(
        scope={},  # type: ignore[typeddict-item]
        transport=None,  # type: ignore[arg-type]
        flow=None,  # type: ignore[arg-type]
        logger=None,  # type: ignore[arg-type]
        access_logger=None,  # type: ignore[arg-type]
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )


SYMBOLS = {
    "uvicorn.Server._captured_signals": lambda: uvicorn.Server(uvicorn.Config(app=_no_app))._captured_signals,
    "uvicorn...HttpToolsProtocol._start_asgi_task": lambda: HttpToolsProtocol._start_asgi_task,
    "uvicorn...HttpToolsProtocol.handle_websocket_upgrade": lambda: HttpToolsProtocol.handle_websocket_upgrade,
    "uvicorn...HttpToolsProtocol.on_headers_complete": lambda: HttpToolsProtocol.on_headers_complete,
    "uvicorn...HttpToolsProtocol.on_message_complete": lambda: HttpToolsProtocol.on_message_complete,
    "uvicorn...RequestResponseCycle.disconnected": lambda: _cycle().disconnected,
    "uvicorn...RequestResponseCycle.response_started": lambda: _cycle().response_started,
    "uvicorn...RequestResponseCycle.response_complete": lambda: _cycle().response_complete,
    "uvicorn...RequestResponseCycle.more_body": lambda: _cycle().more_body,
    "uvicorn...RequestResponseCycle.message_event": lambda: _cycle().message_event.set,
}
