"""The fast lane answers as the SDK path does: the same requests to a gateway with it and one without."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bench.mcphttp import ERAS, LEGACY, Connection, Endpoint, Reply, Session, open_session
from tests.fixtures.servers import run_http_fixture, stdio_spec
from tests.integration.conftest import run_gateway

REQUESTS: list[tuple[str, dict[str, Any] | None]] = [
    ("tools/list", None),
    ("tools/call", {"name": "fx__echo", "arguments": {"text": "héllo"}}),
    ("tools/call", {"name": "web__echo", "arguments": {"text": "over http"}}),
    ("tools/call", {"name": "fx__add", "arguments": {"a": 2, "b": 3}}),
    ("tools/call", {"name": "web__add", "arguments": {"a": 2, "b": 3}}),
    ("tools/call", {"name": "fx__fail", "arguments": {"reason": "on purpose"}}),
    ("tools/call", {"name": "web__fail", "arguments": {"reason": "on purpose"}}),
    ("tools/call", {"name": "fx__echo", "arguments": {"text": 5}}),
    ("tools/call", {"name": "web__no_such_tool", "arguments": {}}),
    ("tools/call", {"name": "fx__echo", "arguments": "not an object"}),
    ("tools/list", {"cursor": "abc"}),
]


def _exchange(url: str, era: str) -> list[tuple[int, str, Any]]:
    conn = Connection(Endpoint.parse(url))
    session: Session = open_session(conn, era)
    # Wait for both servers' tools; the first listing also goes through the SDK and records the session,
    # so the lane serves the requests after it.
    deadline = time.monotonic() + 20
    while not {"fx__echo", "web__echo"} <= {t["name"] for t in conn.request(session, "tools/list")["tools"]}:
        assert time.monotonic() < deadline, "the servers' tools were not listed in time"
        time.sleep(0.1)
    answers = []
    for method, params in REQUESTS:
        request_id = conn.next_id()
        reply: Reply = conn.post(session, session.body(request_id, method, params))
        content_type = reply.headers.get("content-type", "")
        messages = [m for m in reply.messages if m.get("id") == request_id]
        answers.append((reply.status, content_type, messages))
    conn.close()
    return answers


def _normalised(message: Any) -> Any:
    """The message without its id (the listing polls differ in number) and its error text (validator detail)."""
    message = {k: v for k, v in message.items() if k != "id"}
    if "error" in message:
        message["error"] = {"code": message["error"]["code"]}
    return message


@pytest.mark.parametrize("era", ERAS)
def test_fast_lane_answers_as_the_sdk_path(tmp_path: Path, era: str) -> None:
    with run_http_fixture(name="web") as web:
        config = {"servers": {"fx": stdio_spec(), "web": {"url": web.url}}}
        with run_gateway(tmp_path, config) as fast:
            fast_answers = _exchange(fast.url, era)
        with run_gateway(tmp_path, config, env={"MANIFOLD_FAST_PATH": "false"}) as slow:
            slow_answers = _exchange(slow.url, era)
    lane_served = 0
    for (method, params), fast_answer, slow_answer in zip(REQUESTS, fast_answers, slow_answers, strict=True):
        (fast_status, fast_type, fast_messages), (slow_status, slow_type, slow_messages) = fast_answer, slow_answer
        where = f"{method} {params}"
        assert fast_status == slow_status, where
        assert len(fast_messages) == len(slow_messages) == 1, where
        assert _normalised(fast_messages[0]) == _normalised(slow_messages[0]), where
        if era == LEGACY and fast_type.startswith("application/json"):
            assert slow_type.startswith("text/event-stream"), where  # the SDK path answers 2025 calls with SSE
            lane_served += 1
    if era == LEGACY:
        # tools/list, the six well-formed calls, the bad arguments (they go upstream too) and the unknown tool
        # (admitted, or refused, by the same policy) took the lane.
        assert lane_served == 9
