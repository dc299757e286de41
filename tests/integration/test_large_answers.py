"""Answers of several MiB from a server that answers with event streams (the SDK's default) reach the caller
whole, over the lean channel and over the SDK's session alike."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.mcphttp import ERAS, LEGACY, META_CAPABILITIES, Connection, Endpoint, Session, open_session
from tests.fixtures.servers import run_http_fixture
from tests.integration.conftest import run_gateway

TEXT = "\u00e9" * 1000 + "x" * (3 * 512 * 1024)  # 1.5 MiB on one SSE data line: over the SDK client's 1 MiB default


def _session(conn: Connection, era: str, asks: bool) -> Session:
    """A session of `era`; with `asks`, one that declares sampling, so its calls take the SDK's session."""
    if not asks:
        return open_session(conn, era)
    if era == LEGACY:
        bare = Session(era, {})
        params = {
            "protocolVersion": LEGACY,
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "t", "version": "1"},
        }
        reply = conn.post(bare, bare.body(conn.next_id(), "initialize", params))
        session_id = reply.headers["mcp-session-id"]
        session = Session(era, {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": LEGACY}, None, session_id)
        conn.post(session, session.body(None, "notifications/initialized"))
        return session
    plain = open_session(conn, era)
    assert plain.meta is not None
    return Session(era, plain.headers, {**plain.meta, META_CAPABILITIES: {"sampling": {}}})


@pytest.mark.parametrize("era", ERAS)
def test_a_2_mib_event_stream_answer_reaches_the_caller_on_both_paths(tmp_path: Path, era: str) -> None:
    with run_http_fixture(name="web") as web:
        config = {"servers": {"web": {"url": web.url, "protocol": "2025-11-25"}}}  # 2025-era answers are SSE
        with run_gateway(tmp_path, config) as gateway:
            conn = Connection(Endpoint.parse(gateway.url), timeout=60)
            deadline = time.monotonic() + 20
            plain = _session(conn, era, asks=False)
            while "web__echo" not in {t["name"] for t in conn.request(plain, "tools/list")["tools"]}:
                assert time.monotonic() < deadline, "the server's tools were not listed in time"
                time.sleep(0.1)
            for asks in (False, True):
                session = plain if not asks else _session(conn, era, asks=True)
                result = conn.request(session, "tools/call", {"name": "web__echo", "arguments": {"text": TEXT}})
                assert not result.get("isError"), str(result)[:300]
                assert result["content"][0]["text"] == TEXT, f"asks={asks}"
            conn.close()
