"""2025-era sessions the shortcut opens itself: one small record until they need the SDK, then handed over.

A client that only lists and calls tools never costs an SDK session; the first request the shortcut does
not serve (a prompt, a GET stream, a log level) wakes the session, which the SDK then serves as if it had
opened it. Each test talks raw HTTP, so it knows which requests went which way.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS

from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import connect, initialize_body, run_gateway

ACCEPT = "application/json, text/event-stream"
CONFIG: dict[str, Any] = {"servers": {"fx": stdio_spec()}}


def _post(url: str, body: dict[str, Any], session: str | None = None, **headers: str) -> httpx2.Response:
    sent = {"content-type": "application/json", "accept": ACCEPT, **headers}
    if session is not None:
        sent |= {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    return httpx2.post(url, json=body, headers=sent, timeout=30)


def _messages(response: httpx2.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [
        json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()
    ]


def _open(url: str, version: str = "2025-11-25", **headers: str) -> tuple[str, httpx2.Response]:
    response = _post(url, initialize_body(version), **headers)
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    assert _post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session, **headers).status_code == 202
    return session, response


def _call(url: str, session: str, request_id: int, method: str, params: dict[str, Any]) -> httpx2.Response:
    return _post(url, {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, session)


def _sessions(base: str) -> float:
    for line in httpx2.get(f"{base}/metrics").text.splitlines():
        if line.startswith("manifold_downstream_sessions "):
            return float(line.split()[1])
    raise AssertionError("no manifold_downstream_sessions in /metrics")


def _wait_tools(url: str, session: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        listing = _messages(_call(url, session, 0, "tools/list", {}))[0]
        if any(t["name"] == "fx__echo" for t in listing["result"]["tools"]):
            return
        assert time.monotonic() < deadline, listing
        time.sleep(0.1)


def test_the_handshake_answer_is_the_sdks_for_every_version(tmp_path: Path) -> None:
    """The shortcut's `initialize` answer equals the SDK path's, version by version (an unknown one included)."""
    (tmp_path / "sdk").mkdir()
    with (
        run_gateway(tmp_path, CONFIG) as lean,
        run_gateway(tmp_path / "sdk", CONFIG, env={"MANIFOLD_FAST_PATH": "false"}) as sdk,
    ):
        for gw in (lean, sdk):
            session, _ = _open(gw.url)
            _wait_tools(gw.url, session)  # both see the server up: the capabilities are of the same catalog
        for version in (*HANDSHAKE_PROTOCOL_VERSIONS, "1999-01-01"):
            _, mine = _open(lean.url, version)
            _, theirs = _open(sdk.url, version)
            assert mine.headers["content-type"] == "application/json", "answered by the shortcut"
            assert theirs.headers["content-type"].startswith("text/event-stream"), "answered by the SDK"
            assert _messages(mine) == _messages(theirs), version
        # A client the servers may ask things of is the SDK's from its first request.
        asking = initialize_body()
        asking["params"]["capabilities"] = {"elicitation": {}}
        assert _post(lean.url, asking).headers["content-type"].startswith("text/event-stream")


def test_a_dormant_session_is_served_then_woken_and_kept_by_the_sdk(tmp_path: Path) -> None:
    with run_gateway(tmp_path, CONFIG) as gw:
        session, _ = _open(gw.url)
        _wait_tools(gw.url, session)
        answer = _messages(_call(gw.url, session, 2, "tools/call", {"name": "fx__echo", "arguments": {"text": "a"}}))
        assert answer[0]["result"]["content"][0]["text"] == "a"
        assert _post(gw.url, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, session).json() == {
            "jsonrpc": "2.0",
            "id": 3,
            "result": {},
        }
        assert _sessions(gw.base) == 1

        # prompts/list is the SDK's: the session wakes, and the SDK answers it as its own.
        woken = _call(gw.url, session, 4, "prompts/list", {})
        assert woken.status_code == 200 and woken.headers["mcp-session-id"] == session
        assert _messages(woken)[0] == {"jsonrpc": "2.0", "id": 4, "result": {"prompts": []}}
        level = _call(gw.url, session, 5, "logging/setLevel", {"level": "info"})
        assert level.status_code == 200 and "error" not in _messages(level)[0], level.text
        after = _call(gw.url, session, 6, "tools/call", {"name": "fx__echo", "arguments": {"text": "b"}})
        assert _messages(after)[-1]["result"]["content"][0]["text"] == "b"
        assert _sessions(gw.base) == 1, "one session, woken once"

        ended = httpx2.delete(gw.url, headers={"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"})
        assert ended.status_code == 200
        gone = _call(gw.url, session, 7, "tools/list", {})
        assert gone.status_code == 404


def test_a_dormant_session_ends_on_delete_and_on_idle(tmp_path: Path) -> None:
    config = {**CONFIG, "session_idle_timeout": 1}
    with run_gateway(tmp_path, config) as gw:
        first, _ = _open(gw.url)
        _wait_tools(gw.url, first)
        deleted = httpx2.delete(gw.url, headers={"mcp-session-id": first, "mcp-protocol-version": "2025-11-25"})
        assert deleted.status_code == 200
        assert _call(gw.url, first, 2, "tools/list", {}).status_code == 404

        idle, _ = _open(gw.url)
        assert _call(gw.url, idle, 2, "tools/list", {}).status_code == 200
        time.sleep(0.6)
        assert _call(gw.url, idle, 3, "tools/list", {}).status_code == 200, "a request keeps it open"
        time.sleep(0.6)
        assert _call(gw.url, idle, 4, "tools/list", {}).status_code == 200
        deadline = time.monotonic() + 15
        while _sessions(gw.base) != 0:  # left alone, it idles out
            assert time.monotonic() < deadline, "the idle session never expired"
            time.sleep(0.1)
        expired = _call(gw.url, idle, 5, "tools/list", {})
        assert expired.status_code == 404, expired.text
        assert _sessions(gw.base) == 0
        # a session that idled out does not wake either
        assert _call(gw.url, idle, 6, "prompts/list", {}).status_code == 404


def test_requests_that_wake_a_session_at_once_share_one_wake(tmp_path: Path) -> None:
    with run_gateway(tmp_path, CONFIG) as gw:
        session, _ = _open(gw.url)
        _wait_tools(gw.url, session)
        answers: list[httpx2.Response] = []

        def ask(i: int) -> None:
            answers.append(_call(gw.url, session, 100 + i, "prompts/list", {}))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.status_code for r in answers) == [200] * 8, [r.text for r in answers]
        assert sorted(_messages(r)[0]["id"] for r in answers) == list(range(100, 108))
        assert _sessions(gw.base) == 1


def test_a_session_belongs_to_the_token_that_opened_it(tmp_path: Path) -> None:
    config = {
        **CONFIG,
        "auth": {
            "tokens": [{"name": "a", "token": "token-a-0123456789"}, {"name": "b", "token": "token-b-0123456789"}]
        },
    }
    with run_gateway(tmp_path, config) as gw:
        session, _ = _open(gw.url, authorization="Bearer token-a-0123456789")
        other = {"authorization": "Bearer token-b-0123456789"}
        refused = _post(gw.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session, **other)
        assert refused.status_code == 404
        waking = _post(gw.url, {"jsonrpc": "2.0", "id": 3, "method": "prompts/list"}, session, **other)
        assert waking.status_code == 404
        mine = _post(
            gw.url,
            {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
            session,
            authorization="Bearer token-a-0123456789",
        )
        assert mine.status_code == 200


def test_the_session_limit_counts_dormant_sessions(tmp_path: Path) -> None:
    with run_gateway(tmp_path, {**CONFIG, "max_sessions": 2}) as gw:
        _open(gw.url)
        _open(gw.url)
        refused = _post(gw.url, initialize_body())
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == "Too many open sessions"


@pytest.mark.anyio
async def test_the_sdk_client_wakes_its_session_with_its_get_stream(tmp_path: Path) -> None:
    with run_gateway(tmp_path, CONFIG) as gw:
        async with connect(gw.url, "2025-11-25") as client:
            await client.wait_for(lambda names: "fx__echo" in names)
            result = await client.call("fx__echo", {"text": "sdk"})
            assert result.content[0].text == "sdk"
            assert (await client.session.list_prompts()).prompts == []
        assert _sessions(gw.base) <= 1
