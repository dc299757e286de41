"""The HTTP layer's limits, against a running gateway over raw sockets on loopback: the size of a request's head,
the time its head and its body may take, the number of open connections, and the length of a bearer token.

One gateway serves the module with short timeouts (`header_timeout` 1 s, `body_timeout` 1.5 s,
`keep_alive_timeout` 2 s); the connection cap has a gateway of its own.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest

from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import Gateway, run_gateway

TOKEN = "limits-token-0123456789abcdef"
HEADER_TIMEOUT, BODY_TIMEOUT, KEEP_ALIVE = 1.0, 1.5, 2
MARGIN = 1.5  # what the gateway may take beyond a timeout to close
MODERN = "2026-07-28"


def config(**limits: Any) -> dict[str, Any]:
    return {
        "auth": {"tokens": [{"name": "t", "token": "${T_TOKEN}"}]},
        "servers": {"fx": {**stdio_spec(), "required": True}},
        **limits,
    }


def ready(gw: Gateway) -> Gateway:
    deadline = time.monotonic() + 20
    while httpx2.get(f"{gw.base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, gw.log()
        time.sleep(0.1)
    return gw


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    limits = {"header_timeout": HEADER_TIMEOUT, "body_timeout": BODY_TIMEOUT, "keep_alive_timeout": KEEP_ALIVE}
    with run_gateway(tmp_path_factory.mktemp("limits"), config(**limits), env={"T_TOKEN": TOKEN}) as gw:
        yield ready(gw)


def dial(gw: Gateway) -> socket.socket:
    parts = urlsplit(gw.base)
    assert parts.hostname is not None and parts.port is not None
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float | None]:
    """What the gateway sends until it closes the connection, and after how many seconds it closed (None: still
    open after `timeout`)."""
    started = time.monotonic()
    data = b""
    while (left := started + timeout - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data, time.monotonic() - started
        if not chunk:
            return data, time.monotonic() - started
        data += chunk
    return data, None


def call_request(
    tool: str,
    arguments: dict[str, Any] | None = None,
    *,
    content_length: int | None = None,
    pad: int = 0,
    keep_alive: bool = False,
) -> tuple[bytes, bytes]:
    """A sessionless (2026) `tools/call` of `tool`: its head (stating `content_length`, by default the body's own
    length, an `X-Pad` header of `pad` bytes, and `Connection: close` unless `keep_alive`) and its body."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    params = {"name": tool, "arguments": arguments or {}, "_meta": meta}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    body = json.dumps(message).encode()
    head = [
        "POST /mcp HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {TOKEN}",
        "Accept: application/json, text/event-stream",
        "Content-Type: application/json",
        f"MCP-Protocol-Version: {MODERN}",
        "Mcp-Method: tools/call",
        f"Mcp-Name: {tool}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        f"Content-Length: {len(body) if content_length is None else content_length}",
    ]
    if pad:
        head.append("X-Pad: " + "a" * pad)
    return ("\r\n".join(head) + "\r\n\r\n").encode(), body


def answer_on(sock: socket.socket) -> bytes:
    """One whole answer read off a kept-alive connection (its body sized by `Content-Length`)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed mid-answer: {data[:200]!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed mid-answer: {data[:200]!r}"
        body += chunk
    assert len(body) == length, "nothing follows an answer that was not asked for"
    return head + b"\r\n\r\n" + body


def status_of(data: bytes) -> int:
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    return int(data[9:12])


def text_of(data: bytes) -> str:
    """The text of a `tools/call` answer (plain JSON or one SSE event)."""
    body = data.split(b"\r\n\r\n", 1)[1].decode()
    for line in body.splitlines():
        if line.startswith(("{", "data: {")):
            answer = json.loads(line.removeprefix("data: "))
            return str(answer["result"]["content"][0]["text"])
    raise AssertionError(body)


def call(gw: Gateway, tool: str) -> str:
    with dial(gw) as sock:
        sock.sendall(b"".join(call_request(tool)))
        data, _ = until_closed(sock, 10)
    assert status_of(data) == 200, data[:300]
    return text_of(data)


def refusals(gw: Gateway, reason: str) -> float:
    metrics = httpx2.get(f"{gw.base}/metrics", timeout=10).text
    line = f'manifold_http_refusals_total{{reason="{reason}"}} '
    return next((float(x.removeprefix(line)) for x in metrics.splitlines() if x.startswith(line)), 0.0)


def memory(gw: Gateway) -> int:
    """The gateway's peak resident memory so far, in bytes."""
    status = Path(f"/proc/{gw.proc.pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1]) * 1024


def test_a_head_over_max_header_bytes_gets_431_and_the_connection_closes(gateway: Gateway) -> None:
    before = refusals(gateway, "header_too_large")
    with dial(gateway) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 40_000)  # no end of the head
        data, closed = until_closed(sock, 5)
    assert status_of(data) == 431 and closed is not None, data[:300]
    assert b"request head over 32768 bytes" in data
    assert refusals(gateway, "header_too_large") == before + 1
    with dial(gateway) as sock:  # just under the limit: served
        sock.sendall(b"".join(call_request("fx__echo", {"text": "padded"}, pad=30_000)))
        data, _ = until_closed(sock, 10)
    assert status_of(data) == 200 and text_of(data) == "padded", data[:300]


def test_unfinished_heads_of_many_megabytes_hold_no_memory_and_do_not_stall_the_gateway(gateway: Gateway) -> None:
    """20 connections each try to send 10 MiB of a head that never ends; meanwhile /healthz answers at once."""
    before = memory(gateway)
    ended: list[str] = []

    def flood() -> None:
        try:
            with dial(gateway) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
                for _ in range(160):
                    sock.sendall(b"a" * 65536)
                ended.append("sent it all")
        except OSError as e:
            ended.append(type(e).__name__)  # the gateway closed the connection under it

    threads = [threading.Thread(target=flood) for _ in range(20)]
    for thread in threads:
        thread.start()
    slowest = 0.0
    while any(thread.is_alive() for thread in threads):
        started = time.monotonic()
        assert httpx2.get(f"{gateway.base}/healthz", timeout=10).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    assert "sent it all" not in ended, ended
    assert memory(gateway) - before < 40 * 1024 * 1024, f"peak memory grew by {memory(gateway) - before} bytes"
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s during the flood"


def test_a_connection_that_sends_no_head_is_closed_after_the_header_timeout(gateway: Gateway) -> None:
    before = refusals(gateway, "header_timeout")
    with dial(gateway) as idle:
        data, closed = until_closed(idle, HEADER_TIMEOUT + MARGIN)
    assert closed is not None, "an idle connection is closed"
    assert status_of(data) == 408 and closed >= HEADER_TIMEOUT * 0.9, (data[:200], closed)
    with dial(gateway) as slow:  # a head sent a byte at a time is closed as surely
        started = time.monotonic()
        for byte in b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n":
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
            if time.monotonic() - started > HEADER_TIMEOUT + MARGIN:
                break
        data, closed = until_closed(slow, HEADER_TIMEOUT + MARGIN)
    assert closed is not None and time.monotonic() - started < HEADER_TIMEOUT + 2 * MARGIN
    assert status_of(data) == 408, data[:200]
    assert refusals(gateway, "header_timeout") >= before + 2


def test_a_kept_alive_connection_is_closed_once_idle_for_the_keep_alive_timeout(gateway: Gateway) -> None:
    with dial(gateway) as sock:
        # The second call comes after an idle pause longer than header_timeout (whose clock starts at a head's
        # first byte on a kept-alive connection) and shorter than keep_alive_timeout: served on the same connection.
        for pause in (0.0, (HEADER_TIMEOUT + KEEP_ALIVE) / 2):
            time.sleep(pause)
            sock.sendall(b"".join(call_request("fx__echo", {"text": "kept"}, keep_alive=True)))
            answer = answer_on(sock)
            assert status_of(answer) == 200 and text_of(answer) == "kept", answer[:300]
        data, closed = until_closed(sock, KEEP_ALIVE + MARGIN)
    assert data == b"" and closed is not None, (data[:200], closed)
    assert closed >= KEEP_ALIVE * 0.9, f"closed after {closed:.2f} s idle, before keep_alive_timeout"


def test_a_body_that_stalls_gets_408_and_none_of_it_is_acted_on(gateway: Gateway) -> None:
    before = refusals(gateway, "body_timeout")
    ticks = call(gateway, "fx__ticks")
    with dial(gateway) as sock:
        head, body = call_request("fx__tick", content_length=4096)  # the whole call, but the body is said longer
        sock.sendall(head + body)
        data, closed = until_closed(sock, BODY_TIMEOUT + MARGIN)
    assert closed is not None and status_of(data) == 408, data[:300]
    assert b"the request body did not arrive in time" in data
    assert refusals(gateway, "body_timeout") == before + 1
    assert call(gateway, "fx__ticks") == ticks, "the cut-off call did not run"
    with dial(gateway) as sock:  # a body in pieces, in time: served
        head, body = call_request("fx__tick")
        sock.sendall(head)
        for piece in (body[:10], body[10:20], body[20:]):
            time.sleep(BODY_TIMEOUT / 5)
            sock.sendall(piece)
        data, _ = until_closed(sock, 10)
    assert status_of(data) == 200 and text_of(data) == str(int(ticks) + 1), data[:300]


def test_a_token_over_max_token_bytes_is_refused_before_it_is_looked_at(gateway: Gateway) -> None:
    headers = {"Authorization": "Bearer " + "x" * 20_000, "Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    response = httpx2.post(f"{gateway.base}/mcp", json=body, headers=headers, timeout=10)
    assert response.status_code == 401, response.text
    assert response.json()["error"]["message"] == "Unauthorized: the token is longer than 16384 bytes"
    assert "x" * 64 not in gateway.log()


def test_connections_past_max_connections_get_503_at_once(tmp_path: Path) -> None:
    limits = {"max_connections": 10, "header_timeout": 30}
    with run_gateway(tmp_path, config(**limits), env={"T_TOKEN": TOKEN}) as gw:
        ready(gw)
        held = [dial(gw) for _ in range(10)]
        try:
            time.sleep(0.3)  # every one accepted
            with dial(gw) as extra:
                data, closed = until_closed(extra, 5)
            assert status_of(data) == 503 and closed is not None and closed < 1, (data[:200], closed)
            assert b"retry-after: 1" in data.lower()
            held.pop().close()
            time.sleep(0.3)
            with dial(gw) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                data, _ = until_closed(sock, 5)
            assert status_of(data) == 200, data[:200]
        finally:
            for sock in held:
                sock.close()
        assert refusals(gw, "connections") == 1
