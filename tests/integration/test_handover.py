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
from tests.fixtures.servers import FIXTURE, free_port, run_http_fixture, stdio_spec
from tests.integration.conftest import Gateway, connect, run_gateway, wait_until
from tests.integration.test_workers import fixture_server, logged, served_by, worker

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
        # a handed-over server sees no script its arguments name: the operator grants the fixture's directory
        "sandbox": {"read": [str(FIXTURE.parent)]},
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
        # the server itself, not its sandbox (bwrap and the shell that starts it carry its arguments too)
        count += f"--name {label}" in cmdline and os.path.basename(cmdline.split(" ", 1)[0]).startswith("python")
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


# --- the egress rules, the bounds, one namespace ------------------------------------------------------------------

NO_ADMIN = {k: v for k, v in ENV.items() if k != "MANIFOLD_ADMIN_TOKEN"}


def web_entry(url: str, name: str = "web") -> dict[str, Any]:
    return {"type": "sse" if url.endswith("/sse") else "http", "name": name, "url": url}


def stdio_entry(name: str, label: str) -> dict[str, Any]:
    return {**mine(label), "name": name}


async def hand_over(client: Any, *entries: dict[str, Any]) -> list[dict[str, Any]]:
    added = await send_unchecked(client.session, "manifold/servers/add", {"mcpServers": list(entries)})
    return list(added["servers"])


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_handed_http_server_passes_the_egress_rules_without_the_admin_api(
    tmp_path: Path, transport: str
) -> None:
    with run_http_fixture(transport=transport, name="inside") as inside:
        with run_gateway(tmp_path, config(), env=NO_ADMIN) as gw:
            ready(gw)
            assert "MANIFOLD_ADMIN_TOKEN" not in {**os.environ, **NO_ADMIN}, "the admin API is off"
            async with connect(gw.url, LEGACY, headers=bearer(WEB)) as web:
                [entry] = await hand_over(web, web_entry(inside.url))
                assert entry["status"] == "failed", entry
                assert "egress" in entry["error"] and "loopback" in entry["error"], entry
                assert "web__whoami" not in await web.tool_names()
        allowed = {**config(), "runtime": {"egress": {"allow": ["127.0.0.0/8"]}}}
        with run_gateway(tmp_path, allowed, env=NO_ADMIN) as gw:
            ready(gw)
            async with connect(gw.url, LEGACY, headers=bearer(WEB)) as web:
                assert await hand_over(web, web_entry(inside.url)) == [{"name": "web", "status": "started"}]
                who = json.loads((await web.call("web__whoami")).content[0].text)
                assert who["argv"][who["argv"].index("--name") + 1] == "inside"


async def test_handed_servers_count_against_max_conversation_instances(tmp_path: Path) -> None:
    label = f"capped-{os.getpid()}"
    with run_gateway(tmp_path, {**config(), "max_conversation_instances": 2}, env=ENV) as gw:
        ready(gw)
        async with connect(gw.url, LEGACY, headers=bearer(AGENT)) as a:
            report = await hand_over(a, *(stdio_entry(f"s{i}", label) for i in range(3)))
            assert sorted(r["status"] for r in report) == ["failed", "started", "started"], report
            [failed] = [r for r in report if r["status"] == "failed"]
            assert "max_conversation_instances" in failed["error"], failed
            assert processes(label) == 2
        await wait_until(lambda: processes(label) == 0, 5, "handed servers to stop")


async def test_handed_servers_are_bounded_per_conversation_and_per_token(tmp_path: Path) -> None:
    label = f"bounded-{os.getpid()}"
    cfg = config()
    cfg["auth"]["tokens"].append({"name": "other", "token": "${T_OTHER}", "may_add": "stdio"})
    cfg["handover"] = {"max_per_conversation": 2, "max_per_token": 3}
    other = "other-token-0123456789abcdef"
    with run_gateway(tmp_path, cfg, env={**ENV, "T_OTHER": other}) as gw:
        ready(gw)
        async with (
            connect(gw.url, LEGACY, headers=bearer(AGENT)) as a,
            connect(gw.url, LEGACY, headers=bearer(AGENT)) as b,
            connect(gw.url, LEGACY, headers=bearer(other)) as c,
        ):
            first = await hand_over(a, *(stdio_entry(f"a{i}", label) for i in range(3)))
            assert [r["status"] for r in first] == ["started", "started", "failed"], first
            assert "max_per_conversation" in first[2]["error"]
            second = await hand_over(b, *(stdio_entry(f"b{i}", label) for i in range(2)))
            assert [r["status"] for r in second] == ["started", "failed"], second
            assert "max_per_token" in second[1]["error"]
            assert await hand_over(c, stdio_entry("c0", label)) == [{"name": "c0", "status": "started"}]
            assert processes(label) == 4
        await wait_until(lambda: processes(label) == 0, 5, "handed servers to stop")


async def test_one_request_hands_over_at_most_max_per_request_servers(tmp_path: Path) -> None:
    with run_gateway(tmp_path, config(), env=ENV) as gw:
        ready(gw)
        async with connect(gw.url, LEGACY, headers=bearer(AGENT)) as a:
            entries = [stdio_entry(f"n{i}", f"many-{os.getpid()}") for i in range(17)]
            with pytest.raises(MCPError) as err:
                await hand_over(a, *entries)
            assert "at most 16" in err.value.error.message and "handover.max_per_request" in err.value.error.message
            assert processes(f"many-{os.getpid()}") == 0


async def test_a_refused_or_failing_server_is_reported_at_once(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    with run_gateway(tmp_path, config(), env=ENV) as gw:
        ready(gw)
        async with connect(gw.url, LEGACY, headers=bearer(AGENT)) as a:
            started = time.monotonic()
            report = await hand_over(
                a,
                web_entry(closed, "refused"),  # loopback: the egress rules refuse it
                {"name": "absent", "command": "/nonexistent/mcp-server"},
            )
            took = time.monotonic() - started
            assert [r["status"] for r in report] == ["failed", "failed"], report
            assert "loopback" in report[0]["error"] and "command not found" in report[1]["error"], report
            assert took < 4, f"took {took:.1f} s (startup_timeout is 10 s)"
    allowed = {**config(), "runtime": {"egress": {"allow": ["127.0.0.0/8"]}}}
    with run_gateway(tmp_path, allowed, env=ENV) as gw:
        ready(gw)
        async with connect(gw.url, LEGACY, headers=bearer(AGENT)) as a:
            started = time.monotonic()
            [entry] = await hand_over(a, web_entry(closed, "nobody"))  # allowed, but nothing listens there
            took = time.monotonic() - started
            assert entry["status"] == "failed" and "connection refused" in entry["error"], entry
            assert took < 4, f"took {took:.1f} s (startup_timeout is 10 s)"


async def test_a_worker_cannot_take_a_handed_servers_name(tmp_path: Path) -> None:
    label = f"handed-w-{os.getpid()}"
    cfg = config()
    cfg["auth"]["tokens"].append({"name": "laptop", "token": "${T_LAPTOP}", "servers": [], "may_offer": ["mine", "w*"]})
    laptop = "laptop-token-0123456789abcdef"
    with run_gateway(tmp_path, cfg, env={**ENV, "T_LAPTOP": laptop}) as gw:
        ready(gw)
        async with connect(gw.url, LEGACY, headers=bearer(AGENT)) as a:
            assert await hand_over(a, mine(label)) == [{"name": "mine", "status": "started"}]
            with worker(gw, "mine", laptop, fixture_server("from-worker")) as clash:
                await logged(clash, "'mine' is the name or prefix of a server a conversation handed over")
                assert served_by(await a.call("mine__whoami")) == label
            with worker(gw, "wtaken", laptop, fixture_server("w")):
                await a.wait_for(lambda names: "wtaken__whoami" in names)
                [entry] = await hand_over(a, stdio_entry("wtaken", label))
                assert entry["status"] == "failed" and "offered by workers" in entry["error"], entry
