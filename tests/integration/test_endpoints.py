"""Curated endpoints: `/mcp/NAME` serves a chosen set of servers and tools; tokens narrow it further."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError

from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import ERAS, connect, run_gateway, watch_changes

pytestmark = pytest.mark.anyio
TRIAGE = "triage-token-0123456789abcdef"
ENV = {"T_TRIAGE": TRIAGE}


def config(**extra: Any) -> dict[str, Any]:
    return {
        # `pin: off`: tools that appear at run time are served at once (pinning is tested on its own).
        "servers": {
            "fx": {**stdio_spec(), "required": True, "pin": "off"},
            "other": {**stdio_spec(), "required": True, "pin": "off"},
        },
        "endpoints": {"reader": {"servers": ["fx"], "tools": ["fx__echo", "fx__add", "fx__whoami"]}},
        **extra,
    }


def ready(base: str) -> None:
    deadline = time.monotonic() + 20
    while httpx2.get(f"{base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize("era", ERAS)
async def test_an_endpoint_serves_its_curated_set_and_mcp_serves_all(tmp_path: Path, era: str) -> None:
    with run_gateway(tmp_path, config()) as gw:
        ready(gw.base)
        async with connect(f"{gw.url}/reader", era) as reader, connect(gw.url, era) as everything:
            assert sorted(await reader.tool_names()) == ["fx__add", "fx__echo", "fx__whoami"]
            assert "other__echo" in await everything.tool_names()
            assert (await reader.call("fx__echo", {"text": "hi"})).content[0].text == "hi"
            with pytest.raises(MCPError, match="Unknown tool"):
                await reader.session.call_tool("other__echo", {"text": "no"})
        assert httpx2.post(f"{gw.url}/nowhere", json={}, timeout=5).status_code == 404


async def test_a_token_and_an_endpoint_combine_to_their_intersection(tmp_path: Path) -> None:
    tokens = {"tokens": [{"name": "triage", "token": "${T_TRIAGE}", "tools": ["fx__echo", "other__*"]}]}
    with run_gateway(tmp_path, config(auth=tokens), env=ENV) as gw:
        ready(gw.base)
        headers = {"Authorization": f"Bearer {TRIAGE}"}
        async with connect(f"{gw.url}/reader", "2025-11-25", headers=headers) as c:
            assert await c.tool_names() == ["fx__echo"]
        async with connect(gw.url, "2025-11-25", headers=headers) as c:
            assert sorted(await c.tool_names()) == [
                "fx__echo",
                *sorted(n for n in await c.tool_names() if n != "fx__echo"),
            ]
            assert any(n.startswith("other__") for n in await c.tool_names())


@pytest.mark.parametrize("era", ERAS)
async def test_list_changed_reaches_only_the_endpoints_whose_view_changed(tmp_path: Path, era: str) -> None:
    curated = {"reader": {"servers": ["fx"]}}
    with run_gateway(tmp_path, config(endpoints=curated)) as gw:
        ready(gw.base)
        async with (
            watch_changes(f"{gw.url}/reader", era) as (reader, reader_changes),
            watch_changes(gw.url, era) as (everything, all_changes),
        ):
            seen_reader, seen_all = reader_changes.count, all_changes.count
            await everything.call("other__set_tools", {"names": ["fresh"]})
            await all_changes.wait_beyond(seen_all)
            await anyio.sleep(1.0)
            assert reader_changes.count == seen_reader, "other's change is outside the reader endpoint"
            await everything.call("fx__set_tools", {"names": ["new_one"]})
            await reader_changes.wait_beyond(seen_reader)
            assert "fx__new_one" in await reader.tool_names()


async def test_tool_call_metrics_carry_the_endpoint(tmp_path: Path) -> None:
    with run_gateway(tmp_path, config()) as gw:
        ready(gw.base)
        async with connect(f"{gw.url}/reader", "2026-07-28") as reader, connect(gw.url, "2025-11-25") as everything:
            await reader.call("fx__echo", {"text": "via reader"})
            await everything.call("fx__echo", {"text": "via mcp"})
        text = httpx2.get(f"{gw.base}/metrics", timeout=5).text
        series = [line for line in text.splitlines() if line.startswith("manifold_tool_calls_total{")]
        assert any('endpoint="reader"' in s and 'tool="fx__echo"' in s and s.endswith(" 1.0") for s in series)
        assert any('endpoint=""' in s and 'tool="fx__echo"' in s and s.endswith(" 1.0") for s in series)
