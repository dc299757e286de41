"""Hostile input thrown at a running gateway: every answer well-formed, nothing leaks, it keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import Gateway, initialize_body, run_gateway

TOKEN = "hostile-test-token-abcdef0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ACCEPT = "application/json, text/event-stream"
ALLOWED = {200, 202, 400, 401, 403, 404, 405, 406, 413, 415, 421, 422, 429}
LEAKS = ("Traceback", 'File "', "/work/", '.py"', ".py:", ".py,", "site-packages")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("hostile")
    config = {"auth": {"tokens": [{"name": "t", "token": "${T_HOSTILE}"}]}, "servers": {"fx": stdio_spec()}}
    with run_gateway(tmp, config, env={"T_HOSTILE": TOKEN}) as gw:
        _wait_for_tools(gw)
        yield gw


def _wait_for_tools(gw: Gateway) -> None:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        response = _post(gw, {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": _meta()}, modern=True)
        if "fx__echo" in response.text:
            return
        time.sleep(0.2)
    raise AssertionError("the gateway never listed fx__echo")


def _meta() -> dict[str, Any]:
    return {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    }


def _post(
    gw: Gateway,
    body: Any = None,
    *,
    content: bytes | None = None,
    modern: bool = False,
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    base = {"Accept": ACCEPT, "Content-Type": "application/json", **AUTH}
    if modern:
        base["MCP-Protocol-Version"] = "2026-07-28"
        base["Mcp-Method"] = body["method"]
        if body["method"] == "tools/call":
            base["Mcp-Name"] = body["params"]["name"].encode("unicode_escape").decode()
    data = content if content is not None else json.dumps(body).encode()
    return httpx2.post(gw.url, content=data, headers={**base, **(headers or {})}, timeout=30)


def _assert_well_formed(response: httpx2.Response) -> None:
    assert response.status_code in ALLOWED, (response.status_code, response.text[:500])
    for leak in LEAKS:
        assert leak not in response.text, (leak, response.text[:500])
    if response.headers.get("content-type", "").startswith("application/json") and response.content:
        body = response.json()
        if isinstance(body, dict) and "error" in body:
            assert isinstance(body["error"]["code"], int) and isinstance(body["error"]["message"], str)


def _echo_works(gw: Gateway) -> None:
    params = {"name": "fx__echo", "arguments": {"text": "still here"}, **_meta()}
    response = _post(gw, {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}, modern=True)
    assert response.status_code == 200 and "still here" in response.text


BIDI = "\u202e\u2066\u0000\u0007\u200b"
junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(), max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
methods = st.sampled_from(
    [
        "initialize",
        "tools/list",
        "tools/call",
        "server/discover",
        "subscriptions/listen",
        "ping",
        "resources/list",
        "notifications/initialized",
        "notifications/cancelled",
        "no/such",
        "",
        "tools/call\u202e",
    ]
) | st.text(max_size=30)
tool_names = st.sampled_from(["fx__echo", "fx__nope", f"fx__echo{BIDI}", "x" * 5000, ""]) | st.text(max_size=70)
messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", None]), "method": methods},
    optional={
        "id": st.integers() | st.text(max_size=10) | st.none() | st.floats(allow_nan=False),
        "params": junk
        | st.fixed_dictionaries({"name": tool_names}, optional={"arguments": junk, "_meta": junk})
        | st.fixed_dictionaries({"name": tool_names, "arguments": junk}).map(lambda p: {**p, **_meta()}),
    },
)
bodies = st.one_of(
    st.binary(max_size=300).map(lambda b: ("raw", b)),
    junk.map(lambda j: ("json", j)),
    messages.map(lambda m: ("json", m)),
    st.lists(messages, min_size=1, max_size=4).map(lambda batch: ("json", batch)),
)
versions = st.sampled_from([None, "2026-07-28", "2025-11-25", "2024-11-05", "1999-01-01", "garbage\u202e"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, version=versions)
def test_generated_hostile_requests_get_well_formed_answers(gateway: Gateway, body: Any, version: str | None) -> None:
    kind, value = body
    headers = {"MCP-Protocol-Version": version} if version is not None else {}
    try:
        headers_ok = {k: v.encode("latin-1").decode("latin-1") for k, v in headers.items()}
    except UnicodeEncodeError:
        headers_ok = {}
    content = value if kind == "raw" else json.dumps(value).encode()
    _assert_well_formed(_post(gateway, content=content, headers=headers_ok))


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"\xff\xfe"}}', {}),
        (b"\xc3\x28\xa0\xa1", {}),
        (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"ping"}]', {}),
        (b"{", {}),
        (b"", {}),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', {"MCP-Protocol-Version": "2099-01-01"}),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', {"Content-Type": "text/plain"}),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', {"Accept": "text/html"}),
        (
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "y" * 100_000}}).encode(),
            {},
        ),
    ],
)
def test_specific_hostile_requests(gateway: Gateway, content: bytes, headers: dict[str, str]) -> None:
    _assert_well_formed(_post(gateway, content=content, headers=headers))


def test_bidi_and_control_characters_in_tool_names_are_unknown_tools(gateway: Gateway) -> None:
    params = {"name": f"fx__echo{BIDI}", "arguments": {"text": "x"}, **_meta()}
    response = _post(gateway, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}, modern=True)
    _assert_well_formed(response)
    text = response.text.replace(" ", "")
    # Either the routing header cannot carry the name (-32020) or the name is unknown (-32602).
    assert '"code":-32602' in text or '"code":-32020' in text, text
    opened = _post(gateway, initialize_body())
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    _post(gateway, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
    legacy = {"name": f"fx__echo{BIDI}", "arguments": {"text": "x"}}
    answer = _post(gateway, {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": legacy}, headers=session)
    assert answer.status_code == 200 and '"code":-32602' in answer.text.replace(" ", ""), answer.text


def test_still_serving_after_the_onslaught(gateway: Gateway) -> None:
    assert gateway.proc.poll() is None
    _echo_works(gateway)
