"""Deferred exposure with real clients of both eras: only the search and call tools (and `always` tools) are
listed; the search finds tools of the caller's view only; a 2025 session then lists what it found; the call
tool goes through the same policy as a direct call (gating and confirmation included); bad input gets a
clean tool error; the search's embedding model is loaded only when `search_model` asks for it, and a gateway
that asks for it and cannot load it does not start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from bench.search_eval import load_independent
from tests.fixtures.servers import HttpFixture, run_http_fixture, stdio_spec
from tests.integration.conftest import ERAS, ROOT, connect, run_gateway, watch_changes, write_config

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


# The independent set's request that shares no word with its tool (EverArt's generate_image): the lexical index
# misses it, the fused one ranks it first.
DRAW = "draw an illustration of a fox in a spacesuit"
WEIGHTS_FILE = "l2_supercat_256.safetensors"  # the model's weights, memory-mapped by a gateway that loads it


@pytest.fixture(scope="module")
def everart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpFixture]:
    """A fixture server named everart offering EverArt's generate_image as the evaluation set recorded it."""
    independent = load_independent()
    (query,) = [q for q in independent.queries if q.text == DRAW]
    assert query.expect == {"everart__generate_image"}
    (tool,) = [t for name, _, t in independent.tools() if name == "everart__generate_image"]
    tools = tmp_path_factory.mktemp("everart") / "tools.json"
    tools.write_text(json.dumps([{"name": "generate_image", "description": tool["description"]}]))
    with run_http_fixture(name="everart", extra_args=("--tools-file", str(tools))) as fixture:
        yield fixture


@pytest.mark.parametrize("search_model", ["none", "wordllama", "minilm"])
async def test_the_embedding_model_is_loaded_only_when_the_setting_asks(
    tmp_path: Path, everart: HttpFixture, search_model: str
) -> None:
    cfg = config()
    cfg["servers"]["everart"] = {"url": everart.url, "required": True}
    env = {"MANIFOLD_SEARCH_MODEL": search_model} if search_model != "none" else {}
    with run_gateway(tmp_path, cfg, env=env) as gw:
        ready(gw.base)
        maps = Path(f"/proc/{gw.proc.pid}/maps").read_text()
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: SEARCH in n)
            deadline = time.monotonic() + 20
            while True:  # the index has the tool once a request sharing its words finds it
                found = await client.call(SEARCH, {"query": "generate an image", "limit": 1})
                if [t["name"] for t in found.structured_content["tools"]] == ["everart__generate_image"]:
                    break
                assert time.monotonic() < deadline, "the index never had everart__generate_image"
            drawn = await client.call(SEARCH, {"query": DRAW, "limit": 1})
            names = [t["name"] for t in drawn.structured_content["tools"]]
    if search_model == "wordllama":
        assert WEIGHTS_FILE in maps, "the fused index maps the model's weights"
        assert names == ["everart__generate_image"], "the fused index finds a tool sharing no word with the request"
    elif search_model == "minilm":
        assert "/onnxruntime/" in maps and WEIGHTS_FILE not in maps, "the transformer runs on onnxruntime"
        assert names == ["everart__generate_image"], "the fused index finds a tool sharing no word with the request"
    else:
        assert WEIGHTS_FILE not in maps and "/tokenizers/" not in maps, "the default gateway loads no model"
        assert "/onnxruntime/" not in maps
        assert names == [], "the lexical index alone has nothing for it"


# Runs the CLI with numpy unimportable, as on an install without the `semantic` extra.
WITHOUT_NUMPY = (
    "import sys; sys.modules['numpy'] = None; from gateway.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("command", ["check", "serve"])
def test_asking_for_a_model_that_is_not_installed_stops_the_gateway(tmp_path: Path, command: str) -> None:
    path = write_config(tmp_path, {"servers": {}})
    argv = [command, "--config", str(path), *(["--port", "0"] if command == "serve" else [])]
    env = {"MANIFOLD_SEARCH_MODEL": "wordllama", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_NUMPY, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "search_model: wordllama (MANIFOLD_SEARCH_MODEL) needs the `semantic` extra" in done.stderr
    assert "the `numpy` package is not installed" in done.stderr
    if command == "check":  # the same install with the default setting: fine
        del env["MANIFOLD_SEARCH_MODEL"]
        default = subprocess.run(
            [sys.executable, "-c", WITHOUT_NUMPY, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert default.returncode == 0, default.stderr
