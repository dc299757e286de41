"""`manifold` is the gateway's own: no server, runtime server, handed-over server or worker takes it as its name
or prefix, and no tool of a server without a prefix passes for `manifold__search_tools` or `manifold__call_tool`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError

from gateway.internals.sdk import send_unchecked
from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import Gateway, connect, run_gateway, write_config
from tests.integration.test_cli import manifold
from tests.integration.test_workers import fixture_server, worker

pytestmark = pytest.mark.anyio
LEGACY, MODERN = "2025-11-25", "2026-07-28"
AGENT, SEEKER, ADMIN = "agent-token-0123456789abcdef", "seeker-token-0123456789abcd", "admin-token-0123456789abcdef"
ENV = {"T_AGENT": AGENT, "T_SEEKER": SEEKER, "MANIFOLD_ADMIN_TOKEN": ADMIN}
POSING = ["manifold__call_tool", "manifold__search_tools", "MANIFOLD__shout"]  # a bare server's tools posing


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("reserved")
    tools = tmp / "tools.json"
    tools.write_text(json.dumps([*POSING, "keep_me"]))
    config = {
        "auth": {
            "tokens": [
                {"name": "agent", "token": "${T_AGENT}", "may_add": "http", "may_offer": ["*"]},
                {"name": "seeker", "token": "${T_SEEKER}", "exposure": "deferred"},
            ]
        },
        "servers": {"bare": {**stdio_spec("normal", "--tools-file", str(tools)), "prefix": "", "required": True}},
    }
    with run_gateway(tmp, config, env=ENV) as gw:
        deadline = time.monotonic() + 20
        while httpx2.get(f"{gw.base}/readyz", timeout=2).status_code != 200:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        yield gw


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_config_may_not_name_a_server_manifold_or_give_it_that_prefix(tmp_path: Path) -> None:
    servers = {"manifold": stdio_spec(), "Manifold": stdio_spec(), "shadow": {**stdio_spec(), "prefix": "manifold"}}
    result = manifold("check", "--config", str(write_config(tmp_path, {"servers": servers})))
    assert result.returncode != 0
    out = result.stdout + result.stderr
    for place, what, value in (("manifold", "name", "manifold"), ("Manifold", "name", "Manifold")):
        assert f"servers.{place}: the {what} '{value}' is reserved for the gateway's own tools (manifold__*)" in out
    assert "servers.shadow: the prefix 'manifold' is reserved" in out


async def test_a_bare_servers_tools_named_like_the_gateways_own_are_not_offered(gateway: Gateway) -> None:
    async with connect(gateway.url, MODERN, headers=bearer(AGENT)) as agent:
        names = await agent.tool_names()
        assert "keep_me" in names and "echo" in names, names
        assert not [n for n in names if n.lower().startswith("manifold__")], names
        for name in POSING:
            with pytest.raises(MCPError, match="Unknown tool"):
                await agent.call(name, {})
    async with connect(gateway.url, LEGACY, headers=bearer(SEEKER)) as seeker:
        assert sorted(await seeker.tool_names()) == ["manifold__call_tool", "manifold__search_tools"]
        found = await seeker.call("manifold__search_tools", {"query": "manifold call search shout"})
        assert not any(name in found.content[0].text for name in POSING[2:]), found  # type: ignore[union-attr]
    events = [e for e in gateway.log_events() if e.get("event", "").startswith("tool not offered")]
    assert sorted((e["server"], e["tool"]) for e in events) == sorted(("bare", name) for name in POSING)


def test_the_admin_api_refuses_the_name_and_the_prefix(gateway: Gateway) -> None:
    for body, words in (
        ({"name": "manifold", "url": "https://example.com/mcp"}, "the name 'manifold' is reserved"),
        ({"name": "MANIFOLD", "url": "https://example.com/mcp"}, "the name 'MANIFOLD' is reserved"),
        ({"name": "shadow", "url": "https://example.com/mcp", "prefix": "manifold"}, "the prefix 'manifold' is"),
    ):
        response = httpx2.post(f"{gateway.base}/admin/servers", json=body, headers=bearer(ADMIN), timeout=30)
        assert response.status_code == 422, response.text
        assert words in response.json()["error"], response.text
    assert httpx2.get(f"{gateway.base}/admin/servers/shadow", headers=bearer(ADMIN), timeout=30).status_code == 404


async def test_a_conversation_may_not_hand_over_a_server_named_manifold(gateway: Gateway) -> None:
    async with connect(gateway.url, LEGACY, headers=bearer(AGENT)) as agent:
        entries: list[dict[str, Any]] = [
            {"name": name, "type": "http", "url": "https://example.com/mcp"} for name in ("manifold", "Manifold")
        ]
        answer = await send_unchecked(agent.session, "manifold/servers/add", {"mcpServers": entries})
        for entry, name in zip(answer["servers"], ("manifold", "Manifold"), strict=True):
            assert entry["status"] == "failed", entry
            assert f"the name '{name}' is reserved for the gateway's own tools" in entry["error"], entry


async def test_a_worker_may_not_offer_the_name_manifold(gateway: Gateway) -> None:
    with worker(gateway, "manifold", AGENT, fixture_server("posing")) as posing:
        assert await anyio.to_thread.run_sync(posing.proc.wait, 30) == 1, posing.log()
    assert "the name 'manifold' is reserved for the gateway's own tools" in posing.log()
    async with connect(gateway.url, MODERN, headers=bearer(AGENT)) as agent:
        assert not [n for n in await agent.tool_names() if n.lower().startswith("manifold__")]
