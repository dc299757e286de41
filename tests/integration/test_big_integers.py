"""Integers past 64 bits pass through the gateway exactly, in arguments and results, on every path.

orjson refuses (or reads as floats) integers outside the 64-bit range; JSON itself has no such limit, and
the Python SDK on both ends keeps them exact. The calls are raw HTTP requests parsed with the standard
library's `json`, which keeps every integer as written, so nothing on the client side can round them.
Paths: both eras x a stdio and an HTTP upstream x the fast path on and off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.mcphttp import Connection, Endpoint, Reply, Session, list_tool_names, open_session
from tests.fixtures.servers import run_http_fixture, stdio_spec
from tests.integration.conftest import ERAS, Gateway, run_gateway

BIG = {
    "2**70": 2**70,
    "-(2**70)": -(2**70),
    "2**64": 2**64,
    "10**30": 10**30,
    "-(10**30)": -(10**30),
    "-(2**63)-1": -(2**63) - 1,  # just below the signed 64-bit range
    "2**64-1": 2**64 - 1,  # inside the unsigned range: a control
}
NESTED = {"list": [2**70, -(2**70), 2**64, 10**30], "deep": {"deeper": [{"n": -(2**63) - 1}]}, "small": 7}
# Bodies past a few KiB, and past a few hundred KiB, may take other decoding routes than small ones.
LARGE = {"pad": "p" * 8000, "n": 2**70, "m": -(10**30)}
HUGE = {"pad": "p" * 300_000, "n": 10**30, "list": [2**64] * 10}


def _exact(value: Any) -> str:
    """The value as JSON text: an integer that became a float (even an equal one, like 2.0**70) shows."""
    return json.dumps(value, sort_keys=True)


@pytest.fixture(scope="module", params=[True, False], ids=["fast-path", "sdk-path"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway with the fixture over stdio (`fx`) and over HTTP (`web`), the fast path on or off."""
    tmp_path = tmp_path_factory.mktemp("big-integers")
    with run_http_fixture(name="web") as web:
        config = {"fast_path": request.param, "servers": {"fx": stdio_spec(), "web": {"url": web.url}}}
        with run_gateway(tmp_path, config) as gw:
            yield gw


def _session(gw: Gateway, era: str) -> tuple[Connection, Session]:
    conn = Connection(Endpoint.parse(gw.url))
    session = open_session(conn, era)
    deadline = time.monotonic() + 20
    while not {"fx__mirror", "web__mirror"} <= set(list_tool_names(conn, session)):
        assert time.monotonic() < deadline, "the fixture's tools were not listed in time"
        time.sleep(0.1)
    return conn, session


def _mirror(conn: Connection, session: Session, tool: str, value: Any) -> dict[str, Any]:
    """Call `tool` with {"value": value}; the JSON-RPC answer, parsed by the standard library (an HTTP
    error status without one comes back as an `error` too)."""
    request_id = conn.next_id()
    params = {"name": tool, "arguments": {"value": value}}
    reply: Reply = conn.post(session, session.body(request_id, "tools/call", params))
    answers = [m for m in reply.messages if m.get("id") == request_id]
    if reply.status != 200 or len(answers) != 1:
        return {"error": f"HTTP {reply.status}: {reply.body[:200]!r}"}
    return answers[0]


@pytest.mark.parametrize("server", ["fx", "web"], ids=["stdio", "http"])
@pytest.mark.parametrize("era", ERAS)
def test_integers_past_64_bits_round_trip_unchanged(gateway: Gateway, era: str, server: str) -> None:
    conn, session = _session(gateway, era)
    tool = f"{server}__mirror"
    problems: list[str] = []
    try:
        for label, value in [*BIG.items(), ("nested", NESTED), ("8 KB body", LARGE), ("300 KB body", HUGE)]:
            answer = _mirror(conn, session, tool, value)
            if "error" in answer:
                problems.append(f"{label}: JSON-RPC error {answer['error']}")
                continue
            result = answer["result"]
            if result.get("isError"):
                problems.append(f"{label}: isError result {result.get('content')}")
                continue
            structured = result.get("structuredContent")
            if _exact(structured) != _exact({"value": value}):
                problems.append(f"{label}: structuredContent {_exact(structured)[:300]}")
            text = result["content"][0]["text"]
            if _exact(json.loads(text)) != _exact({"value": value}):
                problems.append(f"{label}: text {text[:300]}")
            assert result["_meta"]["manifold/server"] == server
        # Small integers still take the ordinary route and come back as they went.
        small = _mirror(conn, session, tool, 41)["result"]
        assert small["structuredContent"] == {"value": 41}
    finally:
        conn.close()
    assert not problems, f"{tool} ({era}) changed or refused integers:\n" + "\n".join(problems)
