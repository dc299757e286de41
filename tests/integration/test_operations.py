"""Operations: Prometheus metrics, structured logs, health and readiness, and secrets kept out of all three."""

from __future__ import annotations

import functools
import json
import os
import signal
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import MCPError
from prometheus_client.parser import text_string_to_metric_families

from bench.mcphttp import LEGACY, Connection, Endpoint, close_session, open_session
from tests.fixtures.servers import free_port, run_http_fixture, stdio_spec
from tests.integration.conftest import Gateway, connect, run_gateway, server_process, upstream_pids, wait_until

pytestmark = pytest.mark.anyio

SECRET = "sk-live-5ecret-Value-0123456789"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a metrics page, parsed with prometheus-client's own parser."""
    response = httpx2.get(url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return float(samples[(name, tuple(sorted(labels.items())))])


async def test_metrics_follow_a_server_down_and_up(tmp_path: Path) -> None:
    config = {
        "servers": {
            "fx": {**stdio_spec(), "only": ["echo", "fail", "slow_read"]},
            "off": {**stdio_spec(), "disabled": True},
        }
    }
    with run_gateway(tmp_path, config) as gw:
        metrics = f"{gw.base}/metrics"
        async with connect(gw.url, "2025-11-25") as legacy, connect(gw.url, "2026-07-28") as modern:
            await modern.wait_for(lambda n: "fx__echo" in n)
            m = scrape(metrics)
            assert value(m, "manifold_upstream_up", server="fx") == 1
            assert value(m, "manifold_upstream_up", server="off") == 0
            assert value(m, "manifold_upstream_tools", server="fx") == 3
            assert value(m, "manifold_catalog_tools") == 3
            assert value(m, "manifold_upstream_connects_total", server="fx", outcome="ok") == 1
            assert value(m, "manifold_tools_changes_total", server="fx") == 1
            assert value(m, "manifold_downstream_sessions") == 1
            assert value(m, "manifold_build_info", version="0.1.0") == 1

            await modern.call("fx__echo", {"text": "a"})
            await legacy.call("fx__echo", {"text": "b"})
            await modern.call("fx__fail", {"reason": "r"})
            with pytest.raises(MCPError):
                await modern.call("not__a_tool", {})
            m = scrape(metrics)
            assert value(m, "manifold_tool_calls_total", server="fx", tool="fx__echo", outcome="ok", endpoint="") == 2
            assert (
                value(m, "manifold_tool_calls_total", server="fx", tool="fx__fail", outcome="tool_error", endpoint="")
                == 1
            )
            assert not [k for k in m if k[0] == "manifold_tool_calls_total" and ("tool", "not__a_tool") in k[1]]
            assert value(m, "manifold_tool_call_duration_seconds_count", server="fx") == 3
            assert value(m, "manifold_downstream_requests_total", method="tools/call") == 4

            os.kill(server_process(upstream_pids(gw, "fx")[0]), signal.SIGKILL)
            await wait_until(lambda: value(scrape(metrics), "manifold_upstream_up", server="fx") == 0)
            m = scrape(metrics)
            assert value(m, "manifold_upstream_tools", server="fx") == 0
            assert value(m, "manifold_catalog_tools") == 0
            assert value(m, "manifold_tools_changes_total", server="fx") == 2

            await wait_until(lambda: value(scrape(metrics), "manifold_upstream_up", server="fx") == 1)
            m = scrape(metrics)
            assert value(m, "manifold_upstream_tools", server="fx") == 3
            assert value(m, "manifold_upstream_connects_total", server="fx", outcome="ok") == 2
            assert value(m, "manifold_tools_changes_total", server="fx") == 3


async def test_retries_and_unavailable_are_counted(tmp_path: Path) -> None:
    config = {"servers": {"fx": stdio_spec()}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "fx__slow_read" in n)
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call, "fx__slow_read", {"seconds": 1.0})
                tg.start_soon(client.call, "fx__slow", {"seconds": 1.0})
                await anyio.sleep(0.4)
                os.kill(server_process(upstream_pids(gw, "fx")[0]), signal.SIGKILL)
        m = scrape(f"{gw.base}/metrics")
        assert value(m, "manifold_tool_call_retries_total", server="fx") >= 1
        assert (
            value(m, "manifold_tool_calls_total", server="fx", tool="fx__slow", outcome="unavailable", endpoint="") == 1
        )
        assert value(m, "manifold_tool_calls_total", server="fx", tool="fx__slow_read", outcome="ok", endpoint="") == 1


def test_readyz_waits_for_required_servers(tmp_path: Path) -> None:
    config = {"servers": {"fx": {**stdio_spec(), "required": True}, "bad": stdio_spec("exit-at-start")}}
    with run_gateway(tmp_path, config) as gw:
        response = httpx2.get(f"{gw.base}/readyz")
        while response.status_code == 503 and response.json()["waiting_for"] == ["fx"]:
            response = httpx2.get(f"{gw.base}/readyz")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "ready"
        servers = {s["name"]: s for s in body["servers"]}
        assert servers["fx"]["state"] == "up" and servers["fx"]["tools"] > 0
        assert servers["bad"]["required"] is False
        assert "T" in servers["fx"]["since"]
        assert httpx2.get(f"{gw.base}/healthz").json() == {"status": "ok"}

    config = {"servers": {"bad": {**stdio_spec("exit-at-start"), "required": True}}}
    with run_gateway(tmp_path, config) as gw:
        response = httpx2.get(f"{gw.base}/readyz")
        assert response.status_code == 503
        assert response.json()["waiting_for"] == ["bad"]
        assert httpx2.get(f"{gw.base}/healthz").status_code == 200


def _everything_text(gw: Gateway) -> str:
    return "\n".join([gw.log(), httpx2.get(f"{gw.base}/metrics").text, httpx2.get(f"{gw.base}/readyz").text])


async def test_secrets_never_reach_logs_metrics_or_readyz(tmp_path: Path) -> None:
    dead_port = free_port()
    with run_http_fixture(name="web") as web:
        config = {
            "servers": {
                "web": {"url": web.url, "headers": {"Authorization": "Bearer ${MANIFOLD_TEST_SECRET}"}},
                "gone": {
                    "url": f"http://127.0.0.1:{dead_port}/mcp?key=${{MANIFOLD_TEST_SECRET}}",
                    "headers": {"X-Api-Key": "${MANIFOLD_TEST_SECRET}"},
                    "startup_timeout": 2,
                },
                "fx": {**stdio_spec(), "env": {"FIXTURE_SECRET": "${MANIFOLD_TEST_SECRET}"}},
            }
        }
        env = {"MANIFOLD_TEST_SECRET": SECRET}
        with run_gateway(tmp_path, config, env=env, args=("--log-level", "debug")) as gw:
            async with connect(gw.url, "2026-07-28") as client:
                await client.wait_for(lambda n: "web__whoami" in n and "fx__whoami" in n)
                seen_by_upstream = json.loads((await client.call("web__whoami")).content[0].text)
                assert seen_by_upstream["headers"]["authorization"] == f"Bearer {SECRET}", "the header is sent"
                env_seen = json.loads((await client.call("fx__whoami")).content[0].text)["env"]
                assert env_seen["FIXTURE_SECRET"] == SECRET, "the env value is passed"
                with pytest.raises(MCPError):
                    await client.call("gone__anything", {})
            await wait_until(lambda: "gone" in gw.log())
            text = _everything_text(gw)
            assert SECRET not in text
            assert "5ecret" not in text


async def test_each_call_logs_one_structured_line(tmp_path: Path) -> None:
    """At debug, every call logs one line; at the default level (info), only the calls that did not go as asked:
    a gateway under load would otherwise write a line per call."""
    for level in ("debug", "info"):
        with run_gateway(tmp_path, {"servers": {"fx": stdio_spec()}}, args=("--log-level", level)) as gw:
            async with connect(gw.url, "2026-07-28") as client:
                await client.wait_for(lambda n: "fx__echo" in n)
                await client.call("fx__echo", {"text": "logged"})
                await client.call("fx__fail", {"reason": "r"})
            # A call's line may be written just after its answer went out.
            failed_logged = functools.partial(gw.logged, "tool call", tool="fx__fail")
            await wait_until(failed_logged, 10, "the failed call's line")
            events = gw.log_events()
        calls = [e for e in events if e.get("event") == "tool call"]
        expected = [("fx__echo", "ok", "debug"), ("fx__fail", "tool_error", "info")]
        assert [(e["tool"], e["outcome"], e["level"]) for e in calls] == expected[0 if level == "debug" else 1 :]
        for e in calls:
            assert e["server"] == "fx"
            assert isinstance(e["duration_ms"], float)
            assert e["request_id"] is not None
            assert "timestamp" in e
    states = [(e["server"], e["state"]) for e in events if e.get("event") == "upstream state"]
    assert ("fx", "up") in states
    stderr = [e for e in events if e.get("event") == "upstream stderr"]
    assert all(e["server"] == "fx" for e in stderr)


def test_metrics_on_a_separate_port(tmp_path: Path) -> None:
    port = free_port()
    with run_gateway(tmp_path, {"servers": {"fx": stdio_spec()}, "metrics_port": port}) as gw:
        m = scrape(f"http://127.0.0.1:{port}/metrics")
        assert ("manifold_upstream_up", (("server", "fx"),)) in m
        assert httpx2.get(f"{gw.base}/metrics").status_code == 200
        # The sessions gauge is read at scrape time on this port too, not only when /mcp's /metrics is scraped.
        conns = [Connection(Endpoint.parse(gw.url)) for _ in range(2)]
        sessions = [open_session(conn, LEGACY) for conn in conns]
        assert value(scrape(f"http://127.0.0.1:{port}/metrics"), "manifold_downstream_sessions") == 2
        for conn, session in zip(conns, sessions, strict=True):
            close_session(conn, session)
            conn.close()
        assert value(scrape(f"http://127.0.0.1:{port}/metrics"), "manifold_downstream_sessions") == 0
