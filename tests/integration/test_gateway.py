"""The core gateway end to end: real upstream processes, the gateway process, SDK clients of both eras."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import MCPError

from tests.fixtures.servers import run_http_fixture, stdio_spec
from tests.integration.conftest import ERAS, THIRDPARTY, Gateway, connect, initialize_body, run_gateway

pytestmark = pytest.mark.anyio

LONG = "this_is_a_deliberately_very_long_tool_name_that_goes_past_the_sixty_four_character_limit"
NODE = shutil.which("node")


def long_public_name(prefix: str) -> str:
    base = f"{prefix}__{LONG}"
    return base[:55] + "_" + hashlib.sha256(f"{prefix}/{LONG}".encode()).hexdigest()[:8]


@pytest.fixture(scope="module")
def http_fixture():
    with run_http_fixture(name="web") as fx:
        yield fx


@pytest.fixture(scope="module")
def core_gateway(tmp_path_factory: pytest.TempPathFactory, http_fixture):
    """One gateway for the tests that only list and call (none changes what it serves)."""
    tmp_path = tmp_path_factory.mktemp("core")
    config = {
        "servers": {
            "fx": stdio_spec(),
            "web": {"url": http_fixture.url, "only": ["echo", "add", "fail", "wr*"], "deny": ["write_*"]},
            "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "trusted": True},
        }
    }
    with run_gateway(tmp_path, config) as gw:
        yield gw


def _all_up(names: list[str]) -> bool:
    return {"fx__echo", "web__echo", "time__get_current_time"} <= set(names)


@pytest.mark.parametrize("era", ERAS)
async def test_lists_and_calls_prefixed_tools_of_several_upstreams(core_gateway, era: str) -> None:
    async with connect(core_gateway.url, era) as client:
        names = await client.wait_for(_all_up)
        assert names == sorted(names), "the listing has a deterministic order"
        assert {"web__echo", "web__add", "web__fail"} == {n for n in names if n.startswith("web__")}
        assert long_public_name("fx") in names
        assert all(len(n) <= 64 for n in names)

        echo = await client.call("fx__echo", {"text": "hi there"})
        assert [c.text for c in echo.content] == ["hi there"]
        assert echo.is_error is False
        via_http = await client.call("web__echo", {"text": "over http"})
        assert via_http.content[0].text == "over http"
        now = await client.call("time__get_current_time", {"timezone": "UTC"})
        assert json.loads(now.content[0].text)["timezone"] == "UTC"
        assert (await client.call(long_public_name("fx"))).content[0].text == "long"


@pytest.mark.parametrize("era", ERAS)
async def test_results_are_verbatim_with_labels(core_gateway, era: str) -> None:
    async with connect(core_gateway.url, era) as client:
        await client.wait_for(_all_up)
        added = await client.call("web__add", {"a": 2, "b": 3})
        assert added.structured_content == {"sum": 5}
        assert added.meta is not None
        assert added.meta["manifold/server"] == "web"
        assert added.meta["manifold/trust"] == "outside"
        if era == "2026-07-28":
            assert added.meta["io.modelcontextprotocol/serverInfo"]["name"] == "manifold"

        failed = await client.call("fx__fail", {"reason": "nope, not today"})
        assert failed.is_error is True
        assert failed.content[0].text == "nope, not today"

        trusted = await client.call("time__get_current_time", {"timezone": "UTC"})
        assert trusted.meta["manifold/trust"] == "trusted"


async def test_tool_definitions_pass_verbatim_with_meta(core_gateway) -> None:
    async with connect(core_gateway.url, "2026-07-28") as client:
        await client.wait_for(_all_up)
        tools = {t["name"]: t for t in await client.raw_tools()}
    echo = tools["fx__echo"]
    assert echo["annotations"] == {"readOnlyHint": True}, "a hint the upstream did not give stays unset"
    assert echo["_meta"]["manifold/server"] == "fx"
    assert echo["_meta"]["manifold/tool"] == "echo"
    assert echo["_meta"]["manifold/trust"] == "outside"
    assert echo["_meta"]["manifold/gated"] is False
    add = tools["web__add"]
    assert add["annotations"] == {
        "readOnlyHint": True,
        "idempotentHint": True,
        "destructiveHint": False,
        "openWorldHint": False,
    }
    assert add["outputSchema"]["properties"]["sum"]["type"] == "integer"
    assert add["inputSchema"]["required"] == ["a", "b"]
    assert "annotations" not in tools["fx__no_annotations"]
    assert tools["fx__no_annotations"]["_meta"]["manifold/gated"] is True
    assert tools["fx__write_note"]["_meta"]["manifold/gated"] is True
    long = tools[long_public_name("fx")]
    assert long["_meta"]["manifold/tool"] == LONG


@pytest.mark.parametrize("era", ERAS)
async def test_unknown_tool_is_invalid_params(core_gateway, era: str) -> None:
    async with connect(core_gateway.url, era) as client:
        await client.wait_for(_all_up)
        with pytest.raises(MCPError) as err:
            await client.call("nosuch__tool", {})
        assert err.value.code == -32602
        assert "nosuch__tool" in err.value.error.message
        with pytest.raises(MCPError) as err:
            await client.call("web__write_note", {"note": "denied by the filter"})
        assert err.value.code == -32602


@pytest.mark.path_independent
async def test_missing_env_var_and_failed_start_fail_one_server_only(tmp_path: Path) -> None:
    config = {
        "servers": {
            "good": stdio_spec(),
            "needs_env": {**stdio_spec(), "env": {"FIXTURE_SECRET": "${MANIFOLD_TEST_UNSET_VAR}"}},
            "broken": stdio_spec("exit-at-start"),
            "off": {**stdio_spec(), "disabled": True},
        }
    }
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            names = await client.wait_for(lambda n: "good__echo" in n)
            assert not [n for n in names if not n.startswith("good__")]
            assert (await client.call("good__echo", {"text": "still serving"})).content[0].text == "still serving"
        status = {s["name"]: s for s in httpx2.get(f"{gw.base}/readyz").json()["servers"]}
    assert status["good"]["state"] == "up"
    assert status["needs_env"]["state"] == "down"
    assert "MANIFOLD_TEST_UNSET_VAR" in status["needs_env"]["error"]
    assert status["broken"]["state"] in ("down", "connecting")
    assert status["off"]["state"] == "disabled"


async def test_collisions_are_kept_apart(tmp_path: Path) -> None:
    config = {"servers": {"one": {**stdio_spec(), "prefix": ""}, "two": {**stdio_spec(), "prefix": ""}}}
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, "2026-07-28") as client:
            names = await client.wait_for(lambda n: len([x for x in n if x.startswith("echo_")]) == 2)
            one = "echo_" + hashlib.sha256(b"one/echo").hexdigest()[:8]
            two = "echo_" + hashlib.sha256(b"two/echo").hexdigest()[:8]
            assert {one, two} <= set(names)
            assert "echo" not in names
            assert (await client.call(one, {"text": "a"})).meta["manifold/server"] == "one"
            assert (await client.call(two, {"text": "b"})).meta["manifold/server"] == "two"
        collided = [e for e in gw.log_events() if e.get("event", "").startswith("tool names collide")]
        assert any(e["name"] == "echo" for e in collided)


@pytest.mark.path_independent
async def test_claude_desktop_json_config(tmp_path: Path) -> None:
    config = {"mcpServers": {"fx": stdio_spec(), "clock": {"command": "mcp-server-time", "type": "stdio"}}}
    with run_gateway(tmp_path, config, config_name="claude_desktop_config.json") as gw:
        async with connect(gw.url, "2025-11-25") as client:
            names = await client.wait_for(lambda n: "fx__echo" in n and "clock__convert_time" in n)
            assert "clock__get_current_time" in names


@pytest.mark.skipif(NODE is None or not THIRDPARTY.exists(), reason="npm test upstreams not installed")
@pytest.mark.parametrize("era", ERAS)
async def test_npm_servers_behind_the_gateway(tmp_path: Path, era: str) -> None:
    config = {
        "servers": {
            "everything": {"command": NODE, "args": [str(THIRDPARTY / "server-everything/dist/index.js"), "stdio"]},
            "memory": {
                "command": NODE,
                "args": [str(THIRDPARTY / "server-memory/dist/index.js")],
                "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
                "sandbox": {"write": [str(tmp_path)]},
                "only": ["create_entities", "read_graph", "search_*"],
            },
        }
    }
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, era) as client:
            names = await client.wait_for(lambda n: "everything__get-sum" in n and "memory__read_graph" in n)
            assert {n for n in names if n.startswith("memory__")} == {
                "memory__create_entities",
                "memory__read_graph",
                "memory__search_nodes",
            }
            total = await client.call("everything__get-sum", {"a": 2, "b": 40})
            assert "42" in total.content[0].text
            created = await client.call(
                "memory__create_entities",
                {"entities": [{"name": "manifold", "entityType": "gateway", "observations": ["aggregates"]}]},
            )
            assert created.is_error is not True
            graph = await client.call("memory__read_graph", {})
            assert "manifold" in graph.content[0].text
            tools = {t["name"]: t for t in await client.raw_tools()}
    assert tools["memory__read_graph"]["annotations"]["readOnlyHint"] is True
    assert tools["memory__read_graph"]["_meta"]["manifold/gated"] is False
    assert tools["memory__create_entities"]["_meta"]["manifold/gated"] is True


@pytest.fixture(scope="module")
def empty_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with run_gateway(tmp_path_factory.mktemp("hosts"), {"servers": {}, "allowed_hosts": ["manifold:*"]}) as gw:
        yield gw


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Host": "evil.example:8080"}, 421),
        ({"Origin": "http://evil.example"}, 403),
        ({"Host": "manifold:8080"}, 200),
    ],
)
def test_host_and_origin_checks(empty_gateway: Gateway, headers: dict[str, str], status: int) -> None:
    response = httpx2.post(
        empty_gateway.url,
        json=initialize_body(),
        headers={"Accept": "application/json, text/event-stream", **headers},
    )
    assert response.status_code == status
