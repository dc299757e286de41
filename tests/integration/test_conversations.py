"""Per-conversation upstreams (`isolation: conversation`): each conversation its own process, nothing left behind."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.servers import run_http_fixture, stdio_spec
from tests.integration.conftest import THIRDPARTY, Gateway, connect, run_gateway, wait_until

pytestmark = pytest.mark.anyio
SCRIPTED = Path(__file__).resolve().parents[1] / "fixtures" / "scripted_upstream.py"
LEGACY, MODERN = "2025-11-25", "2026-07-28"


def fixture_processes(marker: str) -> list[int]:
    """The pids of running fixture processes whose command line carries `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        server = os.path.basename(cmdline.split(" ", 1)[0]).startswith("python")  # not its sandbox's bwrap or shell
        if marker in cmdline and "upstream.py" in cmdline and server:
            found.append(int(pid))
    return found


def isolated(marker: str, **options: Any) -> dict[str, Any]:
    spec = stdio_spec("normal", "--name", marker)
    return {"servers": {"state": {**spec, "isolation": "conversation", "required": True, **options}}}


def wait_ready(gw: Gateway) -> None:
    deadline = time.monotonic() + 20
    while httpx2.get(f"{gw.base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never became ready"
        time.sleep(0.1)


def text(result: Any) -> str:
    return str(result.content[0].text)


def metric(gw: Gateway, name: str) -> float:
    body = httpx2.get(f"{gw.base}/metrics", timeout=5).text
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_two_sessions_have_their_own_process_and_state(tmp_path: Path) -> None:
    marker = f"iso-{os.getpid()}-a"
    with run_gateway(tmp_path, isolated(marker)) as gw:
        wait_ready(gw)
        async with connect(gw.url, LEGACY) as a, connect(gw.url, LEGACY) as b:
            assert [text(await a.call("state__count")) for _ in range(3)] == ["1", "2", "3"]
            assert text(await b.call("state__count")) == "1", "b's process is not a's"
            assert len(fixture_processes(marker)) == 3  # the listing's own, a's and b's
            assert await a.tool_names() == await b.tool_names()
        # Both sessions ended (their clients deleted them): their processes are gone within a second or so.
        await wait_until(lambda: len(fixture_processes(marker)) == 1, 2, "the conversations' processes to stop")
        assert metric(gw, 'manifold_conversation_instance_stops_total{reason="session_end"') == 2
        assert metric(gw, "manifold_conversation_instances{") == 0


async def test_an_http_server_gets_its_own_session_per_conversation(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web:
        server = {"url": web.url, "protocol": "2025-11-25", "isolation": "conversation", "required": True}
        with run_gateway(tmp_path, {"servers": {"web": server}}) as gw:
            wait_ready(gw)
            async with connect(gw.url, LEGACY) as a, connect(gw.url, LEGACY) as b:
                seen = []
                for client in (a, a, b):
                    who = json.loads(text(await client.call("web__whoami")))
                    seen.append(who["headers"]["mcp-session-id"])
            assert seen[0] == seen[1] != seen[2], "one upstream session per conversation, kept across its calls"


async def test_server_memory_keeps_one_graph_per_conversation(tmp_path: Path) -> None:
    """`@modelcontextprotocol/server-memory` per conversation, its file named by `${MANIFOLD_CONVERSATION}`."""
    memory = THIRDPARTY / "server-memory" / "dist" / "index.js"
    files = tmp_path / "graphs"
    files.mkdir()
    server = {
        "command": "node",
        "args": [str(memory)],
        "env": {"MEMORY_FILE_PATH": f"{files}/${{MANIFOLD_CONVERSATION:-shared}}.jsonl"},
        "sandbox": {"write": [str(files)]},
        "isolation": "conversation",
        "required": True,
        "startup_timeout": 30,
    }
    with run_gateway(tmp_path, {"servers": {"memory": server}}) as gw:
        wait_ready(gw)
        async with connect(gw.url, LEGACY) as a, connect(gw.url, LEGACY) as b:
            entity = {"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}
            created = await a.call("memory__create_entities", {"entities": [entity]})
            assert created.is_error is not True, text(created)
            assert "Ada" in text(await a.call("memory__read_graph"))
            assert "Ada" not in text(await b.call("memory__read_graph")), "b's graph is its own"
            await b.call("memory__create_entities", {"entities": [{**entity, "name": "Grace"}]})
        graphs = sorted(p.read_text() for p in files.glob("*.jsonl") if p.name != "shared.jsonl")
        assert len(graphs) == 2 and "Ada" in graphs[0] + graphs[1]
        assert not any("Ada" in g and "Grace" in g for g in graphs), "one file per conversation"


async def test_a_2026_client_is_one_conversation_per_token_or_per_the_id_it_sends(tmp_path: Path) -> None:
    marker = f"iso-{os.getpid()}-b"
    with run_gateway(tmp_path, isolated(marker)) as gw:
        wait_ready(gw)
        async with connect(gw.url, MODERN) as c:
            assert text(await c.call("state__count")) == "1"
            assert text(await c.call("state__count")) == "2"  # no id: one conversation for the token
            first = {"manifold/conversation": "first"}
            assert text(await c.call("state__count", meta=first)) == "1"
            assert text(await c.call("state__count", meta=first)) == "2"
            assert text(await c.call("state__count", meta={"manifold/conversation": "second"})) == "1"
            assert text(await c.call("state__count")) == "3"


async def test_idle_conversations_stop_and_max_instances_is_a_clear_busy_error(tmp_path: Path) -> None:
    marker = f"iso-{os.getpid()}-c"
    with run_gateway(tmp_path, isolated(marker, idle_timeout=1, max_instances=1)) as gw:
        wait_ready(gw)
        async with connect(gw.url, MODERN) as c:
            one = {"manifold/conversation": "one"}
            assert text(await c.call("state__count", meta=one)) == "1"
            busy = await c.call("state__count", meta={"manifold/conversation": "two"})
            assert busy.is_error is True
            assert "server 'state' is busy" in text(busy) and "max_instances" in text(busy)
            await wait_until(lambda: len(fixture_processes(marker)) == 1, 6, "the idle instance to stop")
            assert metric(gw, 'manifold_conversation_instance_stops_total{reason="idle"') == 1
            assert text(await c.call("state__count", meta={"manifold/conversation": "two"})) == "1"


async def test_the_gateway_wide_limit_holds_across_servers(tmp_path: Path) -> None:
    marker = f"iso-{os.getpid()}-e"
    config = isolated(marker)
    config["servers"]["other"] = {**config["servers"]["state"]}
    with run_gateway(tmp_path, config, env={"MANIFOLD_MAX_CONVERSATION_INSTANCES": "1"}) as gw:
        wait_ready(gw)
        async with connect(gw.url, MODERN) as c:
            assert text(await c.call("state__count")) == "1"
            busy = await c.call("other__count")
            assert busy.is_error is True and "limit of 1 conversation connections over all servers" in text(busy)


@pytest.mark.slow  # a soak (`make test-all`); the tests above hold each conversation's process to the same rules
async def test_a_thousand_conversations_leave_no_process_behind(tmp_path: Path) -> None:
    """1,000 2025 sessions, 8 at a time, each starting its own process (a small stdlib-only server, so the
    test measures the gateway, not Python's start-up), using it, and closing."""
    marker = f"iso-{os.getpid()}-d"
    light = {"command": sys.executable, "args": [str(SCRIPTED), marker], "isolation": "conversation"}
    with run_gateway(tmp_path, {"servers": {"state": {**light, "required": True, "max_instances": 16}}}) as gw:
        wait_ready(gw)
        rss_before = _rss(gw)
        started = time.monotonic()
        done = 0

        async def conversation(n: int) -> None:
            nonlocal done
            async with connect(gw.url, LEGACY) as c:
                assert text(await c.call("state__echo", {"text": f"n{n}"})) == f"n{n}"
            done += 1

        async with anyio.create_task_group() as tg:
            limiter = anyio.Semaphore(8)
            for n in range(1000):
                await limiter.acquire()

                async def one(n: int = n) -> None:
                    try:
                        await conversation(n)
                    finally:
                        limiter.release()

                tg.start_soon(one)
        took = time.monotonic() - started
        assert done == 1000
        await wait_until(lambda: len(fixture_processes(marker)) == 1, 10, "every conversation's process to stop")
        rss_after = _rss(gw)
        print(f"1000 conversations in {took:.1f} s; gateway RSS {rss_before:.1f} -> {rss_after:.1f} MiB")
        assert rss_after - rss_before < 40, (rss_before, rss_after)
        assert metric(gw, "manifold_conversation_instance_starts_total{") == 1000


def _rss(gw: Gateway) -> float:
    for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")
