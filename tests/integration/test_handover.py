"""Servers a conversation hands over (`manifold/servers/add`, the ACP `mcpServers` shape): its own, for it alone."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import MCPError

from gateway.internals.sdk import send_unchecked
from tests.fixtures.servers import FIXTURE, stdio_spec
from tests.integration.conftest import Gateway, connect, run_gateway, wait_until

pytestmark = pytest.mark.anyio
LEGACY = "2025-11-25"
AGENT, WEB, PLAIN = "agent-token-0123456789abcdef", "web-token-0123456789abcdef01", "plain-token-0123456789abcdef"
SECRET = "s3cret-handed-value-7781"
ENV = {"T_AGENT": AGENT, "T_WEB": WEB, "T_PLAIN": PLAIN, "MANIFOLD_ADMIN_TOKEN": "admin-token-0123456789abcdef"}


def config() -> dict[str, Any]:
    return {
        "auth": {
            "tokens": [
                {"name": "agent", "token": "${T_AGENT}", "may_add": "stdio"},
                {"name": "web", "token": "${T_WEB}", "may_add": "http"},
                {"name": "plain", "token": "${T_PLAIN}"},
            ]
        },
        "servers": {"fx": {**stdio_spec(), "required": True}},
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def mine(label: str) -> dict[str, Any]:
    """An ACP stdio server entry: the fixture, told apart by its argv and a secret in its env."""
    return {
        "name": "mine",
        "command": sys.executable,
        "args": [str(FIXTURE), "--transport", "stdio", "--name", label],
        "env": [{"name": "FIXTURE_SECRET", "value": f"{SECRET}-{label}"}],
    }


def processes(label: str) -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        count += f"--name {label}" in cmdline
    return count


def ready(gw: Gateway) -> None:
    deadline = time.monotonic() + 20
    while httpx2.get(f"{gw.base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


async def test_a_handed_server_is_its_conversations_alone_and_stops_with_it(tmp_path: Path) -> None:
    label_a, label_b = f"handed-a-{os.getpid()}", f"handed-b-{os.getpid()}"
    with run_gateway(tmp_path, config(), env=ENV) as gw:
        ready(gw)
        async with (
            connect(gw.url, LEGACY, headers=bearer(AGENT)) as a,
            connect(gw.url, LEGACY, headers=bearer(AGENT)) as b,
        ):
            added = await send_unchecked(a.session, "manifold/servers/add", {"mcpServers": [mine(label_a)]})
            assert added["servers"] == [{"name": "mine", "status": "started"}]
            again = await send_unchecked(a.session, "manifold/servers/add", {"mcpServers": [mine(label_a)]})
            assert again["servers"] == [{"name": "mine", "status": "running"}]
            assert "mine__whoami" in await a.tool_names()
            assert "mine__whoami" not in await b.tool_names()
            who = json.loads((await a.call("mine__whoami")).content[0].text)
            assert who["env"]["FIXTURE_SECRET"] == f"{SECRET}-{label_a}"
            with pytest.raises(MCPError, match="Unknown tool: mine__whoami"):
                await b.session.call_tool("mine__whoami", {})
            # The same name in another conversation: a separate instance with its own env.
            await send_unchecked(b.session, "manifold/servers/add", {"mcpServers": [mine(label_b)]})
            who_b = json.loads((await b.call("mine__whoami")).content[0].text)
            assert who_b["env"]["FIXTURE_SECRET"] == f"{SECRET}-{label_b}"
            assert processes(label_a) == 1 and processes(label_b) == 1
        await wait_until(lambda: processes(label_a) + processes(label_b) == 0, 3, "handed servers to stop")
        assert SECRET not in gw.log()
        metrics = httpx2.get(f"{gw.base}/metrics", timeout=5).text
        assert 'server="mine"' not in metrics


async def test_what_a_token_may_not_hand_over_is_refused_with_the_reason(tmp_path: Path) -> None:
    with run_gateway(tmp_path, config(), env=ENV) as gw:
        ready(gw)
        async with connect(gw.url, LEGACY, headers=bearer(PLAIN)) as plain:
            refused = await send_unchecked(plain.session, "manifold/servers/add", {"mcpServers": [mine("x")]})
            [entry] = refused["servers"]
            assert entry["status"] == "failed" and "may_add: none" in entry["error"]
        async with connect(gw.url, LEGACY, headers=bearer(WEB)) as web:
            stdio = await send_unchecked(web.session, "manifold/servers/add", {"mcpServers": [mine("y")]})
            assert "may not hand over stdio" in stdio["servers"][0]["error"]
            loopback = {"type": "http", "name": "local", "url": gw.url, "headers": [{"name": "X-Key", "value": SECRET}]}
            looped = await send_unchecked(web.session, "manifold/servers/add", {"mcpServers": [loopback]})
            [entry] = looped["servers"]
            assert entry["status"] == "failed" and "egress" in entry["error"].lower(), entry
            clash = {**mine("z"), "name": "fx"}
            web_clash = await send_unchecked(web.session, "manifold/servers/add", {"mcpServers": [clash]})
            assert web_clash["servers"][0]["status"] == "failed"
        assert SECRET not in gw.log()
