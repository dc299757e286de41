"""Deferred exposure with real clients of both eras: only the search and call tools (and `always` tools) are
listed; the search finds tools of the caller's view only; a 2025 session then lists what it found; the call
tool goes through the same policy as a direct call (gating and confirmation included); bad input gets a
clean tool error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import ERAS, connect, run_gateway, watch_changes

pytestmark = pytest.mark.anyio
SEARCH, CALL = "manifold__search_tools", "manifold__call_tool"
NARROW = "narrow-token-0123456789abcdef"
WIDE = "wide-token-0123456789abcdef01"
ENV = {"T_NARROW": NARROW, "T_WIDE": WIDE}


def config(**extra: Any) -> dict[str, Any]:
    return {
        "exposure": "deferred",
        "servers": {
            "fx": {**stdio_spec(), "required": True, "tools": {"whoami": {"always": True}}},
            "other": {**stdio_spec(), "required": True, "only": ["echo", "add", "write_note"]},
        },
        **extra,
    }


def ready(base: str) -> None:
    deadline = time.monotonic() + 20
    while httpx2.get(f"{base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, "the servers did not come up"
        time.sleep(0.1)


def text_of(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.parametrize("era", ERAS)
async def test_deferred_lists_the_small_set_and_search_and_call_work(tmp_path: Path, era: str) -> None:
    with run_gateway(tmp_path, config()) as gw:
        ready(gw.base)
        async with watch_changes(gw.url, era) as (client, changes):
            await client.wait_for(lambda n: "fx__whoami" in n)
            assert sorted(await client.tool_names()) == sorted([CALL, SEARCH, "fx__whoami"]), "only the small set"
            tools = {t["name"]: t for t in await client.raw_tools()}
            assert "search first" in tools[SEARCH]["description"]

            seen = changes.count
            found = await client.call(SEARCH, {"query": "add two numbers together", "limit": 3})
            assert not found.is_error
            names = [t["name"] for t in found.structured_content["tools"]]
            assert names[0] in ("fx__add", "other__add") and len(names) <= 3
            assert all(set(t) == {"name", "description", "inputSchema"} for t in found.structured_content["tools"])
            assert names[0] in text_of(found)

            only_other = await client.call(SEARCH, {"query": "add numbers", "server": "other"})
            assert {t["name"].split("__")[0] for t in only_other.structured_content["tools"]} == {"other"}

            if era == "2025-11-25":
                await changes.wait_beyond(seen)
                listed = await client.tool_names()
                assert set(names) <= set(listed), "a 2025 session lists what its search found"
            else:
                assert changes.count == seen and sorted(await client.tool_names()) == sorted(
                    [CALL, SEARCH, "fx__whoami"]
                )

            result = await client.call(CALL, {"name": "fx__add", "arguments": {"a": 2, "b": 40}})
            assert not result.is_error and result.structured_content == {"sum": 42}
            assert text_of(await client.call("fx__echo", {"text": "direct"})) == "direct", "direct calls still work"

            metrics = httpx2.get(f"{gw.base}/metrics", timeout=5).text
            assert 'tool="fx__add"' in metrics and "manifold__call_tool" not in metrics


@pytest.mark.parametrize("era", ERAS)
async def test_bad_input_to_both_tools_is_a_clean_tool_error(tmp_path: Path, era: str) -> None:
    with run_gateway(tmp_path, config()) as gw:
        ready(gw.base)
        async with connect(gw.url, era) as client:
            await client.wait_for(lambda n: SEARCH in n)
            cases: list[tuple[str, dict[str, Any], str]] = [
                (SEARCH, {}, "`query` must be a non-empty string"),
                (SEARCH, {"query": "   "}, "`query` must be a non-empty string"),
                (SEARCH, {"query": "x", "limit": 0}, "`limit` must be an integer from 1 to 50"),
                (SEARCH, {"query": "x", "limit": "five"}, "`limit` must be an integer"),
                (SEARCH, {"query": "x" * 1001}, "over 1000 characters"),
                (SEARCH, {"query": "x", "colour": "red"}, "unknown argument(s) ['colour']"),
                (CALL, {}, "`name` must be the name of a tool"),
                (CALL, {"name": "fx__echo", "arguments": [1]}, "`arguments` must be an object"),
                (CALL, {"name": CALL}, "is called directly"),
                (CALL, {"name": "no__such_tool"}, "Unknown tool: no__such_tool"),
            ]
            for tool, arguments, expected in cases:
                result = await client.call(tool, arguments)
                assert result.is_error, (tool, arguments)
                assert expected in text_of(result), (tool, arguments, text_of(result))
                assert text_of(result).startswith(f"{tool}: ")


async def test_search_never_reveals_tools_outside_the_view(tmp_path: Path) -> None:
    tokens = [
        {"name": "narrow", "token": "${T_NARROW}", "servers": ["other"], "tools": ["other__echo", "other__add"]},
        {"name": "wide", "token": "${T_WIDE}", "exposure": "direct"},
    ]
    with run_gateway(tmp_path, config(auth={"tokens": tokens}), env=ENV) as gw:
        ready(gw.base)
        narrow = {"Authorization": f"Bearer {NARROW}"}
        async with connect(gw.url, "2025-11-25", headers=narrow) as client:
            await client.wait_for(lambda n: SEARCH in n)
            for query in ("write a note", "add numbers", "echo text back", "who am i", "slow read"):
                found = await client.call(SEARCH, {"query": query, "limit": 50})
                assert {t["name"] for t in found.structured_content["tools"]} <= {"other__echo", "other__add"}
            refused = await client.call(CALL, {"name": "fx__echo", "arguments": {"text": "x"}})
            assert refused.is_error and "Unknown tool" in text_of(refused)
            assert SEARCH in await client.tool_names() and "fx__whoami" not in await client.tool_names()
        async with connect(gw.url, "2026-07-28", headers={"Authorization": f"Bearer {WIDE}"}) as client:
            names = await client.wait_for(lambda n: "fx__echo" in n)
            assert SEARCH not in names, "a token's own exposure wins over the gateway's"


async def test_a_gated_tool_still_needs_confirmation_through_the_call_tool(tmp_path: Path) -> None:
    tokens = [{"name": "careful", "token": "${T_NARROW}", "gated": "confirm"}]
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> Any:
        from mcp.types import ElicitResult

        asked.append(params.message)
        return ElicitResult(action="decline")

    with run_gateway(tmp_path, config(auth={"tokens": tokens}), env=ENV) as gw:
        ready(gw.base)
        headers = {"Authorization": f"Bearer {NARROW}"}
        async with connect(gw.url, "2025-11-25", headers=headers, elicitation_callback=elicit) as client:
            await client.wait_for(lambda n: SEARCH in n)
            result = await client.call(CALL, {"name": "fx__write_note", "arguments": {"note": "n"}})
            assert asked and "fx__write_note" in asked[0], text_of(result)
            assert result.is_error and "did not allow" in text_of(result)
