"""Bounded resources: no file descriptors left behind by upstream reconnects, even with calls in flight when a
connection pool closes; and a server's stderr flood without a newline does not grow the gateway's memory."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from tests.fixtures.servers import FIXTURE, run_http_fixture, stdio_spec
from tests.integration.conftest import Gateway, connect, run_gateway, wait_until

pytestmark = pytest.mark.anyio

TOKEN = "leak-test-admin-token-7c1d"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ACCEPT = "application/json, text/event-stream"
MODERN = "2026-07-28"
IN_FLIGHT_EVERY = 10  # every tenth connection is closed with calls in flight on its pooled sockets
IN_FLIGHT_CALLS = 3
FD_SLACK = 12
MAY_HAVE_RUN = "the connection closed before the answer; the call may have run"
# The upstream keeps idle connections open for minutes (nginx's default is 75 s), so a socket the gateway
# forgets stays open until the test looks, instead of being closed by the server after uvicorn's 5 s.
KEEP_ALIVE = "300"


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int) -> dict[str, int]:
    """Open descriptors by kind (socket, pipe, anon_inode, or the file's path)."""
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    return dict(Counter(link.split(":[")[0] for link in links))


def proc_status(pid: int, key: str) -> int:
    """A numeric field of /proc/PID/status (kB for the Vm* fields)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak_rss(pid: int) -> bool:
    """Set the process's peak RSS (VmHWM) to its RSS now; False where the kernel does not allow it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _call_body(name: str, arguments: dict[str, Any], request_id: int) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    params = {"name": name, "arguments": arguments, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def call_tool(http: httpx2.AsyncClient, gw: Gateway, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A raw 2026-07-28 `tools/call`; the JSON-RPC answer (JSON or SSE body)."""
    headers = {
        "Accept": ACCEPT,
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    response = await http.post(gw.url, content=json.dumps(_call_body(name, arguments, 1)), headers=headers)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        datas = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        answers = [json.loads(d) for d in datas if d]
        return next(a for a in answers if a.get("id") == 1)
    answer: dict[str, Any] = response.json()
    return answer


async def _state(http: httpx2.AsyncClient, gw: Gateway, name: str) -> str | None:
    response = await http.get(f"{gw.base}/admin/servers/{name}", headers=AUTH)
    return response.json()["state"] if response.status_code == 200 else None


async def _add_and_wait_up(http: httpx2.AsyncClient, gw: Gateway, name: str, url: str) -> None:
    added = await http.post(f"{gw.base}/admin/servers", headers=AUTH, json={"name": name, "url": url})
    assert added.status_code == 201, added.text
    with anyio.fail_after(20):
        while await _state(http, gw, name) != "up":
            await anyio.sleep(0.005)


async def _remove(http: httpx2.AsyncClient, gw: Gateway, name: str) -> None:
    removed = await http.delete(f"{gw.base}/admin/servers/{name}", headers=AUTH)
    assert removed.status_code == 200, removed.text


# 150 reconnects catch a leak of one descriptor in ten; the 500-reconnect soak (`make test-all`) one in forty.
@pytest.mark.parametrize("reconnects", [150, pytest.param(500, marks=pytest.mark.slow)])
async def test_no_descriptors_leak_over_many_reconnects_with_calls_in_flight(tmp_path: Path, reconnects: int) -> None:
    config = {
        "admin_token": "${MANIFOLD_LEAK_ADMIN}",
        "runtime": {"egress": {"allow": ["127.0.0.0/8"]}},
        "servers": {"fx": stdio_spec()},
    }
    with (
        run_http_fixture(name="web", extra_args=("--keep-alive", KEEP_ALIVE)) as web,
        run_gateway(tmp_path, config, env={"MANIFOLD_LEAK_ADMIN": TOKEN}) as gw,
    ):
        pid = gw.proc.pid
        outcomes: list[dict[str, Any]] = []
        timeout = httpx2.Timeout(30)
        async with httpx2.AsyncClient(timeout=timeout) as admin, httpx2.AsyncClient(timeout=timeout) as callers:

            async def in_flight(arguments: dict[str, Any]) -> None:
                outcomes.append(await call_tool(callers, gw, "r__slow", arguments))

            async def cycle(i: int, tg: anyio.abc.TaskGroup) -> None:
                await _add_and_wait_up(admin, gw, "r", web.url)
                if i % IN_FLIGHT_EVERY == 0:
                    # Calls on the pooled keep-alive sockets of this connection, still running when it closes.
                    warm = await call_tool(callers, gw, "r__echo", {"text": "warm"})
                    assert warm["result"]["isError"] is False, warm
                    for _ in range(IN_FLIGHT_CALLS):
                        tg.start_soon(in_flight, {"seconds": 0.5})
                    await anyio.sleep(0.1)
                await _remove(admin, gw, "r")

            async with anyio.create_task_group() as tg:
                for i in range(20):  # warm up: first-use allocations (pools, caches, log handlers) settle
                    await cycle(i, tg)
            before = open_fds(pid)
            threads_before = proc_status(pid, "Threads")
            async with anyio.create_task_group() as tg:  # about 25 s on 2 cores for 500
                for i in range(reconnects):
                    await cycle(i, tg)
            await anyio.sleep(0.5)  # let closed sockets and exited tasks be reaped
            after = open_fds(pid)

            assert len(outcomes) == (20 + reconnects) // IN_FLIGHT_EVERY * IN_FLIGHT_CALLS
            assert after <= before + FD_SLACK, (
                f"{after - before} more open descriptors after {reconnects} reconnects ({before} -> {after}): "
                f"{fd_kinds(pid)}"
            )
            assert proc_status(pid, "Threads") <= threads_before + 4
            # The calls were in flight when their pool closed: each ended, as a result saying it may have run.
            assert all("result" in o for o in outcomes), [o for o in outcomes if "result" not in o][:3]
            lost = [o for o in outcomes if MAY_HAVE_RUN in o["result"]["content"][0]["text"]]
            assert len(lost) >= len(outcomes) // 2, f"only {len(lost)} of {len(outcomes)} calls were cut off"
            # Still serving: the config server, and a runtime server added once more.
            async with connect(gw.url, MODERN) as client:
                assert (await client.call("fx__echo", {"text": "still here"})).content[0].text == "still here"
            await _add_and_wait_up(admin, gw, "r", web.url)
            answer = await call_tool(callers, gw, "r__echo", {"text": "again"})
            assert answer["result"]["content"][0]["text"] == "again"


FLOOD_BYTES = 50 * 1024 * 1024
FLOOD_SCRIPT = """
import os, sys, time
go = sys.argv[1]
while not os.path.exists(go):  # the test measures the gateway first, then lets the flood go
    time.sleep(0.02)
chunk = b"x" * (1024 * 1024)
for _ in range({megabytes}):
    sys.stderr.buffer.write(chunk)  # one 50 MB line: no newline anywhere
sys.stderr.buffer.write(b"\\nafter the flood\\n")
sys.stderr.buffer.flush()
os.execv(sys.executable, [sys.executable, {fixture!r}, "--transport", "stdio"])
"""


async def test_a_stderr_flood_without_a_newline_does_not_grow_the_gateway(tmp_path: Path) -> None:
    script = tmp_path / "flood.py"
    script.write_text(FLOOD_SCRIPT.format(megabytes=FLOOD_BYTES // (1024 * 1024), fixture=str(FIXTURE)))
    go = tmp_path / "go"
    config = {
        "servers": {
            "flood": {
                "command": sys.executable,
                "args": [str(script), str(go)],
                "startup_timeout": 60,
                "sandbox": {"read": [str(FIXTURE.parent)]},  # the script execs the fixture
            },
            "fx": stdio_spec(),
        }
    }
    with run_gateway(tmp_path, config) as gw:
        pid = gw.proc.pid
        async with connect(gw.url, MODERN) as client:
            await client.wait_for(lambda n: "fx__echo" in n)
            peak_reset = reset_peak_rss(pid)
            before = proc_status(pid, "VmRSS")
            go.touch()
            await client.wait_for(lambda n: "flood__echo" in n, timeout=60)
            assert (await client.call("flood__echo", {"text": "served"})).content[0].text == "served"
            assert (await client.call("fx__echo", {"text": "meanwhile"})).content[0].text == "meanwhile"
            await wait_until(
                lambda: any(e.get("line") == "after the flood" for e in gw.log_events()), 10, "the next stderr line"
            )
        grown_mb = (proc_status(pid, "VmRSS") - before) / 1024
        peak_grown_mb = (proc_status(pid, "VmHWM") - before) / 1024
        assert grown_mb < 40, f"the gateway's RSS grew by {grown_mb:.0f} MB"
        if peak_reset:
            assert peak_grown_mb < 40, f"the gateway's peak RSS grew by {peak_grown_mb:.0f} MB during the flood"
