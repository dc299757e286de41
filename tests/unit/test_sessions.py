"""Downstream 2025-era session records: what a session leaves behind when it ends without a DELETE."""

from __future__ import annotations

import pytest

from gateway.core.registry import Registry
from gateway.downstream.server import Frontend
from gateway.downstream.tools import MAX_REVEALED

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_tools_a_search_revealed_go_with_a_session_that_idles_out() -> None:
    """The SDK's own session table (a real session manager) no longer holds the session, as after its idle
    timeout: the next prune forgets the record, and the tools a deferred-mode search revealed to it with it."""
    frontend = Frontend(Registry([]), exposure="deferred")
    frontend.server.streamable_http_app(streamable_http_path="/mcp", session_idle_timeout=1)
    sessions = frontend.sessions
    sessions.attach(frontend.server.session_manager)
    sessions.served("gone", "open", pusher=object())
    assert sessions.reveal("gone", ["a__x", "a__y", "a__x"], MAX_REVEALED) == ["a__x", "a__y"]
    assert sessions.reveal("gone", ["a__y", "a__z", "a__w"], 3) == ["a__z"], "bounded per session"
    assert sessions.revealed("gone") == {"a__x", "a__y", "a__z"}
    assert sessions.reveal("never-served", ["a__x"], MAX_REVEALED) == [], "no record, nothing kept"
    assert sessions.count() == 0
    assert sessions.revealed("gone") == set()
    assert sessions.reveal("gone", ["a__x"], MAX_REVEALED) == [], "a forgotten session gets no new record"
