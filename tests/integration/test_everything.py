"""The whole MCP surface of a server nobody on the team wrote, through the gateway.

`@modelcontextprotocol/server-everything` runs behind the gateway over stdio and over streamable HTTP, and
SDK clients of both eras use its prompts, resources, templates, completions, resource subscriptions,
logging, and its requests of the user (sampling, elicitation, roots), which the gateway relays to the
client whose call caused them. One gateway per upstream transport serves the whole module; a token
view that excludes the server checks that none of it leaks. A TypeScript SDK client checks the same
surface from the other SDK (`everything_client.mjs`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError, types

from gateway.internals.sdk import send_unchecked
from tests.fixtures.servers import run_everything_http
from tests.integration.conftest import ERAS, THIRDPARTY, EraClient, Gateway, connect, run_gateway, wait_until

pytestmark = pytest.mark.anyio

NODE = shutil.which("node")
EVERYTHING = THIRDPARTY / "server-everything" / "dist" / "index.js"
DOCS = EVERYTHING.parent / "docs"
TS_CLIENT = Path(__file__).with_name("everything_client.mjs")
LEGACY, MODERN = "2025-11-25", "2026-07-28"

FULL = "everything-full-token-0123456789abcdef"
NARROW = "everything-narrow-token-fedcba9876543210"
ENV = {"T_EVERYTHING_FULL": FULL, "T_EVERYTHING_NARROW": NARROW}
TIMEOUT = 4  # the server's call timeout in the gateway: bounds how long a lost relay can hold a call

PROMPTS = {"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"}
TEMPLATES = {"demo://resource/dynamic/text/{resourceId}", "demo://resource/dynamic/blob/{resourceId}"}
DOC = "demo://resource/static/document/"
LOG_LEVELS = {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}


if NODE is None or not EVERYTHING.exists():  # pragma: no cover - the npm test upstreams are not installed
    pytest.skip("node or @modelcontextprotocol/server-everything is not installed", allow_module_level=True)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wire(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def docs() -> dict[str, str]:
    """The static resources server-everything offers: one per file of its docs directory, by URI."""
    return {f"{DOC}{p.name}": p.read_text(encoding="utf-8") for p in sorted(DOCS.iterdir()) if p.is_file()}


# --- the upstream and the gateways ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def everything_http() -> Iterator[str]:
    """server-everything over streamable HTTP, for the module."""
    assert NODE is not None
    with run_everything_http(NODE, EVERYTHING) as url:
        yield url


def everything_spec(transport: str, url: str | None, **extra: Any) -> dict[str, Any]:
    """The server's entry in the gateway's config."""
    assert NODE is not None
    where: dict[str, Any] = (
        {"url": url} if transport == "http" else {"command": NODE, "args": [str(EVERYTHING), "stdio"]}
    )
    return {**where, "timeout": TIMEOUT, "required": True, **extra}


@contextmanager
def everything_gateway(tmp_path: Path, spec: dict[str, Any]) -> Iterator[Gateway]:
    """A gateway with server-everything behind it and two tokens: one sees everything, one another server only."""
    config = {
        "auth": {
            "tokens": [
                {"name": "full", "token": "${T_EVERYTHING_FULL}"},
                {"name": "narrow", "token": "${T_EVERYTHING_NARROW}", "servers": ["elsewhere"]},
            ]
        },
        "servers": {"everything": spec},
    }
    with run_gateway(tmp_path, config, env=ENV) as gw:
        deadline = time.monotonic() + 20
        while httpx2.get(f"{gw.base}/readyz", timeout=5).status_code != 200:  # the server is up: its offer is in
            assert time.monotonic() < deadline, f"server-everything never came up:\n{gw.log()}"
            time.sleep(0.1)
        yield gw


@dataclass
class Running:
    """A module gateway and the transport it reaches server-everything over."""

    gateway: Gateway
    transport: str

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module", params=["stdio", "http"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    transport: str = request.param
    url = request.getfixturevalue("everything_http") if transport == "http" else None
    with everything_gateway(tmp_path_factory.mktemp(f"everything-{transport}"), everything_spec(transport, url)) as g:
        yield Running(g, transport)


@asynccontextmanager
async def client(gw: Running, era: str, token: str = FULL, **kwargs: Any) -> AsyncIterator[EraClient]:
    async with connect(gw.url, era, headers=bearer(token), **kwargs) as c:
        yield c


async def walk(c: EraClient, kind: str) -> tuple[list[dict[str, Any]], int]:
    """Every item of a listing (`prompts`, `resources`, `resourceTemplates`), following cursors; and the pages."""
    method = {
        "prompts": c.session.list_prompts,
        "resources": c.session.list_resources,
        "resourceTemplates": c.session.list_resource_templates,
    }[kind]
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = wire(await method(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None))
        pages += 1
        items += page[kind]
        cursor = page.get("nextCursor")
        if cursor is None:
            return items, pages


async def capabilities(c: EraClient, era: str) -> types.ServerCapabilities | None:
    """What the gateway declared to this client: in its handshake (2025), or by `server/discover` (2026)."""
    if era == LEGACY:
        return c.session.server_capabilities
    discovered = await send_unchecked(c.session, "server/discover", {})
    return types.ServerCapabilities.model_validate(discovered["capabilities"], by_name=False)


def assert_labelled(meta: dict[str, Any] | None, era: str) -> None:
    """A result the gateway passed on: its server and trust, and (2026) Manifold's identity."""
    assert meta is not None
    assert meta["manifold/server"] == "everything"
    assert meta["manifold/trust"] == "outside"
    if era == MODERN:
        assert meta["io.modelcontextprotocol/serverInfo"]["name"] == "manifold"


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


# --- prompts, resources, completions ----------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_every_prompt_is_listed_prefixed_and_gets(gw: Running, era: str) -> None:
    async with client(gw, era) as c:
        prompts, pages = await walk(c, "prompts")
        assert pages == 1
        by_name = {p["name"]: p for p in prompts}
        assert set(by_name) == {f"everything__{p}" for p in PROMPTS}
        for name, prompt in by_name.items():
            assert prompt["_meta"] == {
                "manifold/server": "everything",
                "manifold/prompt": name.removeprefix("everything__"),
                "manifold/trust": "outside",
            }
        assert by_name["everything__simple-prompt"]["title"] == "Simple Prompt"
        assert {a["name"]: a.get("required") for a in by_name["everything__args-prompt"]["arguments"]} == {
            "city": True,
            "state": False,
        }

        simple = await c.session.get_prompt("everything__simple-prompt")
        assert_labelled(simple.meta, era)
        assert [m.content.text for m in simple.messages if isinstance(m.content, types.TextContent)] == [
            "This is a simple prompt without arguments."
        ]

        args = await c.session.get_prompt("everything__args-prompt", {"city": "Paris", "state": "Texas"})
        assert_labelled(args.meta, era)
        assert wire(args.messages[0].content)["text"] == "What's weather in Paris, Texas?"
        only_city = await c.session.get_prompt("everything__args-prompt", {"city": "Lyon"})
        assert wire(only_city.messages[0].content)["text"] == "What's weather in Lyon?"

        team = await c.session.get_prompt(
            "everything__completable-prompt", {"department": "Engineering", "name": "Alice"}
        )
        assert wire(team.messages[0].content)["text"] == "Please promote Alice to the head of the Engineering team."

        embedded = await c.session.get_prompt(
            "everything__resource-prompt", {"resourceType": "Blob", "resourceId": "3"}
        )
        assert_labelled(embedded.meta, era)
        assert len(embedded.messages) == 2
        resource = wire(embedded.messages[1].content)
        assert resource["type"] == "resource"
        assert resource["resource"]["uri"] == "demo://resource/dynamic/blob/3"
        assert base64.b64decode(resource["resource"]["blob"]).startswith(b"Resource 3: This is a base64 blob")

        for unknown in ("simple-prompt", "everything__no-such-prompt"):
            with pytest.raises(MCPError) as err:
                await c.session.get_prompt(unknown)
            assert err.value.code == types.INVALID_PARAMS
            assert f"Unknown prompt: {unknown}" in err.value.error.message


@pytest.mark.parametrize("era", ERAS)
async def test_every_resource_and_template_is_listed_and_read(gw: Running, era: str) -> None:
    expected = docs()
    async with client(gw, era) as c:
        resources, pages = await walk(c, "resources")
        assert pages == 1, "fewer resources than one page holds"
        assert [r["uri"] for r in resources] == list(expected), "URIs pass unchanged, in the server's order"
        for resource in resources:
            assert resource["mimeType"] == "text/markdown"
            assert resource["_meta"] == {"manifold/server": "everything", "manifold/trust": "outside"}
        with pytest.raises(MCPError) as err:
            await c.session.list_resources(params=types.PaginatedRequestParams(cursor="no-such-cursor"))
        assert err.value.code == types.INVALID_PARAMS

        for uri, text in expected.items():
            read = await c.session.read_resource(uri)
            assert_labelled(read.meta, era)
            [content] = read.contents
            assert isinstance(content, types.TextResourceContents)
            assert (content.uri, content.mime_type, content.text) == (uri, "text/markdown", text)

        templates, pages = await walk(c, "resourceTemplates")
        assert pages == 1
        assert {t["uriTemplate"] for t in templates} == TEMPLATES
        assert all(t["_meta"]["manifold/server"] == "everything" for t in templates)

        dynamic = await c.session.read_resource("demo://resource/dynamic/text/1")
        assert_labelled(dynamic.meta, era)
        [content] = dynamic.contents
        assert isinstance(content, types.TextResourceContents)
        assert content.uri == "demo://resource/dynamic/text/1"
        assert content.text.startswith("Resource 1: This is a plaintext resource created at")

        blob = await c.session.read_resource("demo://resource/dynamic/blob/42")
        assert_labelled(blob.meta, era)
        [content] = blob.contents
        assert isinstance(content, types.BlobResourceContents)
        assert base64.b64decode(content.blob).startswith(b"Resource 42: This is a base64 blob created at")


@pytest.mark.parametrize("era", ERAS)
async def test_an_unknown_uri_is_resource_not_found_in_the_callers_era(gw: Running, era: str) -> None:
    uri = "demo://resource/nowhere/1"
    async with client(gw, era) as c:
        with pytest.raises(MCPError) as err:
            await c.session.read_resource(uri)
    assert err.value.code == (-32002 if era == LEGACY else types.INVALID_PARAMS)
    assert err.value.error.data == {"uri": uri}
    assert uri in err.value.error.message


@pytest.mark.parametrize("era", ERAS)
async def test_completion_of_a_prompt_argument_and_a_template_variable(gw: Running, era: str) -> None:
    prompt = types.PromptReference(type="ref/prompt", name="everything__completable-prompt")
    template = types.ResourceTemplateReference(type="ref/resource", uri="demo://resource/dynamic/text/{resourceId}")
    async with client(gw, era) as c:
        department = await c.session.complete(prompt, {"name": "department", "value": "Eng"})
        assert department.completion.values == ["Engineering"]
        assert_labelled(department.meta, era)
        people = await c.session.complete(prompt, {"name": "name", "value": ""}, {"department": "Sales"})
        assert people.completion.values == ["David", "Eve", "Frank"], "the context reaches the server"
        kinds = await c.session.complete(
            types.PromptReference(type="ref/prompt", name="everything__resource-prompt"),
            {"name": "resourceType", "value": "B"},
        )
        assert kinds.completion.values == ["Blob"]
        resource_id = await c.session.complete(template, {"name": "resourceId", "value": "17"})
        assert resource_id.completion.values == ["17"]
        assert_labelled(resource_id.meta, era)
        with pytest.raises(MCPError) as err:
            await c.session.complete(
                types.PromptReference(type="ref/prompt", name="completable-prompt"), {"name": "name", "value": ""}
            )
        assert err.value.code == types.INVALID_PARAMS


# --- subscriptions and logging ----------------------------------------------------------------------------------


class Inbox:
    """What one client was sent besides answers: resource updates and log lines."""

    def __init__(self) -> None:
        self.updated: list[str] = []
        self.logs: list[types.LoggingMessageNotificationParams] = []

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)


@asynccontextmanager
async def toggled(c: EraClient, tool: str) -> AsyncIterator[str]:
    """Turn one of server-everything's simulations on for the block (it runs per upstream session)."""
    started = text_of(await c.call(tool))
    assert started.startswith("Started"), started
    try:
        yield started
    finally:
        with anyio.CancelScope(shield=True):
            stopped = text_of(await c.call(tool))
            assert stopped.startswith("Stopped"), stopped


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # resources/subscribe, logging/setLevel: 2025 only
async def test_resource_updates_reach_the_subscribed_sessions_only(gw: Running) -> None:
    from mcp.client.subscriptions import listen

    first, second = f"{DOC}features.md", f"{DOC}architecture.md"
    a, b, idle = Inbox(), Inbox(), Inbox()
    modern_updates: list[str] = []
    async with (
        client(gw, LEGACY, message_handler=a.on_message) as alpha,
        client(gw, LEGACY, message_handler=b.on_message) as beta,
        client(gw, LEGACY, message_handler=idle.on_message),
        client(gw, MODERN) as modern,
        anyio.create_task_group() as tg,
    ):
        await alpha.session.subscribe_resource(first)
        await beta.session.subscribe_resource(second)
        listening = anyio.Event()

        async def listener() -> None:
            async with listen(modern.session, resource_subscriptions=[first]) as subscription:
                listening.set()
                async for event in subscription:
                    modern_updates.append(str(getattr(event, "uri", event)))

        tg.start_soon(listener)
        with anyio.fail_after(10):
            await listening.wait()
        with pytest.raises(MCPError) as err:
            await alpha.session.subscribe_resource("demo://resource/nowhere/1")
        assert err.value.code == -32002

        async with toggled(alpha, "everything__toggle-subscriber-updates"):
            await wait_until(lambda: bool(a.updated and b.updated and modern_updates), 12, "resource updates")
            await anyio.sleep(0.5)
        await alpha.session.unsubscribe_resource(first)
        await beta.session.unsubscribe_resource(second)
        tg.cancel_scope.cancel()
    assert set(a.updated) == {first}
    assert set(b.updated) == {second}
    assert set(modern_updates) == {first}
    assert idle.updated == [], "a session that subscribed to nothing hears of no update"


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # resources/subscribe, logging/setLevel: 2025 only
@pytest.mark.parametrize("era", ERAS)
async def test_log_lines_reach_the_caller_named_after_the_server(gw: Running, era: str) -> None:
    caller, bystander = Inbox(), Inbox()
    opt_in: dict[str, Any] = {"log_level": "debug"} if era == MODERN else {}
    async with (
        client(gw, era, logging_callback=caller.on_log, **opt_in) as c,
        client(gw, LEGACY, logging_callback=bystander.on_log) as other,
    ):
        await other.session.set_logging_level("debug")
        if era == LEGACY:
            await c.session.set_logging_level("debug")
        # server-everything logs once as the simulation starts, beside the call's answer (over HTTP on its
        # session's standalone stream); then every 5 s, when no call is in flight to carry it.
        async with toggled(c, "everything__toggle-simulated-logging"):
            await wait_until(lambda: bool(caller.logs), 5, "a log line")
    [line] = caller.logs
    assert line.logger == "everything", "the gateway names the server the line came from"
    assert line.level in LOG_LEVELS
    assert isinstance(line.data, str) and "message" in line.data.lower()
    assert bystander.logs == [], "another session with no call in flight hears nothing"


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # logging/setLevel: 2025 only
async def test_a_quieter_session_does_not_silence_another(gw: Running) -> None:
    """The server keeps one level for all callers: the most verbose any session asked for, not the last."""
    caller, quiet = Inbox(), Inbox()
    async with (
        client(gw, LEGACY, logging_callback=caller.on_log) as c,
        client(gw, LEGACY, logging_callback=quiet.on_log) as other,
    ):
        await c.session.set_logging_level("debug")
        await other.session.set_logging_level("emergency")
        async with toggled(c, "everything__toggle-simulated-logging"):
            await wait_until(lambda: bool(caller.logs), 5, "a log line")
    assert caller.logs and caller.logs[0].logger == "everything"
    assert quiet.logs == []


async def test_a_2026_call_without_a_log_level_gets_no_log_lines(gw: Running) -> None:
    inbox = Inbox()
    async with (
        client(gw, MODERN, logging_callback=inbox.on_log) as c,
        toggled(c, "everything__toggle-simulated-logging"),
    ):
        await anyio.sleep(0.3)
    assert inbox.logs == []


# --- what the server asks of the user ---------------------------------------------------------------------------


async def test_sampling_is_relayed_to_the_2025_caller(gw: Running) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="forty-two, said the client"),
            model="client-model-7",
            stop_reason="endTurn",
        )

    async with client(gw, LEGACY, sampling_callback=sample) as c:
        with anyio.fail_after(TIMEOUT + 5):
            result = await c.call("everything__trigger-sampling-request", {"prompt": "What is six times seven?"})
    assert result.is_error is not True, text_of(result)
    assert "forty-two, said the client" in text_of(result)
    assert "client-model-7" in text_of(result)
    [params] = asked
    assert wire(params)["_meta"] == {"manifold/server": "everything", "manifold/trust": "outside"}
    assert params.system_prompt == "You are a helpful test server."
    assert "What is six times seven?" in wire(params.messages[0].content)["text"]


async def test_elicitation_is_relayed_to_the_2025_caller(gw: Running) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"name": "Ada Lovelace", "check": True, "integer": 7})

    async with client(gw, LEGACY, elicitation_callback=elicit) as c:
        with anyio.fail_after(TIMEOUT + 5):
            result = await c.call("everything__trigger-elicitation-request")
    assert result.is_error is not True, text_of(result)
    text = text_of(result)
    assert "- Name: Ada Lovelace" in text
    assert "- Agreed to terms: true" in text
    assert "- Favorite Integer: 7" in text
    [params] = asked
    assert wire(params)["_meta"] == {"manifold/server": "everything", "manifold/trust": "outside"}
    assert wire(params)["requestedSchema"]["required"] == ["name"]


async def test_a_task_runs_through_the_gateway_and_stays_its_callers(gw: Running) -> None:
    """`simulate-research-query` needs a task (2025-11-25): created, polled, its question relayed on the
    `tasks/result` stream, its result fetched, listed; the task id is the gateway's, and another session's
    requests about it are refused as an unknown task."""
    asked: list[str] = []

    async def clarify(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"interpretation": "the snake"})

    arguments = {"topic": "python", "ambiguous": True}
    async with client(gw, LEGACY, elicitation_callback=clarify) as c, client(gw, LEGACY) as other:
        assert c.session.server_capabilities is not None and c.session.server_capabilities.tasks is not None
        call = {"name": "everything__simulate-research-query", "arguments": arguments, "task": {"ttl": 60000}}
        created = await send_unchecked(c.session, "tools/call", call)
        task_id = created["task"]["taskId"]
        assert task_id.startswith("manifold-"), created
        assert created["_meta"]["manifold/server"] == "everything"
        with anyio.fail_after(20):
            while (state := await send_unchecked(c.session, "tasks/get", {"taskId": task_id}))["status"] == "working":
                await anyio.sleep(0.2)
        assert state["taskId"] == task_id and state["status"] == "input_required", state
        with pytest.raises(MCPError, match="Unknown task"):
            await send_unchecked(other.session, "tasks/get", {"taskId": task_id})
        with anyio.fail_after(20):
            result = await send_unchecked(c.session, "tasks/result", {"taskId": task_id})
        assert "# Research Report: python (the snake)" in result["content"][0]["text"]
        assert len(asked) == 1 and "python" in asked[0]
        listed = await send_unchecked(c.session, "tasks/list", {})
        assert [t["taskId"] for t in listed["tasks"]] == [task_id]
        assert (await send_unchecked(other.session, "tasks/list", {}))["tasks"] == []


@pytest.mark.parametrize("gw", ["stdio", "http"], indirect=True)
@pytest.mark.parametrize("era", ERAS)
async def test_a_caller_that_cannot_sample_gets_a_clean_error(gw: Running, era: str) -> None:
    """A client that declared no sampling: the server's request is refused at once, and the call ends."""
    async with client(gw, era) as c:
        started = time.monotonic()
        with anyio.fail_after(TIMEOUT + 5):
            result = await c.call("everything__trigger-sampling-request", {"prompt": "anyone there?"})
        took = time.monotonic() - started
    assert result.is_error is True
    assert "sampling/createMessage cannot be relayed" in text_of(result), text_of(result)
    assert took < TIMEOUT / 2, f"refused at once, not at the timeout ({took:.1f} s)"
    assert_labelled(result.meta, era)


@pytest.mark.parametrize("gw", ["stdio", "http"], indirect=True)
@pytest.mark.parametrize("era", ERAS)
async def test_a_servers_request_never_reaches_another_session(gw: Running, era: str) -> None:
    asked: list[str] = []

    async def bystander_samples(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(wire(params.messages[0].content)["text"])
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="the bystander's answer"), model="b"
        )

    async with (
        client(gw, LEGACY, sampling_callback=bystander_samples) as bystander,
        client(gw, era) as caller,
        anyio.create_task_group() as tg,
    ):
        busy = {"duration": 2, "steps": 1}
        tg.start_soon(partial(bystander.call, "everything__trigger-long-running-operation", busy))
        await anyio.sleep(0.5)  # the bystander's call is in flight on the same server
        with anyio.fail_after(TIMEOUT + 5):
            result = await caller.call("everything__trigger-sampling-request", {"prompt": "the caller's own question"})
    assert asked == [], f"another session was asked: {asked}"
    assert "the bystander's answer" not in text_of(result)
    assert result.is_error is True and "cannot be relayed" in text_of(result), text_of(result)


ROOTS_ASKED: list[Any] = []  # the `_meta` of each roots/list request a client was sent


async def _roots(ctx: Any) -> types.ListRootsResult:
    ROOTS_ASKED.append(ctx.meta)
    return types.ListRootsResult.model_validate(
        {"roots": [{"uri": "file:///home/ada/secret-project", "name": "ada-project"}]}
    )


async def test_roots_are_not_relayed_without_opt_in(gw: Running) -> None:
    ROOTS_ASKED.clear()
    async with client(gw, LEGACY, list_roots_callback=_roots) as c:
        names = await c.tool_names()
        assert "everything__get-sum" in names
        assert "everything__get-roots-list" not in names, "the gateway declared no roots to the server"
        with pytest.raises(MCPError) as err:
            await c.call("everything__get-roots-list")
        assert err.value.code == types.INVALID_PARAMS
    assert ROOTS_ASKED == []


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_roots_are_relayed_to_the_caller_with_opt_in(
    tmp_path: Path, request: pytest.FixtureRequest, transport: str
) -> None:
    ROOTS_ASKED.clear()
    url = request.getfixturevalue("everything_http") if transport == "http" else None
    spec = everything_spec(transport, url, relay={"roots": True})
    with everything_gateway(tmp_path, spec) as gateway:
        running = Running(gateway, transport)
        async with client(running, LEGACY, list_roots_callback=_roots) as c:
            assert "everything__get-roots-list" in await c.tool_names()
            with anyio.fail_after(TIMEOUT + 5):
                result = await c.call("everything__get-roots-list")
    assert result.is_error is not True, text_of(result)
    assert "file:///home/ada/secret-project" in text_of(result)
    assert "ada-project" in text_of(result)
    # The server asks once on its own 350 ms after it starts and once more from the tool if that first answer has
    # not come back yet: one or two asks, each relayed once.
    assert ROOTS_ASKED and all(meta is not None and meta["manifold/server"] == "everything" for meta in ROOTS_ASKED)
    relayed = [e for e in gateway.log_events() if e.get("event") == "server request relayed"]
    assert [(e["server"], e["method"]) for e in relayed] == [("everything", "roots/list")] * len(ROOTS_ASKED)


# --- views ------------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # resources/subscribe, logging/setLevel: 2025 only
@pytest.mark.parametrize("era", ERAS)
async def test_a_token_view_without_the_server_sees_none_of_it(gw: Running, era: str) -> None:
    async with client(gw, era, token=NARROW) as c:
        caps = await capabilities(c, era)
        assert caps is not None and caps.tools is not None
        assert (caps.prompts, caps.resources, caps.completions, caps.logging) == (None, None, None, None)
        async with client(gw, era) as full:
            wide = await capabilities(full, era)
            assert wide is not None and wide.prompts is not None and wide.resources is not None
            assert wide.completions is not None and wide.resources.subscribe is True
        assert await c.tool_names() == []
        assert (await walk(c, "prompts"))[0] == []
        assert (await walk(c, "resources"))[0] == []
        assert (await walk(c, "resourceTemplates"))[0] == []
        with pytest.raises(MCPError) as err:
            await c.session.get_prompt("everything__simple-prompt")
        assert err.value.code == types.INVALID_PARAMS and "Unknown prompt" in err.value.error.message
        for uri in (f"{DOC}features.md", "demo://resource/dynamic/text/1"):
            with pytest.raises(MCPError) as err:
                await c.session.read_resource(uri)
            assert err.value.code == (-32002 if era == LEGACY else types.INVALID_PARAMS)
            assert err.value.error.data == {"uri": uri}, "the same answer as for a URI nobody offers"
        with pytest.raises(MCPError) as err:
            await c.session.complete(
                types.PromptReference(type="ref/prompt", name="everything__completable-prompt"),
                {"name": "department", "value": ""},
            )
        assert err.value.code == types.INVALID_PARAMS
        with pytest.raises(MCPError) as err:
            await c.session.complete(
                types.ResourceTemplateReference(type="ref/resource", uri="demo://resource/dynamic/text/{resourceId}"),
                {"name": "resourceId", "value": "1"},
            )
        assert err.value.code == (-32002 if era == LEGACY else types.INVALID_PARAMS)
        if era == LEGACY:
            with pytest.raises(MCPError) as err:
                await c.session.subscribe_resource(f"{DOC}features.md")
            assert err.value.code == -32002


# --- the TypeScript SDK as the client ---------------------------------------------------------------------------


def test_typescript_sdk_client(gw: Running) -> None:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(TS_CLIENT), gw.url],
        env={**os.environ, "MANIFOLD_TOKEN": FULL},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["protocolVersion"] == LEGACY
    assert summary["server"]["name"] == "manifold"
    assert set(summary["prompts"]) == {f"everything__{p}" for p in PROMPTS}
    assert summary["resources"] == list(docs())
    assert set(summary["templates"]) == TEMPLATES
    assert summary["prompt"] == {"text": "What's weather in Nantes, Loire?", "server": "everything"}
    assert summary["read"] == {"uri": f"{DOC}features.md", "chars": len(docs()[f"{DOC}features.md"])}
    assert summary["samplingMeta"] == {"manifold/server": "everything", "manifold/trust": "outside"}
    assert summary["sampling"]["isError"] is False
    assert "typescript sampled this" in summary["sampling"]["text"]
