"""Upstream faults with real processes: kills, hangs, garbage, slow starts, tool changes, shutdown."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError

from tests.fixtures.servers import free_port, run_http_fixture, stdio_spec
from tests.integration.conftest import (
    ERAS,
    THIRDPARTY,
    connect,
    group_alive,
    own_pid,
    run_gateway,
    server_process,
    upstream_pids,
    wait_until,
    watch_changes,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("era", ERAS)
async def test_kill_mid_call_fails_that_call_only_and_the_server_comes_back(tmp_path: Path, era: str) -> None:
    config = {"servers": {"fx": stdio_spec(), "other": stdio_spec()}}
    with run_gateway(tmp_path, config) as gw:
        async with watch_changes(gw.url, era) as (client, changes):
            await client.wait_for(lambda n: "fx__slow" in n and "other__slow" in n)
            (pid,) = upstream_pids(gw, "fx")
            results: dict[str, Any] = {}

            async def call(name: str, seconds: float) -> None:
                results[name] = await client.call(name, {"seconds": seconds})

            seen = changes.count
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "fx__slow", 10)
                tg.start_soon(call, "other__slow", 1.5)
                await anyio.sleep(0.5)
                os.kill(pid, signal.SIGKILL)
            dead = results["fx__slow"]
            assert dead.is_error is True
            assert "server 'fx'" in dead.content[0].text
            assert "the connection closed before the answer; the call may have run" in dead.content[0].text
            assert results["other__slow"].is_error is False
            assert results["other__slow"].content[0].text == "slept"

            # Down: fx's tools vanish and the client is told; back up: they return and it is told again.
            # Both notices may already have arrived while `other__slow` finished, so count from before the kill.
            # A second process is started only once fx is down, so a listing with its tools after that is fx back.
            await changes.wait_beyond(seen)
            await wait_until(lambda: len(upstream_pids(gw, "fx")) == 2, timeout=20, what="fx started again")
            await client.wait_for(lambda n: "fx__slow" in n, timeout=20)
            await changes.wait_beyond(seen + 1)
            assert (await client.call("fx__echo", {"text": "back"})).content[0].text == "back"
            assert len(upstream_pids(gw, "fx")) == 2


def _fixture_beside(background: str) -> dict[str, Any]:
    """A server entry: a shell starts `background` in the background, then becomes the stdio fixture."""
    fixture = stdio_spec()
    return {"command": "sh", "args": ["-c", f"{background} & exec {fixture['command']} {' '.join(fixture['args'])}"]}


async def test_a_server_that_dies_leaving_a_child_behind_is_down_at_once(tmp_path: Path) -> None:
    """A stdio server whose process dies while a child it started lives on (ignoring SIGTERM, as a daemon may) is
    down at once: its tools gone and callers told, before its process group has been stopped. The child holds no
    pipe of the gateway's (uvloop's spawn would leave it one, and the server's end would never close)."""
    child = "(trap '' TERM; exec sleep 600) </dev/null >/dev/null 2>&1"
    spawner = {**_fixture_beside(child), "sandbox": False}
    with run_gateway(tmp_path, {"servers": {"fx": spawner}}) as gw:
        async with watch_changes(gw.url, "2026-07-28") as (client, changes):
            await client.wait_for(lambda n: "fx__crash" in n)
            seen = changes.count
            with anyio.fail_after(20):  # it hangs while the child holds the server's output open
                assert (await client.call("fx__crash", {})).is_error
            await changes.wait_beyond(seen)
            await client.wait_for(lambda n: "fx__echo" not in n, timeout=5)
            await wait_until(lambda: gw.logged("upstream process stopped", server="fx"), what="the group stopped")
        events = [(e.get("event"), e.get("state")) for e in gw.log_events() if e.get("server") == "fx"]
        assert events.index(("upstream state", "down")) < events.index(("upstream process stopped", None)), events


async def test_read_only_call_is_retried_after_a_drop_and_others_are_not(tmp_path: Path) -> None:
    # A retry waits for the restarted server up to `max_delay` and `startup_timeout` (5 s and 10 s by default),
    # which a loaded 2-core machine has taken more than twice over to start a Python server.
    config = {"servers": {"fx": {**stdio_spec(), "startup_timeout": 30, "retry": {"max_delay": 30}}}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "fx__slow_read" in n)
            results: dict[str, Any] = {}

            async def call(name: str) -> None:
                results[name] = await client.call(name, {"seconds": 1.0})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "fx__slow_read")
                tg.start_soon(call, "fx__slow")
                await anyio.sleep(0.4)
                os.kill(server_process(upstream_pids(gw, "fx")[0]), signal.SIGKILL)
            retried = results["fx__slow_read"]
            assert retried.is_error is False, retried.content[0].text
            _first, second = upstream_pids(gw, "fx")
            assert retried.content[0].text == f"slept in {own_pid(server_process(second))}"
            assert results["fx__slow"].is_error is True
        retried_tools = [e["tool"] for e in gw.log_events() if e.get("event") == "retrying call"]
        # Once, or twice when a busy machine is slow to notice the process died (the default retry.attempts: 3).
        assert retried_tools in (["fx__slow_read"], ["fx__slow_read", "fx__slow_read"]), retried_tools


async def test_hung_upstream_times_out_is_cancelled_and_does_not_slow_others(tmp_path: Path) -> None:
    cancel_file = tmp_path / "cancelled"
    config = {
        "servers": {
            "hung": {
                **stdio_spec(),
                "timeout": 2,
                "env": {"FIXTURE_CANCEL_FILE": str(cancel_file)},
                "sandbox": {"write": [str(tmp_path)]},
            },
            "fast": stdio_spec(),
        }
    }
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2025-11-25") as client:
            await client.wait_for(lambda n: "hung__hang" in n and "fast__echo" in n)
            latencies: list[float] = []
            outcome: dict[str, Any] = {}

            async def hang() -> None:
                started = time.monotonic()
                outcome["result"] = await client.call("hung__hang")
                outcome["took"] = time.monotonic() - started

            async with anyio.create_task_group() as tg:
                tg.start_soon(hang)
                await anyio.sleep(0.2)
                while "result" not in outcome:
                    started = time.monotonic()
                    assert (await client.call("fast__echo", {"text": "x"})).content[0].text == "x"
                    latencies.append(time.monotonic() - started)
                    await anyio.sleep(0.05)
        result = outcome["result"]
        assert result.is_error is True
        assert "did not answer within the 2 s timeout" in result.content[0].text
        assert 1.8 < outcome["took"] < 5
        assert len(latencies) >= 5
        assert max(latencies) < 0.5, latencies
        await wait_until(lambda: cancel_file.exists() and "cancelled" in cancel_file.read_text(), 5, "upstream cancel")


@pytest.mark.path_independent
async def test_progress_restarts_the_clock(tmp_path: Path) -> None:
    config = {"servers": {"fx": {**stdio_spec(), "timeout": 1.5}}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "fx__progress" in n)
            # 6 steps 0.6 s apart outlast the 1.5 s timeout only because each step resets it.
            seen: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(progress)

            result = await client.call("fx__progress", {"steps": 6, "delay": 0.6}, progress_callback=on_progress)
            assert result.is_error is False, result.content[0].text
            assert result.content[0].text == "done"
            assert seen == [1, 2, 3, 4, 5, 6]
            # Without progress the same silence is a timeout.
            silent = await client.call("fx__slow", {"seconds": 3})
            assert silent.is_error is True
            assert "timeout" in silent.content[0].text


@pytest.mark.path_independent
@pytest.mark.parametrize("era", ERAS)
async def test_progress_reaches_the_caller_before_the_result(tmp_path: Path, era: str) -> None:
    with run_http_fixture(name="web") as web:
        config = {"servers": {"fx": stdio_spec(), "web": {"url": web.url}}}
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, era) as client:
                await client.wait_for(lambda n: "fx__progress" in n and "web__progress" in n)
                for tool in ("fx__progress", "web__progress"):
                    events: list[object] = []

                    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                        events.append((progress, total))  # noqa: B023

                    result = await client.call(tool, {"steps": 5, "delay": 0}, progress_callback=on_progress)
                    events.append("result")
                    assert result.content[0].text == "done"
                    assert events == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5), "result"], tool


@pytest.mark.path_independent
async def test_startup_does_not_wait_for_a_server_that_never_answers(tmp_path: Path) -> None:
    config = {
        "servers": {
            "silent": {**stdio_spec("hang-at-start"), "startup_timeout": 60},
            "fx": stdio_spec(),
        }
    }
    started = time.monotonic()
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            names = await client.wait_for(lambda n: "fx__echo" in n, timeout=10)
            assert time.monotonic() - started < 10
            assert not [n for n in names if n.startswith("silent__")]
            assert (await client.call("fx__echo", {"text": "meanwhile"})).content[0].text == "meanwhile"
        status = {s["name"]: s["state"] for s in httpx2.get(f"{gw.base}/readyz").json()["servers"]}
        assert status == {"fx": "up", "silent": "connecting"}


@pytest.mark.path_independent
async def test_a_server_slower_than_startup_timeout_comes_up_on_a_later_try(tmp_path: Path) -> None:
    # It answers 2.5 s after it starts: the tries get 1 s, then 2 s, then 4 s (at most 4 times startup_timeout).
    config = {"servers": {"slow": {**stdio_spec("slow-start:2.5"), "startup_timeout": 1}}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "slow__echo" in n, timeout=30)
            assert (await client.call("slow__echo", {"text": "late"})).content[0].text == "late"
        cut = "no answer within 1 s (startup_timeout 1 s)"
        assert gw.logged("upstream state", server="slow", state="down", reason=cut)
        assert len(upstream_pids(gw, "slow")) >= 2


@pytest.mark.path_independent
@pytest.mark.parametrize("mode", ["garbage", "exit-at-start"])
async def test_a_broken_stdio_server_is_down_and_backed_off(tmp_path: Path, mode: str) -> None:
    config = {"servers": {"bad": {**stdio_spec(mode), "startup_timeout": 2}, "fx": stdio_spec()}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2025-11-25") as client:
            await client.wait_for(lambda n: "fx__echo" in n)
            await anyio.sleep(4)
            assert (await client.call("fx__echo", {"text": "ok"})).content[0].text == "ok"

        def bad() -> Any:
            return {s["name"]: s for s in httpx2.get(f"{gw.base}/readyz").json()["servers"]}["bad"]

        # Under load the first try (its startup_timeout, then its process's grace to exit) can outlast the sleep.
        await wait_until(lambda: bool(bad()["error"]), 20, "bad's first failure")
        assert bad()["state"] in ("down", "connecting")
        starts = upstream_pids(gw, "bad")
        assert 1 <= len(starts) <= 4, f"respawned {len(starts)} times in 4 s: not backed off"


@pytest.mark.path_independent
async def test_garbage_http_upstream_is_down_others_serve(tmp_path: Path) -> None:
    with run_http_fixture(mode="garbage") as bad:
        config = {"servers": {"bad": {"url": bad.url, "startup_timeout": 3}, "fx": stdio_spec()}}
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, "2026-07-28") as client:
                names = await client.wait_for(lambda n: "fx__echo" in n)
                assert not [n for n in names if n.startswith("bad__")]
            await wait_until(
                lambda: httpx2.get(f"{gw.base}/readyz").json()["servers"][0]["error"] is not None, 10, "bad error"
            )


@pytest.mark.parametrize("era", ERAS)
async def test_tool_list_changes_reach_clients_with_filters_reapplied(tmp_path: Path, era: str) -> None:
    config = {"servers": {"fx": {**stdio_spec(), "deny": ["secret_*"], "pin": "off"}}}  # new tools served at once
    with run_gateway(tmp_path, config) as gw:
        async with watch_changes(gw.url, era) as (client, changes):
            await client.wait_for(lambda n: "fx__set_tools" in n)
            seen = changes.count
            await client.call("fx__set_tools", {"names": ["extra_one", "secret_two"]})
            seen = await changes.wait_beyond(seen)
            # A notice of the start may still arrive after `seen` was read: wait for this change's listing.
            await client.wait_for(lambda n: "fx__extra_one" in n)
            await anyio.sleep(1.0)  # and for its own notice, if the one counted was the start's
            seen = changes.count
            names = await client.tool_names()
            assert "fx__secret_two" not in names
            assert (await client.call("fx__extra_one")).content[0].text == "extra_one"

            # The upstream announces a change, but the merged view is the same: nothing is sent.
            await client.call("fx__set_tools", {"names": ["extra_one", "secret_three"]})
            await anyio.sleep(1.5)
            assert changes.count == seen
            assert "fx__secret_three" not in await client.tool_names()


@pytest.mark.path_independent
async def test_http_upstream_restart_is_reconnected(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web:
        config = {"servers": {"web": {"url": web.url}}}
        port = web.port
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, "2026-07-28") as client:
                await client.wait_for(lambda n: "web__echo" in n)
                os.killpg(web.proc.pid, signal.SIGKILL)
                web.proc.wait()
                # The first call after the kill either finds it down or loses the connection: both are errors
                # naming the server. If the gateway saw it go first, its tools are gone and the name is unknown.
                try:
                    down = await client.call("web__echo", {"text": "x"})
                except MCPError as gone:
                    assert "Unknown tool: web__echo" in str(gone)
                    assert "web__echo" not in await client.tool_names()
                else:
                    assert down.is_error is True
                    assert "server 'web'" in down.content[0].text
                with run_http_fixture(name="web", port=port) as again:
                    assert again.port == port
                    # Backoff may have grown while it was down: the next attempt can be ~30 s away.
                    await client.wait_for(lambda n: "web__echo" in n, timeout=60)
                    await _wait_call_ok(client)


async def _wait_call_ok(client) -> None:
    with anyio.fail_after(20):
        while True:
            result = await client.call("web__echo", {"text": "again"})
            if not result.is_error:
                assert result.content[0].text == "again"
                return
            await anyio.sleep(0.3)


def test_shutdown_drains_calls_and_leaves_no_process_behind(tmp_path: Path) -> None:
    marker = f"{4000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**6:06d}5"  # unique to this run, for `sleep`
    spawner = _fixture_beside(f"sleep {marker}")
    config = {"servers": {"fx": stdio_spec(), "spawner": spawner}}
    with run_gateway(tmp_path, config) as gw:

        async def scenario() -> Any:
            async with connect(gw.url, "2025-11-25") as client:
                await client.wait_for(lambda n: "fx__slow" in n and "spawner__echo" in n)
                async with anyio.create_task_group() as tg:
                    result: dict[str, Any] = {}

                    async def slow() -> None:
                        result["slow"] = await client.call("fx__slow", {"seconds": 1.5})

                    tg.start_soon(slow)
                    await anyio.sleep(0.4)
                    gw.proc.send_signal(signal.SIGTERM)
                return result["slow"]

        slow = anyio.run(scenario)
        assert slow.is_error is False and slow.content[0].text == "slept"
        assert gw.proc.wait(20) == 0
        pids = upstream_pids(gw, "fx") + upstream_pids(gw, "spawner")
        assert len(pids) == 2
        deadline = time.monotonic() + 5
        while any(group_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if group_alive(p)], "an upstream process group outlived the gateway"
        leftovers = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                        leftovers.append(proc.name)
                except OSError:
                    continue
        assert not leftovers, f"grandchild 'sleep {marker}' left behind: {leftovers}"


async def test_busy_server_refuses_beyond_its_queue_and_others_serve(tmp_path: Path) -> None:
    config = {"servers": {"small": {**stdio_spec(), "max_concurrent": 1, "max_queued": 1}, "fx": stdio_spec()}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "small__slow" in n and "fx__echo" in n)
            results: list[Any] = []

            async def slow() -> None:
                results.append(await client.call("small__slow", {"seconds": 1.0}))

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(slow)
                    await anyio.sleep(0.1)
                assert (await client.call("fx__echo", {"text": "free"})).content[0].text == "free"
            texts = sorted(r.content[0].text for r in results)
            busy = [t for t in texts if "is busy" in t]
            assert len(busy) == 1, texts
            assert "server 'small' is busy" in busy[0]
            assert texts.count("slept") == 2, "one call runs, one waits in the queue and then runs"


def _everything_http(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["node", str(THIRDPARTY / "server-everything/dist/index.js"), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.path_independent
@pytest.mark.skipif(not THIRDPARTY.exists(), reason="npm test upstreams not installed")
async def test_expired_http_session_is_reinitialised_transparently(tmp_path: Path) -> None:
    port = free_port()
    upstream = _everything_http(port)
    try:
        await wait_until(lambda: _port_open(port), 15, "server-everything to listen")
        config = {"servers": {"ev": {"url": f"http://127.0.0.1:{port}/mcp"}}}
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, "2026-07-28") as client:
                await client.wait_for(lambda n: "ev__get-sum" in n)
                assert "42" in (await client.call("ev__get-sum", {"a": 40, "b": 2})).content[0].text
                # A restart forgets every session: the gateway's next request meets 404 for its session id.
                os.killpg(upstream.pid, signal.SIGKILL)
                upstream.wait()
                upstream = _everything_http(port)
                await wait_until(lambda: _port_open(port), 15, "server-everything to listen again")
                with anyio.fail_after(30):
                    while True:
                        result = await client.call("ev__get-sum", {"a": 1, "b": 2})
                        if not result.is_error:
                            break
                        await anyio.sleep(0.3)
                assert "3" in result.content[0].text
    finally:
        os.killpg(upstream.pid, signal.SIGKILL)
        upstream.wait()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _says_cancelled(path: Path) -> bool:
    return path.exists() and "cancelled" in path.read_text()


@pytest.mark.parametrize("era", ERAS)
async def test_a_downstream_cancel_cancels_the_upstream_call(tmp_path: Path, era: str) -> None:
    cancel_file = tmp_path / f"cancelled-{era}"
    with run_http_fixture(name="web", env={"FIXTURE_CANCEL_FILE": str(cancel_file)}) as web:
        config = {
            "servers": {
                "fx": {
                    **stdio_spec(),
                    "env": {"FIXTURE_CANCEL_FILE": str(cancel_file) + ".stdio"},
                    "sandbox": {"write": [str(tmp_path)]},
                },
                "web": {"url": web.url},
            }
        }
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, era) as client:
                await client.wait_for(lambda n: "fx__hang" in n and "web__hang" in n)
                for tool, path in (("fx__hang", Path(str(cancel_file) + ".stdio")), ("web__hang", cancel_file)):
                    with anyio.move_on_after(1.0):
                        await client.call(tool)
                    await wait_until(functools.partial(_says_cancelled, path), 10, f"{tool} cancel")
                assert (await client.call("fx__echo", {"text": "after"})).content[0].text == "after"
