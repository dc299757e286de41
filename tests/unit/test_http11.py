"""The lean HTTP/1.1 client against a real loopback server that answers with scripted bytes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest

from gateway.protocol.errors import AnswerLost, BadAnswer, HttpStatus, NotSent, SessionExpired
from gateway.upstream.transports.http11 import HttpWire, SseEvents
from gateway.upstream.transports.lenient import LenientTransport

Script = Callable[[bytes], list[bytes] | None]
CLOSE = b"<close the connection>"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _http(status: str, content_type: str, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


@asynccontextmanager
async def scripted_server(answer: Script) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A server that reads one request at a time and writes `answer(request)`'s pieces (None: hang up)."""
    requests: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                request = head + await reader.readexactly(length)
                requests.append(request)
                pieces = answer(request)
                if pieces is None:
                    break
                for piece in pieces:
                    if piece is CLOSE:
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/mcp", requests, connections


def _call(request_id: int = 7) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "echo"}}


async def test_json_answer_and_headers_sent() -> None:
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    async with scripted_server(lambda _: [_http("200 OK", "application/json", body)]) as (url, requests, _):
        wire = HttpWire(url, {"Authorization": "Bearer s3cret"}, lambda: "sess-1")
        reply = await wire.request(_call(), {"mcp-protocol-version": "2025-11-25"}, None)
        wire.close()
    assert reply == {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}
    sent = requests[0].lower()
    assert sent.startswith(b"post /mcp http/1.1\r\n")
    for header in (b"authorization: bearer s3cret", b"mcp-session-id: sess-1", b"mcp-protocol-version: 2025-11-25"):
        assert header in sent


@pytest.mark.parametrize("eol", [b"\r\n", b"\n", b"\r"], ids=["crlf", "lf", "cr"])
async def test_sse_answer_relays_progress_across_split_chunks(eol: bytes) -> None:
    stream = (
        b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
        b'"params":{"progressToken":7,"progress":1,"total":2}}\r\n\r\n'
        b'event: message\r\ndata: {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"ok"}]}}\r\n\r\n'
    ).replace(b"\r\n", eol)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    pieces = [head]
    for i in range(0, len(stream), 37):  # odd-sized chunks split lines, CRLFs and JSON
        part = stream[i : i + 37]
        pieces.append(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    pieces.append(b"0\r\n\r\n")
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with scripted_server(lambda _: pieces) as (url, _, connections):
        wire = HttpWire(url, {}, lambda: None)
        reply = await wire.request(_call(), {}, progress)
        again = await wire.request(_call(), {}, progress)
        wire.close()
    assert reply["result"]["content"][0]["text"] == "ok"
    assert again == reply
    assert seen == [(1, 2, None), (1, 2, None)]
    assert len(connections) == 1  # the connection was kept alive and reused


async def test_a_json_rpc_error_at_an_error_status_is_passed_on() -> None:
    body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad"}}'
    async with scripted_server(lambda _: [_http("400 Bad", "application/json", body)]) as (url, _, _):
        wire = HttpWire(url, {}, lambda: "s")
        reply = await wire.request(_call(), {}, None)
        wire.close()
    assert reply == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "bad"}}


@pytest.mark.parametrize(
    ("status", "content_type", "body", "session", "failure", "code", "message"),
    [
        ("404 Not Found", "text/plain", b"gone", "s", SessionExpired, None, "HTTP 404 on the session"),
        ("404 Not Found", "text/plain", b"gone", None, BadAnswer, -32601, "Not Found"),
        ("500 Oops", "text/plain", b"x", "s", HttpStatus, None, "HTTP 500"),
        (
            "202 Accepted",
            "application/json",
            b"",
            "s",
            BadAnswer,
            -32600,
            "server answered a request with 202 Accepted",
        ),
        (
            "307 Moved",
            "text/plain",
            b"",
            "s",
            BadAnswer,
            -32600,
            "the server redirected the call (HTTP 307); not followed",
        ),
        ("200 OK", "text/html", b"<p>", "s", BadAnswer, -32600, "Unexpected content type: text/html"),
        ("200 OK", "application/json", b"{not json", "s", BadAnswer, -32700, "Failed to parse JSON response"),
    ],
)
async def test_failures_are_typed(
    status: str,
    content_type: str,
    body: bytes,
    session: str | None,
    failure: type[Exception],
    code: int | None,
    message: str,
) -> None:
    async with scripted_server(lambda _: [_http(status, content_type, body)]) as (url, _, _):
        wire = HttpWire(url, {}, lambda: session)
        with pytest.raises(failure) as caught:
            await wire.request(_call(), {}, None)
        wire.close()
    assert str(caught.value) == message
    assert getattr(caught.value, "code", None) == code


async def test_a_connection_cut_after_the_request_went_out_is_never_resent() -> None:
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    answers = iter([[_http("200 OK", "application/json", body, "connection: keep-alive\r\n")], None])

    def answer(_: bytes) -> list[bytes] | None:
        return next(answers, [_http("200 OK", "application/json", body)])

    async with scripted_server(answer) as (url, requests, connections):
        wire = HttpWire(url, {}, lambda: None)
        assert "result" in await wire.request(_call(), {}, None)
        # The server reads the second request of that connection, then hangs up: the call may have run.
        with pytest.raises(AnswerLost):
            await wire.request(_call(), {}, None)
        assert len(requests) == 2  # not sent a second time
        assert "result" in await wire.request(_call(), {}, None)  # the next call takes a fresh connection
        wire.close()
    assert len(connections) == 2
    assert len(requests) == 3


async def test_a_pooled_connection_closed_while_idle_is_not_used() -> None:
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    async with scripted_server(lambda _: [_http("200 OK", "application/json", body), CLOSE]) as (url, requests, conns):
        wire = HttpWire(url, {}, lambda: None)
        assert "result" in await wire.request(_call(), {}, None)
        await asyncio.sleep(0.1)  # the server's hang-up reaches the pooled connection
        assert "result" in await wire.request(_call(), {}, None)
        wire.close()
    assert len(conns) == 2 and len(requests) == 2


async def test_a_closed_pool_ends_calls_in_flight_and_takes_no_more() -> None:
    async with scripted_server(lambda _: []) as (url, requests, _):  # reads the request, never answers
        wire = HttpWire(url, {}, lambda: None)
        call = asyncio.ensure_future(wire.request(_call(), {}, None))
        while not requests:
            await asyncio.sleep(0.01)
        wire.close()
        with pytest.raises(AnswerLost):
            await call
        with pytest.raises(NotSent):
            await wire.request(_call(), {}, None)


async def test_a_connection_cut_mid_answer_is_an_error() -> None:
    head = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"jsonrpc"'
    async with scripted_server(lambda _: [head, CLOSE]) as (url, _, _):
        wire = HttpWire(url, {}, lambda: None)
        with pytest.raises(AnswerLost, match="closed the connection"):
            await wire.request(_call(), {}, None)
        wire.close()


async def test_a_refused_connection_was_not_sent() -> None:
    wire = HttpWire("http://127.0.0.1:9/mcp", {}, lambda: None, connect_timeout=2)
    with pytest.raises(NotSent, match="cannot connect"):
        await wire.request(_call(), {}, None)


def test_sse_event_parsing_takes_only_complete_events() -> None:
    stream = b'data: {"a":1}\n\nid: 3\ndata: {"b":\ndata: 2}\n\n: comment\n\ndata: {"c"'
    events = SseEvents()
    assert events.feed(stream) == [b'{"a":1}', b'{"b":\n2}']
    assert events.feed(b":3}\n") == []
    assert events.feed(b"\n") == [b'{"c":3}']


@pytest.mark.parametrize("size", [1, 2, 3, 7, 4096])
def test_sse_events_are_the_same_however_the_stream_is_cut(size: int) -> None:
    big = b"x" * 10_000
    stream = (
        b"event: message\r\ndata: " + big + b"\r\n\r\n"
        b"data:no-space\r\ndata:  two spaces\n\r\n"
        b"retry: 5\n\ndata: last\n\n"
    )
    events = SseEvents()
    seen = [bytes(e) for i in range(0, len(stream), size) for e in events.feed(stream[i : i + size])]
    assert seen == [big, b"no-space\n two spaces", b"last"]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 4096])
def test_a_lone_cr_ends_a_line_and_a_crlf_cut_between_chunks_ends_one(size: int) -> None:
    big = b"y" * 5_000
    stream = b"data: " + big + b"\r\rdata: a\rdata: b\r\n\r\ndata: c\n\rdata: d\r\n\n"
    events = SseEvents()
    seen = [bytes(e) for i in range(0, len(stream), size) for e in events.feed(stream[i : i + size])]
    assert seen == [big, b"a\nb", b"c", b"d"]


def test_an_event_ended_by_lone_crs_is_taken_without_waiting_for_more() -> None:
    events = SseEvents()
    assert events.feed(b'data: {"a":1}\r') == []
    assert events.feed(b"") == []
    assert events.feed(b"\r") == [b'{"a":1}']
    assert events.feed(b"data: x\r") == []
    assert events.feed(b"\ndata: y\n\n") == [b"x\ny"], "the LF after a chunk's last CR ends no line of its own"


async def test_an_oversized_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.upstream.transports.http11.MAX_ANSWER", 1000)
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"' + b"x" * 5000 + b'"}]}}'
    async with scripted_server(lambda _: [_http("200 OK", "application/json", body)]) as (url, _, _):
        wire = HttpWire(url, {}, lambda: None)
        with pytest.raises(AnswerLost, match="over 0 MiB"):
            await wire.request(_call(), {}, None)
        wire.close()


NDJSON_ANSWER = (
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1,"total":2}}\n'
    b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"ok"}]}}'
)


async def test_a_json_body_of_several_messages_one_per_line_is_read_as_the_stream_it_stands_for() -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    answer = [_http("200 OK", "application/json", NDJSON_ANSWER)]
    async with scripted_server(lambda _: answer) as (url, _, _connections):
        wire = HttpWire(url, {}, lambda: None)
        reply = await wire.request(_call(), {}, progress)
        wire.close()
    assert reply["result"]["content"][0]["text"] == "ok"
    assert seen == [(1, 2, None)]


async def test_one_json_value_written_over_several_lines_is_one_answer_and_garbage_is_refused() -> None:
    """A body is parsed as one value first (a pretty-printed answer has line breaks before its braces too); only a
    body that is not one value is read line by line, and one that is neither is refused."""
    pretty = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "ok"}]}}, indent=2)
    answers = iter(
        [[_http("200 OK", "application/json", pretty.encode())], [_http("200 OK", "application/json", b"{oops\n{")]]
    )
    async with scripted_server(lambda _: next(answers)) as (url, _, _connections):
        wire = HttpWire(url, {}, lambda: None)
        reply = await wire.request(_call(), {}, None)
        with pytest.raises(BadAnswer, match="Failed to parse JSON response"):
            await wire.request(_call(), {}, None)
        wire.close()
    assert reply["result"]["content"][0]["text"] == "ok"


async def test_the_sdk_clients_transport_reads_the_same_body_as_an_event_stream() -> None:
    answer = [_http("200 OK", "application/json", NDJSON_ANSWER)]
    one = [_http("200 OK", "application/json", b'{"jsonrpc":"2.0","id":7,"result":{}}')]
    async with (
        scripted_server(lambda _: answer) as (url, _, _c),
        scripted_server(lambda _: one) as (plain, _, _d),
        httpx2.AsyncClient(transport=LenientTransport(httpx2.AsyncHTTPTransport())) as http,
    ):
        several = await http.post(url, json=_call())
        single = await http.post(plain, json=_call())
    assert several.headers["content-type"] == "text/event-stream"
    events = [line[len(b"data: ") :] for line in several.content.split(b"\n") if line.startswith(b"data: ")]
    assert [json.loads(e) for e in events] == [json.loads(line) for line in NDJSON_ANSWER.split(b"\n")]
    assert single.headers["content-type"] == "application/json" and single.json() == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {},
    }
