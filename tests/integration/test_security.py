"""Downstream security: tokens and per-token views, gated tools, no token passthrough, limits, exposure."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import pytest
from mcp import MCPError, types

from tests.fixtures.servers import free_port, run_http_fixture, stdio_spec
from tests.integration.conftest import ERAS, ROOT, connect, initialize_body, run_gateway, watch_changes

pytestmark = pytest.mark.anyio

ALPHA = "alpha-token-0123456789abcdef"
BETA = "beta-token-fedcba9876543210"
GAMMA = "gamma-token-5555555555555555"
ENV = {"T_ALPHA": ALPHA, "T_GAMMA": GAMMA}
ACCEPT = "application/json, text/event-stream"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tokens(**extra: Any) -> list[dict[str, Any]]:
    return [
        {"name": "alpha", "token": "${T_ALPHA}", "servers": ["fx"], "tools": ["fx__*"]},
        {"name": "beta", "sha256": hashlib.sha256(BETA.encode()).hexdigest(), "servers": ["oth*"], **extra},
        {"name": "gamma", "token": "${T_GAMMA}", "gated": "deny"},
    ]


def secured(**extra: Any) -> dict[str, Any]:
    return {
        "auth": {"tokens": tokens()},
        "servers": {"fx": stdio_spec(), "other": {**stdio_spec(), "pin": "off"}},
        **extra,
    }


def post(url: str, body: Any, headers: dict[str, str] | None = None, content: bytes | None = None) -> httpx2.Response:
    return httpx2.post(
        url,
        json=body if content is None else None,
        content=content,
        headers={"Accept": ACCEPT, "Content-Type": "application/json", **(headers or {})},
        timeout=30,
    )


@pytest.mark.parametrize("era", ERAS)
async def test_each_token_sees_and_calls_only_its_view(tmp_path: Path, era: str) -> None:
    with run_gateway(tmp_path, secured(), env=ENV) as gw:
        async with (
            watch_changes(gw.url, era, bearer(ALPHA)) as (alpha, alpha_changes),
            watch_changes(gw.url, era, bearer(BETA)) as (beta, beta_changes),
            connect(gw.url, era, headers=bearer(GAMMA)) as gamma,
        ):
            alpha_names = await alpha.wait_for(lambda n: "fx__echo" in n)
            beta_names = await beta.wait_for(lambda n: "other__echo" in n)
            assert {n.split("__")[0] for n in alpha_names} == {"fx"}
            assert {n.split("__")[0] for n in beta_names} == {"other"}
            gamma_names = await gamma.wait_for(lambda n: "fx__echo" in n and "other__echo" in n)
            assert "fx__write_note" not in gamma_names and "fx__no_annotations" not in gamma_names, "deny hides gated"
            assert "fx__write_note" in alpha_names

            with pytest.raises(MCPError) as err:
                await alpha.call("other__echo", {"text": "x"})
            assert err.value.code == -32602 and "Unknown tool" in err.value.error.message
            with pytest.raises(MCPError):
                await gamma.call("fx__write_note", {"note": "n"})
            assert (await alpha.call("fx__write_note", {"note": "n"})).content[0].text == "stored"

            # A change in beta's view reaches beta only.
            alpha_seen, beta_seen = alpha_changes.count, beta_changes.count
            await beta.call("other__set_tools", {"names": ["fresh"]})
            await beta_changes.wait_beyond(beta_seen)
            assert "other__fresh" in await beta.tool_names()
            await anyio.sleep(1.0)
            assert alpha_changes.count == alpha_seen, "alpha's view did not change, so alpha is not told"


def test_missing_or_wrong_token_is_401_with_a_json_rpc_body(tmp_path: Path) -> None:
    with run_gateway(tmp_path, secured(), env=ENV) as gw:
        for headers in ({}, bearer("wrong"), {"Authorization": ALPHA}, {"Authorization": f"Basic {ALPHA}"}):
            response = post(gw.url, initialize_body(), headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
            body = response.json()
            assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32001
        assert httpx2.get(f"{gw.base}/healthz").status_code == 200, "probes stay open"
        assert httpx2.get(f"{gw.base}/metrics").status_code == 200, "scrapers stay open"
        assert httpx2.get(f"{gw.url}", headers={"Accept": "text/event-stream"}).status_code == 401
        assert post(gw.url, initialize_body(), bearer(ALPHA)).status_code == 200


def test_a_2025_session_stays_bound_to_its_token(tmp_path: Path) -> None:
    with run_gateway(tmp_path, secured(), env=ENV) as gw:
        opened = post(gw.url, initialize_body(), bearer(ALPHA))
        session = opened.headers["mcp-session-id"]
        headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        stolen = post(gw.url, listing, {**bearer(BETA), **headers})
        assert stolen.status_code == 404
        assert post(gw.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {**bearer(ALPHA), **headers})
        assert post(gw.url, listing, {**bearer(ALPHA), **headers}).status_code == 200


def _answer(action: Literal["accept", "decline", "cancel"], allow: bool | None = None):
    async def callback(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert "Allow fx__write_note" in params.message
        assert '"note": "hello"' in params.message
        content: dict[str, Any] | None = {"allow": allow} if allow is not None else None
        return types.ElicitResult(action=action, content=content)

    return callback


@pytest.mark.parametrize("era", ERAS)
async def test_gated_confirm_asks_the_human(tmp_path: Path, era: str) -> None:
    config = {
        "auth": {"tokens": [{"name": "careful", "token": "${T_ALPHA}", "gated": "confirm"}]},
        "servers": {"fx": stdio_spec()},
    }
    with run_gateway(tmp_path, config, env=ENV) as gw:
        args = {"note": "hello"}
        async with connect(gw.url, era, headers=bearer(ALPHA), elicitation_callback=_answer("accept", True)) as c:
            await c.wait_for(lambda n: "fx__write_note" in n)
            assert (await c.call("fx__echo", {"text": "read-only: no question"})).is_error is False
            allowed = await c.call("fx__write_note", args)
            assert allowed.is_error is False and allowed.content[0].text == "stored"
        async with connect(gw.url, era, headers=bearer(ALPHA), elicitation_callback=_answer("accept", False)) as c:
            refused = await c.call("fx__write_note", args)
            assert refused.is_error is True and "did not allow" in refused.content[0].text
        async with connect(gw.url, era, headers=bearer(ALPHA), elicitation_callback=_answer("decline")) as c:
            declined = await c.call("fx__write_note", args)
            assert declined.is_error is True and "did not allow" in declined.content[0].text
        async with connect(gw.url, era, headers=bearer(ALPHA)) as c:
            cannot = await c.call("fx__write_note", args)
            assert cannot.is_error is True and "cannot ask" in cannot.content[0].text


async def test_client_credentials_are_never_forwarded(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web:
        config = {
            "auth": {"tokens": [{"name": "alpha", "token": "${T_ALPHA}"}]},
            "servers": {
                "web": {
                    "url": web.url,
                    "headers": {"X-Upstream-Key": "configured-key"},
                    "forward_headers": ["X-Trace-Id"],
                },
                "plain": {"url": web.url},
            },
        }
        with run_gateway(tmp_path, config, env=ENV) as gw:
            headers = {**bearer(ALPHA), "Cookie": "session=client-cookie", "X-Trace-Id": "trace-42"}
            async with connect(gw.url, "2026-07-28", headers=headers) as client:
                await client.wait_for(lambda n: "web__whoami" in n and "plain__whoami" in n)
                seen = json.loads((await client.call("web__whoami")).content[0].text)["headers"]
                plain = json.loads((await client.call("plain__whoami")).content[0].text)["headers"]
    assert seen["x-upstream-key"] == "configured-key"
    assert seen["x-trace-id"] == "trace-42"
    assert "x-trace-id" not in plain, "only servers that list a header get it"
    for received in (seen, plain):
        assert ALPHA not in json.dumps(received)
        assert "cookie" not in received
        assert received.get("authorization") is None


def no_sessions(base: str, timeout: float = 15) -> None:
    """Wait until the gateway counts no open 2025-era session (an idle one ends `session_idle_timeout` after use)."""
    deadline = time.monotonic() + timeout
    while True:
        body = httpx2.get(f"{base}/metrics", headers=bearer(GAMMA), timeout=5).text
        if "manifold_downstream_sessions 0.0" in body.splitlines():
            return
        assert time.monotonic() < deadline, "the idle sessions never expired"
        time.sleep(0.1)


async def test_limits(tmp_path: Path) -> None:
    config = {
        "auth": {
            "tokens": [
                # One token back every 5 s: the burst is spent however slowly a busy machine sends the requests.
                {"name": "slow", "token": "${T_ALPHA}", "rate": 0.2, "burst": 3},
                {"name": "free", "token": "${T_GAMMA}"},
            ]
        },
        "servers": {"fx": stdio_spec()},
        "max_body_bytes": 4096,
        "max_json_depth": 16,
        "max_sessions": 3,
        "session_idle_timeout": 5,  # long enough that none of the first three expires before the fourth asks
    }
    with run_gateway(tmp_path, config, env=ENV) as gw:
        huge = post(
            gw.url,
            None,
            bearer(GAMMA),
            content=b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * 8000 + b'"}}',
        )
        assert huge.status_code == 413
        deep = post(gw.url, None, bearer(GAMMA), content=b"[" * 40 + b"]" * 40)
        assert deep.status_code == 400 and "nested deeper" in deep.json()["error"]["message"]

        statuses = [post(gw.url, initialize_body(), bearer(ALPHA)).status_code for _ in range(5)]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
        limited = post(gw.url, initialize_body(), bearer(ALPHA))
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert post(gw.url, initialize_body(), bearer(GAMMA)).status_code == 503, "the 4th session is over the cap"

        no_sessions(gw.base)  # idle sessions expire and free their slots
        opened = post(gw.url, initialize_body(), bearer(GAMMA))
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        no_sessions(gw.base)  # this one expires too: nothing touches it
        expired = post(
            gw.url,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {**bearer(GAMMA), "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"},
        )
        assert expired.status_code == 404


def test_refuses_to_expose_an_open_gateway(tmp_path: Path) -> None:
    path = tmp_path / "open.yaml"
    path.write_text("servers: {}\n")
    port = str(free_port())
    refused = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--host", "0.0.0.0", "--port", port],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 1
    assert "auth.tokens" in refused.stderr and "--allow-unauthenticated" in refused.stderr
    with run_gateway(tmp_path, {"servers": {}}, args=("--host", "0.0.0.0", "--allow-unauthenticated")) as gw:
        assert httpx2.get(f"{gw.base}/healthz").status_code == 200
    with run_gateway(tmp_path, {"servers": {}}) as gw:
        warned = [e for e in gw.log_events() if e.get("event", "").startswith("no API tokens configured")]
        assert warned and warned[0]["level"] == "warning"


def _confirming_replicas(tmp_path: Path, confirm_key: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first answer (from replica A) and the answer to the retry (sent to replica B) of a confirmed call."""
    from bench.mcphttp import (
        CLIENT_INFO,
        META_CAPABILITIES,
        META_CLIENT_INFO,
        META_VERSION,
        MODERN,
        Connection,
        Endpoint,
        Session,
    )

    config: dict[str, Any] = {
        "auth": {"tokens": [{"name": "careful", "token": "${T_ALPHA}", "gated": "confirm"}]},
        "servers": {"fx": stdio_spec()},
    }
    if confirm_key is not None:
        config["confirm_key"] = confirm_key
    meta = {META_VERSION: MODERN, META_CLIENT_INFO: CLIENT_INFO, META_CAPABILITIES: {"elicitation": {}}}
    session = Session(MODERN, {"MCP-Protocol-Version": MODERN, **bearer(ALPHA)}, meta)
    args = {"name": "fx__write_note", "arguments": {"note": "once"}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with run_gateway(tmp_path / "a", config, env=ENV) as a, run_gateway(tmp_path / "b", config, env=ENV) as b:
        conn_a, conn_b = Connection(Endpoint.parse(a.url)), Connection(Endpoint.parse(b.url))
        for conn in (conn_a, conn_b):
            deadline = time.monotonic() + 20
            while "fx__write_note" not in {t["name"] for t in conn.request(session, "tools/list")["tools"]}:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        first = conn_a.request(session, "tools/call", args)
        assert first["resultType"] == "input_required"
        answer = {"action": "accept", "content": {"allow": True}}
        retry = {**args, "inputResponses": {"manifold/confirm": answer}, "requestState": first["requestState"]}
        second = conn_b.request(session, "tools/call", retry)
        conn_a.close()
        conn_b.close()
    return first, second


def test_a_confirmation_answered_on_another_replica_holds_with_a_shared_key(tmp_path: Path) -> None:
    _, second = _confirming_replicas(tmp_path, "a-shared-confirm-key-0123456789")
    assert second.get("isError") is not True and second["content"][0]["text"] == "stored"


def test_without_a_shared_key_another_replica_asks_again(tmp_path: Path) -> None:
    _, second = _confirming_replicas(tmp_path, None)
    assert second["resultType"] == "input_required"


SCRIPTED = Path(__file__).resolve().parents[1] / "fixtures" / "scripted_upstream.py"


async def test_a_held_calls_request_state_opens_it_for_its_own_caller_and_tool_only(tmp_path: Path) -> None:
    """A 2025-era server's question held for a 2026 caller: another token that learns the `requestState` (with
    the tool in its view, or outside it) cannot answer it or take its result, nor can the caller on another tool."""
    config = {
        "auth": {
            "tokens": [
                {"name": "alpha", "token": "${T_ALPHA}"},
                {"name": "gamma", "token": "${T_GAMMA}"},
                {"name": "beta", "sha256": hashlib.sha256(BETA.encode()).hexdigest(), "servers": []},
            ]
        },
        "servers": {"scripted": {"command": sys.executable, "args": [str(SCRIPTED)], "pin": "off"}},
    }

    async def ask(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    stolen = types.ElicitResult(action="accept", content={"name": "Mallory"})
    with run_gateway(tmp_path, config, env=ENV) as gw:
        async with connect(gw.url, "2026-07-28", headers=bearer(ALPHA), elicitation_callback=ask) as alpha:
            await alpha.wait_for(lambda names: "scripted__ask_and_wait" in names)
            with anyio.fail_after(20):
                held = await alpha.session.call_tool("scripted__ask_and_wait", {}, allow_input_required=True)
            assert isinstance(held, types.InputRequiredResult) and held.input_requests, held
            [key] = held.input_requests
            attempts = [(GAMMA, "scripted__ask_and_wait"), (BETA, "scripted__ask_and_wait"), (ALPHA, "scripted__echo")]
            for token, tool in attempts:
                async with connect(gw.url, "2026-07-28", headers=bearer(token)) as other:
                    with pytest.raises(MCPError) as err:
                        await other.session.call_tool(
                            tool,
                            {},
                            input_responses={key: stolen},
                            request_state=held.request_state,
                            allow_input_required=True,
                        )
                    assert err.value.code == types.INVALID_PARAMS, (token, tool, err.value)
                    assert "requestState is unknown" in err.value.error.message
            with anyio.fail_after(20):
                done = await alpha.session.call_tool(
                    "scripted__ask_and_wait",
                    {},
                    input_responses={key: types.ElicitResult(action="accept", content={"name": "Ada"})},
                    request_state=held.request_state,
                    allow_input_required=True,
                )
            assert isinstance(done, types.CallToolResult)
            assert done.content[0].text == 'accept: {"name": "Ada"}', done  # type: ignore[union-attr]
