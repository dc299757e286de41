"""Traces end to end, and the audit log: a real gateway exporting to a real OTLP/HTTP receiver (decoding the
protobuf), upstreams that record the trace context each request reached them with.

For every combination of the gateway's two paths (the shortcut and the SDK's stacks), the caller's two eras and
four upstreams (stdio and HTTP, each spoken to in 2026-07-28 and in 2025-11-25), one call's trace is checked
link by link: the caller's context (from `_meta`) → the gateway's SERVER span → its CLIENT span → the upstream,
which must have received the CLIENT span's context (in `_meta`, and over HTTP in the `traceparent` header), never
the caller's. Then SEP-414's precedence (the header alone; both, `_meta` winning and the header linked), a
retried call's attempts, what never reaches a span or the audit log, and the audit log's lines.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fixtures.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.fixtures.servers import free_port, stop_group
from tests.integration.conftest import ERAS, Gateway, connect, run_gateway, wait_until

TRACED = Path(__file__).resolve().parents[1] / "fixtures" / "trace_upstream.py"
PYTHON = sys.executable
ADMIN = "admin-token-for-the-tracing-tests"
SECRET = "sw0rdfish-" + "x" * 12
TOKEN = "caller-token-abcdefghijklmnop"
UPSTREAMS = ["s", "s25", "h", "h25"]  # stdio / HTTP, 2026-07-28 / 2025-11-25
PATHS = ["shortcut", "sdk"]

pytestmark = pytest.mark.anyio


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _stdio(protocol: str, *extra: str) -> dict[str, Any]:
    return {"command": PYTHON, "args": [str(TRACED), "--transport", "stdio", *extra], "protocol": protocol}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def http_upstream() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, str(TRACED), "--transport", "http", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline_ok = False
        for _ in range(200):
            try:
                httpx2.get(f"http://127.0.0.1:{port}/mcp", timeout=0.5)
                deadline_ok = True
                break
            except httpx2.TransportError:
                time.sleep(0.05)
        assert deadline_ok, "the HTTP trace upstream did not come up"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_group(proc)


def _config(http_url: str, tmp: Path, fast_path: bool) -> dict[str, Any]:
    return {
        "sandbox": "off",
        "fast_path": fast_path,
        "admin_token": ADMIN,
        "auth": {"tokens": [{"name": "ci-bot", "token": TOKEN}]},
        "audit": {"enabled": True, "path": str(tmp / "audit.jsonl")},
        "tracing": {"service_name": "manifold-under-test"},
        "runtime": {"egress": {"allow": ["127.0.0.0/8"]}},
        "servers": {
            "s": _stdio("auto"),
            "s25": _stdio("2025-11-25"),
            "h": {"url": http_url, "protocol": "auto", "trusted": True},
            "h25": {"url": http_url, "protocol": "2025-11-25", "trusted": True},
            "flaky": {**_stdio("auto", "--flag-file", str(tmp / "crashed")), "retry": {"attempts": 3}},
        },
    }


@pytest.fixture(scope="module", params=PATHS)
def gateway(
    request: pytest.FixtureRequest,
    receiver: OtlpReceiver,
    http_upstream: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp(f"tracing-{request.param}")
    fast = request.param == "shortcut"
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-key=collector-secret-value",
        "MANIFOLD_FAST_PATH": "true" if fast else "false",  # both paths, whatever run this is (it wins over the file)
    }
    with run_gateway(tmp, _config(http_upstream, tmp, fast), env=env) as gw:
        yield gw, tmp


def _by_trace(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    spans = receiver.wait_for(
        lambda spans: sum(1 for s in spans if s.trace_id == trace_id and s.kind in ("SERVER", "CLIENT")) >= count,
        what=f"{count} spans of trace {trace_id}",
    )
    return [s for s in spans if s.trace_id == trace_id]


def _answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC response in a POST's answer: a JSON body, or the `data:` of an SSE event carrying an id."""
    assert response.status_code == 200, response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if "id" in message:
                    return message  # type: ignore[no-any-return]
        raise AssertionError(f"no response in {response.text!r}")
    return response.json()  # type: ignore[no-any-return]


async def _call(
    gw: Gateway, era: str, name: str, meta: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """One `tools/call` as a plain client of `era` sends it (no capabilities: the shortcut may serve it), with the
    `_meta` and extra HTTP headers given; its result."""
    base = {
        "authorization": f"Bearer {TOKEN}",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": era,
        **(headers or {}),
    }
    params: dict[str, Any] = {"name": name, "arguments": {}}
    async with httpx2.AsyncClient(headers=base, timeout=30) as http:
        if era == "2026-07-28":
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": era,
                "io.modelcontextprotocol/clientCapabilities": {},
                **(meta or {}),
            }
            extra = {"mcp-method": "tools/call", "mcp-name": name}
        else:
            if meta:
                params["_meta"] = meta
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": era, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
            }
            opened = await http.post(gw.url, json=init, headers={"mcp-protocol-version": "2025-11-25"})
            _answer(opened)
            extra = {"mcp-session-id": opened.headers["mcp-session-id"]}
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert (await http.post(gw.url, json=note, headers=extra)).status_code == 202
        body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
        message = _answer(await http.post(gw.url, json=body, headers=extra))
    assert "result" in message, message
    return message["result"]  # type: ignore[no-any-return]


async def _ready(gw: Gateway) -> None:
    async with connect(gw.url, "2026-07-28", headers={"authorization": f"Bearer {TOKEN}"}) as client:
        await client.wait_for(lambda names: all(f"{u}__seen" in names for u in [*UPSTREAMS, "flaky"]))


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("era", ERAS)
async def test_caller_gateway_upstream_are_one_trace(
    gateway: tuple[Gateway, Path], receiver: OtlpReceiver, era: str, upstream: str
) -> None:
    gw, _ = gateway
    await _ready(gw)
    traceparent, trace_id, caller_span = _traceparent()
    result = await _call(gw, era, f"{upstream}__seen", {"traceparent": traceparent, "baggage": "k=v"})
    seen = json.loads(result["content"][0]["text"])
    spans = _by_trace(receiver, trace_id, 2)
    (server,) = [s for s in spans if s.kind == "SERVER"]
    (client_span,) = [s for s in spans if s.kind == "CLIENT"]
    # caller -> gateway's server span -> gateway's client span
    assert server.parent_span_id == caller_span
    assert server.name == f"tools/call {upstream}__seen"
    assert client_span.parent_span_id == server.span_id
    assert client_span.name == "tools/call seen"
    attrs = server.attributes
    assert attrs["mcp.method.name"] == "tools/call" and attrs["gen_ai.tool.name"] == f"{upstream}__seen"
    assert attrs["gen_ai.operation.name"] == "execute_tool" and attrs["mcp.protocol.version"] == era
    assert attrs["manifold.server"] == upstream and attrs["manifold.outcome"] == "ok"
    assert attrs["manifold.caller"] == "ci-bot" and attrs["manifold.retries"] == 0
    assert attrs["manifold.path"] == ("shortcut" if _fast(gateway) else "sdk")
    if era == "2025-11-25":
        assert attrs.get("mcp.session.id")
    cattrs = client_span.attributes
    assert cattrs["manifold.server"] == upstream and cattrs["manifold.attempt"] == 1
    assert cattrs["network.transport"] == ("pipe" if upstream.startswith("s") else "tcp")
    # the era spoken upstream: 2025-11-25 to the servers told so; an `auto` server's 2026 connection, or the 2025
    # session the gateway keeps beside it for 2025-era callers it may ask (upstream/legacy.py)
    assert cattrs["mcp.protocol.version"] in (("2025-11-25",) if upstream.endswith("25") else ("2026-07-28", era))
    assert server.resource["service.name"] == "manifold-under-test"
    # the upstream got the gateway's CLIENT span as its parent: in `_meta`, and over HTTP in the header too
    expected = f"00-{trace_id}-{client_span.span_id}-01"
    assert seen["meta"]["traceparent"] == expected, seen
    assert "k=v" in seen["meta"].get("baggage", "")
    assert seen["protocol"] == cattrs["mcp.protocol.version"]
    if upstream.startswith("h"):
        assert seen["headers"]["traceparent"] == expected, seen
    else:
        assert seen["headers"] is None


def _fast(gateway: tuple[Gateway, Path]) -> bool:
    return "tracing-shortcut" in str(gateway[1])


async def test_the_http_header_is_the_parent_when_meta_has_none(
    gateway: tuple[Gateway, Path], receiver: OtlpReceiver
) -> None:
    gw, _ = gateway
    await _ready(gw)
    traceparent, trace_id, caller_span = _traceparent()
    headers = {"authorization": f"Bearer {TOKEN}", "traceparent": traceparent}
    async with connect(gw.url, "2026-07-28", headers=headers) as client:
        await client.call("s__seen", {})
    spans = _by_trace(receiver, trace_id, 2)
    # (the SDK's client sends the header with its other requests too: their spans are in the same trace)
    (server,) = [s for s in spans if s.kind == "SERVER" and s.name == "tools/call s__seen"]
    assert server.parent_span_id == caller_span and not server.links


async def test_meta_wins_over_the_header_which_is_linked(gateway: tuple[Gateway, Path], receiver: OtlpReceiver) -> None:
    gw, _ = gateway
    await _ready(gw)
    in_meta, meta_trace, meta_span = _traceparent()
    in_header, header_trace, header_span = _traceparent()
    headers = {"authorization": f"Bearer {TOKEN}", "traceparent": in_header}
    async with connect(gw.url, "2026-07-28", headers=headers) as client:
        result = await client.call("h__seen", {}, meta={"traceparent": in_meta})
    spans = _by_trace(receiver, meta_trace, 2)
    (server,) = [s for s in spans if s.kind == "SERVER"]
    (client_span,) = [s for s in spans if s.kind == "CLIENT"]
    assert server.parent_span_id == meta_span
    assert [(t, s) for t, s, _ in server.links] == [(header_trace, header_span)]
    seen = json.loads(result.content[0].text)
    # neither of the caller's contexts goes upstream: the gateway's client span does, in both places
    assert seen["meta"]["traceparent"] == seen["headers"]["traceparent"] == f"00-{meta_trace}-{client_span.span_id}-01"


async def test_a_retried_call_has_a_client_span_per_attempt(
    gateway: tuple[Gateway, Path], receiver: OtlpReceiver
) -> None:
    gw, tmp = gateway
    await _ready(gw)
    (tmp / "crashed").unlink(missing_ok=True)
    traceparent, trace_id, _ = _traceparent()
    async with connect(gw.url, "2026-07-28", headers={"authorization": f"Bearer {TOKEN}"}) as client:
        result = await client.call("flaky__flaky", {}, meta={"traceparent": traceparent})
    assert not result.is_error, result
    spans = _by_trace(receiver, trace_id, 3)
    (server,) = [s for s in spans if s.kind == "SERVER"]
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes["manifold.attempt"])
    assert [s.attributes["manifold.attempt"] for s in attempts] == [1, 2]
    assert attempts[0].status_code == 2 and attempts[0].attributes["error.type"]
    assert all(s.parent_span_id == server.span_id for s in attempts)
    assert server.attributes["manifold.retries"] == 1 and server.attributes["manifold.outcome"] == "ok"
    seen = json.loads(result.content[0].text)
    assert seen["meta"]["traceparent"] == f"00-{trace_id}-{attempts[1].span_id}-01"
    # the reconnect has a span of its own
    receiver.wait_for(
        lambda spans: any(s.name == "connect" and s.attributes.get("manifold.server") == "flaky" for s in spans),
        what="a connect span of flaky",
    )


async def test_no_argument_result_or_secret_reaches_a_span_or_the_audit_log(
    gateway: tuple[Gateway, Path], receiver: OtlpReceiver
) -> None:
    gw, tmp = gateway
    await _ready(gw)
    traceparent, trace_id, _ = _traceparent()
    async with connect(gw.url, "2026-07-28", headers={"authorization": f"Bearer {TOKEN}"}) as client:
        result = await client.call("s__secret_echo", {"password": SECRET}, meta={"traceparent": traceparent})
    assert not result.is_error
    _by_trace(receiver, trace_id, 2)
    audit = tmp / "audit.jsonl"
    await wait_until(lambda: audit.exists() and trace_id in audit.read_text(), what="the call's audit line")
    for body in receiver.bodies:
        for needle in (SECRET, TOKEN, ADMIN, "collector-secret-value", "password"):
            assert needle.encode() not in body, needle
    text = audit.read_text()
    for needle in (SECRET, TOKEN, ADMIN, "collector-secret-value", "password"):
        assert needle not in text, needle
    assert "collector-secret-value" not in gw.log() and SECRET not in gw.log()
    # the collector got its header
    assert any(h.get("x-collector-key") == "collector-secret-value" for h in receiver.headers)


async def test_the_audit_log_has_a_line_per_call_and_per_act(gateway: tuple[Gateway, Path], http_upstream: str) -> None:
    gw, tmp = gateway
    await _ready(gw)
    traceparent, trace_id, _ = _traceparent()
    async with connect(gw.url, "2025-11-25", headers={"authorization": f"Bearer {TOKEN}"}) as client:
        await client.call("s__seen", {"unused": 1}, meta={"traceparent": traceparent})
    admin = {"authorization": f"Bearer {ADMIN}"}
    async with httpx2.AsyncClient(base_url=gw.base, headers=admin, timeout=30) as http:
        assert (await http.post("/admin/pins/s/approve", json={"tools": []})).status_code == 200
        assert (await http.post("/admin/reload")).status_code == 200
        added = await http.post("/admin/servers", json={"name": "extra", "url": http_upstream})
        assert added.status_code in (200, 201), added.text
        assert (await http.delete("/admin/servers/extra")).status_code in (200, 204)
    audit = tmp / "audit.jsonl"

    def lines() -> list[dict[str, Any]]:
        return [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []

    acts = {"pins_approved", "reload", "server_added", "server_removed"}
    await wait_until(lambda: acts <= {x.get("action") for x in lines()}, what="admin lines")
    (call,) = [x for x in lines() if x.get("trace_id") == trace_id]
    assert call["kind"] == "tool_call" and call["who"] == "ci-bot" and call["endpoint"] == ""
    assert call["server"] == "s" and call["tool"] == "s__seen" and call["outcome"] == "ok"
    assert call["duration_ms"] > 0 and call["arguments_digest"].startswith("sha256:")
    approved = next(x for x in lines() if x.get("action") == "pins_approved")
    assert approved["who"] == "admin" and approved["server"] == "s"
    reload = next(x for x in lines() if x.get("action") == "reload")
    assert reload["who"] == "admin" and reload["outcome"] == "ok"
    line = next(x for x in lines() if x.get("action") == "server_added")
    assert line["server"] == "extra" and line["who"] == "admin" and http_upstream not in json.dumps(line)


async def test_tracing_off_passes_the_callers_context_through(
    tmp_path: Path, receiver: OtlpReceiver, http_upstream: str
) -> None:
    """Off (no OTEL_* variable, no `tracing:` block), the gateway adds no span and no context of its own: the
    upstream gets the caller's `_meta` as sent."""
    config = {"sandbox": "off", "servers": {"s": _stdio("auto")}}
    env = {k: "" for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER")}
    with run_gateway(tmp_path, config, env=env) as gw:
        traceparent, trace_id, _ = _traceparent()
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda names: "s__seen" in names)
            result = await client.call("s__seen", {}, meta={"traceparent": traceparent})
        assert json.loads(result.content[0].text)["meta"]["traceparent"] == traceparent
        assert not any(s.trace_id == trace_id for s in receiver.snapshot())


async def test_workers_and_handovers_are_audited(tmp_path: Path) -> None:
    """A worker admitted, one refused, and a server a conversation hands over: one audit line each, naming the
    token, never its secret nor the handed-over server's env."""
    tokens = {"agent": "agent-token-0123456789", "laptop": "laptop-token-0123456789", "ci": "ci-token-0123456789"}
    config = {
        "audit": {"enabled": True, "path": str(tmp_path / "audit.jsonl")},
        "auth": {
            "tokens": [
                {"name": "agent", "token": tokens["agent"], "may_add": "stdio"},
                {"name": "laptop", "token": tokens["laptop"], "servers": [], "may_offer": ["w-*"]},
                {"name": "ci", "token": tokens["ci"], "servers": [], "may_offer": []},
            ]
        },
        "servers": {},
        "sandbox": {"read": [str(TRACED.parent)]},
    }
    handed_secret = "handed-env-secret-value"
    with run_gateway(tmp_path, config) as gw:
        workers = []
        for name, token in (("w-one", "laptop"), ("w-two", "ci")):
            cmd = [PYTHON, "-m", "gateway", "worker", "--connect", gw.base, "--name", name, "--log-format", "json"]
            workers.append(
                subprocess.Popen(
                    [*cmd, "--", PYTHON, str(TRACED), "--transport", "stdio"],
                    env={**os.environ, "MANIFOLD_WORKER_TOKEN": tokens[token]},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        try:
            entry = {
                "name": "mine",
                "command": PYTHON,
                "args": [str(TRACED), "--transport", "stdio"],
                "env": [{"name": "HANDED_SECRET", "value": handed_secret}],
            }
            meta = {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "manifold/servers/add",
                "params": {"mcpServers": [entry], "_meta": meta},
            }
            headers = {
                "authorization": f"Bearer {tokens['agent']}",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "manifold/servers/add",
            }
            async with httpx2.AsyncClient(timeout=60) as http:
                answer = _answer(await http.post(gw.url, json=body, headers=headers))
            assert answer["result"]["servers"][0]["status"] == "started", answer
            audit = tmp_path / "audit.jsonl"

            def lines() -> list[dict[str, Any]]:
                return [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []

            wanted = {"worker_admitted", "worker_refused", "handover"}
            await wait_until(lambda: wanted <= {x.get("action") for x in lines()}, timeout=30, what="audit lines")
            admitted = next(x for x in lines() if x.get("action") == "worker_admitted")
            assert (admitted["who"], admitted["server"], admitted["outcome"]) == ("laptop", "w-one", "ok")
            refused = next(x for x in lines() if x.get("action") == "worker_refused")
            assert (refused["who"], refused["server"], refused["outcome"]) == ("ci", "w-two", "refused")
            assert refused["reason"] == "forbidden"
            handed = next(x for x in lines() if x.get("action") == "handover")
            assert (handed["who"], handed["server"], handed["status"]) == ("agent", "mine", "started")
            text = audit.read_text()
            for secret in (*tokens.values(), handed_secret):
                assert secret not in text
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in workers:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
