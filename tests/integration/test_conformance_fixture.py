"""The conformance fixture passes the official suite directly, in both eras, and serves SDK clients of both eras.

This proves ``tests/fixtures/conformance_server.py`` itself; testing the gateway in
front of it is a separate test. The suite runs with Node 22 from
``tests/thirdparty/node_modules`` (see ``tests/conformance.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client import ClientRequestContext, IncomingMessage

from tests.conformance import (
    FIXTURE,
    REQUIREMENT_SETS,
    requirement_set,
    run_suite,
    running_fixture,
    suite_available,
)

needs_suite = pytest.mark.skipif(not suite_available(), reason="conformance suite / Node 22 not installed")
WATCHED = "test://watched-resource"


@pytest.fixture(scope="module")
def fixture_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("conformance-fixture") / "fixture.log"
    with running_fixture(log_path=log) as url:
        yield url


@needs_suite
@pytest.mark.parametrize("requirements", REQUIREMENT_SETS)
def test_every_scored_scenario_passes(fixture_url: str, tmp_path: Path, requirements: str) -> None:
    result = run_suite(fixture_url, requirements, tmp_path, timeout=100)
    scored, _ = requirement_set(requirements)
    assert not result.timed_out, result.table()
    assert sorted(s.name for s in result.scored) == sorted(scored)
    assert result.ok, result.table()


@needs_suite
def test_resumable_mode_passes_sse_polling_too(tmp_path: Path) -> None:
    """With ``--resumable`` the pending ``server-sse-polling`` scenario passes without warnings."""
    with running_fixture(extra_args=["--resumable"], log_path=tmp_path / "fixture.log") as url:
        result = run_suite(url, "2025-11-25", tmp_path, timeout=100)
    assert result.ok, result.table()
    polling = result.scenario("server-sse-polling")
    assert polling.passed and polling.checks_passed == 3 and polling.warnings == 0, result.table(verbose=True)


# --------------------------------------------------------------------------- SDK clients of both eras


async def on_sampling(
    context: ClientRequestContext, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="Paris"),
        model="test-model",
        stop_reason="endTurn",
    )


async def on_elicitation(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    assert isinstance(params, types.ElicitRequestFormParams)
    properties: dict[str, Any] = params.requested_schema.get("properties", {})
    samples: dict[str, str | int | float | bool] = {"string": "blue", "boolean": True, "integer": 7, "number": 1.5}
    return types.ElicitResult(
        action="accept", content={k: samples.get(v.get("type"), "x") for k, v in properties.items()}
    )


async def on_roots(context: ClientRequestContext) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root.model_validate({"uri": "file:///tmp/root", "name": "root"})])


def target_for(transport: str, url: str) -> str | StdioServerParameters:
    if transport == "http":
        return url
    return StdioServerParameters(command=sys.executable, args=[str(FIXTURE), "--transport", "stdio"])


def texts(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["http", "stdio"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_sdk_client_gets_input_in_either_era(
    fixture_url: str, transport: str, mode: Literal["legacy", "2026-07-28"]
) -> None:
    """2025-11-25: real server->client requests; 2026-07-28: input_required rounds. Same tools either way."""
    logs: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async with Client(
        target_for(transport, fixture_url),
        mode=mode,
        cache=None,
        sampling_callback=on_sampling,
        elicitation_callback=on_elicitation,
        list_roots_callback=on_roots,
        logging_callback=on_log,
        log_level="debug",
    ) as client:
        assert client.session.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        assert texts(await client.call_tool("test_sampling", {"prompt": "Capital of France?"})) == "LLM response: Paris"
        elicited = texts(await client.call_tool("test_elicitation", {"message": "Who are you?"}))
        assert elicited == 'User response: action=accept, content={"email": "blue", "username": "blue"}'
        assert (
            texts(await client.call_tool("test_input_required_result_multi_round", {}))
            == "blue's favorite color is blue"
        )
        multiple = texts(await client.call_tool("test_input_required_result_multiple_inputs", {}))
        assert multiple == "name=blue; greeting=Paris; roots=file:///tmp/root"
        assert texts(await client.call_tool("test_input_required_result_request_state", {})).startswith("state-ok")
        prompt = await client.get_prompt("test_input_required_result_prompt")
        assert isinstance(prompt.messages[0].content, types.TextContent)
        assert prompt.messages[0].content.text == "Use this context: blue"
        read = await client.read_resource("test://input-required-resource")
        assert isinstance(read.contents[0], types.TextResourceContents)
        assert read.contents[0].text == "Read because: blue"

        reported: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reported.append(progress)

        await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        await client.call_tool("test_tool_with_logging", {})
        with anyio.fail_after(5):
            while len(reported) < 3 or len(logs) < 3:
                await anyio.sleep(0.02)
        assert reported == [0, 50, 100]
        assert logs == ["Tool execution started", "Tool processing data", "Tool execution completed"]


@pytest.mark.anyio
@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # resources/subscribe is handshake-era only
async def test_change_notifications_reach_a_legacy_session(fixture_url: str) -> None:
    seen: list[str] = []

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification | types.PromptListChangedNotification):
            seen.append(message.method)
        elif isinstance(message, types.ResourceUpdatedNotification):
            seen.append(f"{message.method} {message.params.uri}")

    async with Client(fixture_url, mode="legacy", cache=None, message_handler=on_message) as client:
        caps = client.session.server_capabilities
        assert caps is not None and caps.tools is not None and caps.tools.list_changed
        assert caps.resources is not None and caps.resources.subscribe
        await client.session.subscribe_resource(WATCHED)
        await client.call_tool("test_trigger_tool_change", {})
        await client.call_tool("test_trigger_prompt_change", {})
        await client.call_tool("test_update_watched_resource", {})
        with anyio.fail_after(5):
            while len(seen) < 3:
                await anyio.sleep(0.02)
    assert sorted(seen) == [
        "notifications/prompts/list_changed",
        f"notifications/resources/updated {WATCHED}",
        "notifications/tools/list_changed",
    ]


@pytest.mark.anyio
async def test_change_notifications_reach_a_2026_listener(fixture_url: str) -> None:
    events: list[object] = []
    async with (
        Client(fixture_url, mode="2026-07-28", cache=None) as client,
        client.listen(tools_list_changed=True, resource_subscriptions=[WATCHED]) as subscription,
    ):
        await client.call_tool("test_trigger_prompt_change", {})  # not subscribed: must not arrive
        await client.call_tool("test_trigger_tool_change", {})
        await client.call_tool("test_update_watched_resource", {})
        with anyio.fail_after(5):
            async for event in subscription:
                events.append(event)
                if len(events) == 2:
                    break
    assert [type(e).__name__ for e in events] == ["ToolsListChanged", "ResourceUpdated"]
