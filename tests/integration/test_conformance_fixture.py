"""The conformance fixture passes the official suite directly, in both eras, and serves SDK clients of both eras.

This proves ``tests/fixtures/conformance_server.py`` itself; testing the gateway in
front of it is a separate test. The suite runs with Node 22 from
``tests/thirdparty/node_modules`` (see ``tests/conformance.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp.types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client import ClientRequestContext, IncomingMessage
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from pydantic import TypeAdapter

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


# The fixture's own runs of the suite (`make test-all`): `make test` holds the fixture to the suite through the
# gateway (tests/integration/test_conformance.py), where a scenario the fixture failed would fail too.
@pytest.mark.slow
@needs_suite
@pytest.mark.parametrize("requirements", REQUIREMENT_SETS)
def test_every_scored_scenario_passes(fixture_url: str, tmp_path: Path, requirements: str) -> None:
    result = run_suite(fixture_url, requirements, tmp_path, timeout=100)
    scored, _ = requirement_set(requirements)
    assert not result.timed_out, result.table()
    assert sorted(s.name for s in result.scored) == sorted(scored)
    assert result.ok, result.table()
    if requirements == "2026-07-28":  # the tasks extension's scenarios are not scored, but the fixture passes them
        tasks = [s for s in result.not_scored if s.name.startswith("tasks-")]
        assert len(tasks) == 10 and all(s.passed for s in tasks), result.table(verbose=True)


@pytest.mark.slow
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


# --------------------------------------------------------------------------- the tasks extension (SEP-2663)

TASKS = "io.modelcontextprotocol/tasks"
RAW: TypeAdapter[Any] = TypeAdapter(dict[str, Any])  # results pass through as dicts
TERMINAL = ("completed", "failed", "cancelled")


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class ListenParams(types.RequestParams):
    notifications: dict[str, Any]


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"  # the SDK client then sends `Mcp-Name: <taskId>`, as SEP-2663 requires


class UpdateTask(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class ListenForTasks(types.Request[ListenParams, Literal["subscriptions/listen"]]):
    method: Literal["subscriptions/listen"] = "subscriptions/listen"


class CreateTaskResult(types.Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TaskStatus(types.NotificationParams):
    task_id: str
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class TasksClient(ClientExtension):
    """A minimal client side of the extension: declares it, resolves task results by polling, records status pushes."""

    identifier = TASKS

    def __init__(self) -> None:
        self.statuses: list[TaskStatus] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks", params_type=TaskStatus, handler=self.on_status)]

    async def on_status(self, params: TaskStatus) -> None:
        self.statuses.append(params)

    async def resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        task = await poll(ctx.session, created.task_id, *TERMINAL)
        if task["status"] == "failed":
            raise MCPError(task["error"]["code"], task["error"]["message"], task["error"].get("data"))
        if task["status"] == "cancelled":
            raise MCPError(types.INTERNAL_ERROR, "task cancelled")
        return types.CallToolResult.model_validate(task["result"])


async def poll(session: Any, task_id: str, *statuses: str) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            task: dict[str, Any] = await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), RAW)
            assert task["resultType"] == "complete" and task["taskId"] == task_id
            if task["status"] in statuses or task["status"] in TERMINAL:
                return task
            await anyio.sleep(0.05)


async def create_task(client: Client, name: str, arguments: dict[str, Any]) -> str:
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
    created = await client.session.send_request(request, RAW)
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert {"ttlMs", "pollIntervalMs", "createdAt", "lastUpdatedAt"} <= created.keys() and "requestState" not in created
    task_id: str = created["taskId"]
    return task_id


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_tasks_for_a_client_that_declares_the_extension(fixture_url: str, transport: str) -> None:
    async with Client(
        target_for(transport, fixture_url), cache=None, extensions=[TasksClient()], elicitation_callback=on_elicitation
    ) as client:
        caps = client.session.server_capabilities
        assert caps is not None and caps.extensions == {TASKS: {}}
        # call_tool resolves the claimed CreateTaskResult through the extension (tasks/get until terminal).
        done = await client.call_tool("slow_compute", {"seconds": 0.2, "label": "x"})
        assert texts(done) == "slow_compute finished after 0.2 s (x)"
        assert (await client.call_tool("failing_job", {})).is_error  # a tool error: `completed` + isError
        with pytest.raises(MCPError) as failed:  # a protocol error: `failed` + the JSON-RPC error inlined
            await client.call_tool("protocol_error_job", {})
        assert failed.value.code == types.INTERNAL_ERROR
        # MRTR first (answered by the elicitation callback), then a task; the answer reaches the task's result.
        assert texts(await client.call_tool("test_tool_with_task", {})) == "Hello, blue! (greeted from a task)"
        assert texts(await client.call_tool("greet", {"name": "Ann"})) == "Hello, Ann!"  # sync-only

        # Input inside a task: input_required on tasks/get, answered by tasks/update, one key at a time.
        task_id = await create_task(client, "multi_input", {})
        asked = await poll(client.session, task_id, "input_required")
        assert asked["status"] == "input_required" and sorted(asked["inputRequests"]) == ["confirm", "name"]
        assert asked["inputRequests"]["name"]["method"] == "elicitation/create"
        answer = {"action": "accept", "content": {"name": "Ann"}}
        update = UpdateTask(params=UpdateTaskParams(task_id=task_id, input_responses={"name": answer, "bogus": 1}))
        assert await client.session.send_request(update, RAW) == {"resultType": "complete", "_meta": ANY_META}
        partial = await poll(client.session, task_id, "input_required")
        assert list(partial["inputRequests"]) == ["confirm"]
        answer = {"action": "accept", "content": {"confirm": True}}
        update = UpdateTask(params=UpdateTaskParams(task_id=task_id, input_responses={"confirm": answer}))
        await client.session.send_request(update, RAW)
        finished = await poll(client.session, task_id, "completed")
        assert finished["result"]["content"][0]["text"] == "name=Ann; confirm=True"

        # Cancellation: an empty ack, then `cancelled`; again on a terminal task: the same ack.
        task_id = await create_task(client, "slow_compute", {"seconds": 60})
        cancel = CancelTask(params=TaskIdParams(task_id=task_id))
        assert (await client.session.send_request(cancel, RAW))["resultType"] == "complete"
        assert (await poll(client.session, task_id))["status"] == "cancelled"
        assert "taskId" not in await client.session.send_request(cancel, RAW)
        with pytest.raises(MCPError) as unknown:
            await client.session.send_request(GetTask(params=TaskIdParams(task_id="no-such-task")), RAW)
        assert unknown.value.code == types.INVALID_PARAMS


class _AnyMeta:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, dict)


ANY_META: Any = _AnyMeta()


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_task_status_notifications_ride_a_listen_stream(fixture_url: str, transport: str) -> None:
    tasks = TasksClient()
    async with Client(
        target_for(transport, fixture_url), cache=None, extensions=[tasks], elicitation_callback=on_elicitation
    ) as client:
        task_id = await create_task(client, "confirm_delete", {"filename": "a.txt"})
        listen = ListenForTasks(params=ListenParams(notifications={"taskIds": [task_id, "not-mine"]}))

        async def listen_stream() -> None:
            await client.session.send_request(listen, RAW)  # returns only when the stream ends

        async with anyio.create_task_group() as group:
            group.start_soon(listen_stream)
            with anyio.fail_after(5):
                while not any(s.status == "input_required" for s in tasks.statuses):
                    await anyio.sleep(0.02)
                asked = next(s for s in tasks.statuses if s.status == "input_required")
                assert asked.task_id == task_id and asked.input_requests is not None
                key = next(iter(asked.input_requests))
                answer = {"action": "accept", "content": {"confirm": True}}
                update = UpdateTask(params=UpdateTaskParams(task_id=task_id, input_responses={key: answer}))
                await client.session.send_request(update, RAW)
                while tasks.statuses[-1].status != "completed":
                    await anyio.sleep(0.02)
            group.cancel_scope.cancel()
    final = tasks.statuses[-1]
    assert final.task_id == task_id and final.result is not None
    assert final.result["content"][0]["text"] == "Deleted a.txt"
    assert (
        final.meta is not None and "io.modelcontextprotocol/subscriptionId" in final.model_dump(by_alias=True)["_meta"]
    )


@pytest.mark.anyio
async def test_tasks_need_the_extension(fixture_url: str) -> None:
    """Without the extension: no tasks, -32021 for required-task tools and the tasks/* methods; legacy: -32601."""
    async with Client(fixture_url, cache=None) as client:
        assert texts(await client.call_tool("slow_compute", {"seconds": 0})) == "slow_compute finished after 0 s"
        for call in (
            client.call_tool("failing_job", {}),
            client.session.send_request(GetTask(params=TaskIdParams(task_id="t")), RAW),
            client.session.send_request(ListenForTasks(params=ListenParams(notifications={"taskIds": ["t"]})), RAW),
        ):
            with pytest.raises(MCPError) as refused:
                await call
            assert refused.value.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
            assert refused.value.data == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    async with Client(fixture_url, mode="legacy", cache=None, elicitation_callback=on_elicitation) as client:
        caps = client.session.server_capabilities
        assert caps is not None and not caps.extensions
        assert texts(await client.call_tool("confirm_delete", {"filename": "b"})) == "Deleted b"  # inline elicitation
        with pytest.raises(MCPError) as missing:
            await client.session.send_request(GetTask(params=TaskIdParams(task_id="t")), RAW)
        assert missing.value.code == types.METHOD_NOT_FOUND
