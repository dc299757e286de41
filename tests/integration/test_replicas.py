"""Three gateways on one real Redis behind a real HAProxy (round robin, no affinity): a 2025-era client's session
is served by whichever replica each request reaches, survives the death of the replica that opened it, and a
DELETE on one replica ends it on all."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, types

from bench.replicas import shipped_haproxy
from tests.conformance import requirement_set, run_suite, running_fixture, suite_available
from tests.fixtures.servers import free_port, run_http_fixture, stdio_spec
from tests.integration.conftest import (
    REDIS,
    Gateway,
    RedisServer,
    connect,
    initialize_body,
    run_gateway,
)
from tests.integration.test_conformance import wait_ready

HAPROXY = shutil.which("haproxy")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(HAPROXY is None or REDIS is None, reason="haproxy and redis-server are needed"),
]
LEGACY, MODERN = "2025-11-25", "2026-07-28"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@contextmanager
def haproxy(tmp_path: Path, ports: list[int]) -> Iterator[str]:
    """HAProxy on loopback in front of `ports`, round robin per request, no affinity; a replica that stops
    answering is taken out by its health check and a request it refused is sent to another. The config is the
    shipped one (`deploy/replicas/haproxy.cfg`) with these replicas and a quicker health check."""
    port = free_port()
    servers = [f"  server g{i} 127.0.0.1:{p} check inter 300ms fall 1 rise 2" for i, p in enumerate(ports, 1)]
    config = tmp_path / "haproxy.cfg"
    config.write_text(shipped_haproxy(port, servers))
    proc = subprocess.Popen([HAPROXY or "haproxy", "-f", str(config), "-db"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, "haproxy did not come up"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(5)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def replica_config(
    redis: RedisServer, servers: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The config every replica runs: the shared store, `fx` and `servers`, and `settings`."""
    return {
        "store": f"redis://127.0.0.1:{redis.port}/0",
        "servers": {"fx": stdio_spec(), **(servers or {})},
        **(settings or {}),
    }


@contextmanager
def replicas(
    tmp_path: Path,
    redis: RedisServer,
    count: int = 3,
    servers: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Iterator[tuple[list[Gateway], str]]:
    """`count` gateways sharing Redis (serving `fx` and `servers`, with `settings`), and the URL of HAProxy in front
    of them."""
    config = replica_config(redis, servers, settings)
    with ExitStack() as stack:
        gateways = []
        for i in range(count):
            home = tmp_path / f"replica{i}"
            home.mkdir()
            gateways.append(stack.enter_context(run_gateway(home, config)))
        for gw in gateways:
            _wait_up(gw.base)
            wait_ready(gw.base)  # every `required` server up
        url = stack.enter_context(haproxy(tmp_path, [int(g.base.rsplit(":", 1)[1]) for g in gateways]))
        yield gateways, url


@dataclass
class Cluster:
    """Three replicas behind HAProxy, serving `fx` (stdio) and the conformance fixture bare-named (HTTP)."""

    gateways: list[Gateway]
    url: str
    redis: RedisServer

    def calls(self) -> list[float]:
        return [served(gw, "tools/call") for gw in self.gateways]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that change no replica (each counts its own calls as differences)."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        with running_fixture() as fixture:
            server = {"url": fixture, "prefix": "", "trusted": True, "relay": {"roots": True}, "required": True}
            with replicas(tmp_path, redis, servers={"conformance": server}) as (gateways, url):
                yield Cluster(gateways, url, redis)
    finally:
        redis.stop()


def _wait_up(base: str) -> None:
    """Wait until a replica has every server up (`fx` included, which is not `required`)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        servers = httpx2.get(f"{base}/readyz", timeout=5).json().get("servers", [])
        if servers and all(server["state"] == "up" for server in servers):
            return
        time.sleep(0.2)
    raise AssertionError(f"{base}: not every server came up")


def served(gateway: Gateway, method: str) -> float:
    """How many `method` requests this replica counted."""
    text = httpx2.get(f"{gateway.base}/metrics", timeout=5).text
    pattern = rf'^manifold_downstream_requests_total\{{[^}}]*method="{re.escape(method)}"[^}}]*\}} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


async def test_a_2025_session_is_served_by_every_replica_behind_round_robin(cluster: Cluster) -> None:
    before = cluster.calls()
    async with connect(cluster.url, LEGACY) as client:
        for i in range(12):
            result = await client.call("fx__echo", {"text": f"n{i}"})
            assert not result.is_error and result.content[0].text == f"n{i}"
        assert "fx__echo" in await client.tool_names()
        await client.session.send_ping()
    calls = [after - b for after, b in zip(cluster.calls(), before, strict=True)]
    assert all(n >= 2 for n in calls), f"every replica served calls of the one session: {calls}"
    assert sum(calls) == 12, "each call ran once"


async def test_a_session_whose_client_can_be_asked_moves_between_replicas(cluster: Cluster) -> None:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": "x"})

    before = sum(cluster.calls())
    async with connect(cluster.url, LEGACY, elicitation_callback=elicit) as client:
        for i in range(6):
            result = await client.call("fx__echo", {"text": f"asked{i}"})
            assert not result.is_error and result.content[0].text == f"asked{i}"
    assert sum(cluster.calls()) - before == 6


async def test_the_session_outlives_the_replica_that_opened_it(tmp_path: Path, redis: RedisServer) -> None:
    with replicas(tmp_path, redis) as (gateways, url):
        async with connect(url, LEGACY) as client:
            await client.call("fx__echo", {"text": "before"})
            opened_on = max(gateways, key=lambda gw: served(gw, "initialize"))
            os.killpg(opened_on.proc.pid, signal.SIGKILL)
            opened_on.proc.wait(5)
            time.sleep(0.8)  # HAProxy's health check (every 300 ms) takes it out
            for i in range(6):
                result = await client.call("fx__echo", {"text": f"after{i}"})
                assert not result.is_error and result.content[0].text == f"after{i}"
            survivors = [gw for gw in gateways if gw is not opened_on]
            assert sum(served(gw, "tools/call") for gw in survivors) >= 6


async def test_a_delete_on_one_replica_ends_the_session_on_all(cluster: Cluster) -> None:
    gateways = cluster.gateways
    first, second = gateways[0], gateways[1]
    opened = httpx2.post(first.url, json=initialize_body(LEGACY), headers=ACCEPT, timeout=10)
    session = opened.headers["mcp-session-id"]
    headers = {**ACCEPT, "mcp-session-id": session, "mcp-protocol-version": LEGACY}
    notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx2.post(first.url, json=notice, headers=headers, timeout=10).status_code == 202
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert "fx__echo" in httpx2.post(second.url, json=listing, headers=headers, timeout=10).text
    assert httpx2.delete(first.url, headers=headers, timeout=10).status_code == 200
    after = httpx2.post(second.url, json=listing, headers=headers, timeout=10)
    assert after.status_code == 404, "the replica that served the session still serves it right after its DELETE"
    third = httpx2.post(gateways[2].url, json=listing, headers=headers, timeout=10)
    assert third.status_code == 404, "a replica that never saw the session finds no record of it either"


async def test_another_callers_session_is_unknown_on_every_replica(tmp_path: Path, redis: RedisServer) -> None:
    config: dict[str, Any] = {
        "store": f"redis://127.0.0.1:{redis.port}/0",
        "servers": {"fx": stdio_spec()},
        "auth": {"tokens": [{"name": "alice", "token": "a" * 32}, {"name": "bob", "token": "b" * 32}]},
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with run_gateway(tmp_path / "a", config) as one, run_gateway(tmp_path / "b", config) as two:
        alice = {**ACCEPT, "authorization": "Bearer " + "a" * 32}
        opened = httpx2.post(one.url, json=initialize_body(LEGACY), headers=alice, timeout=10)
        session = opened.headers["mcp-session-id"]
        bob = {**ACCEPT, "authorization": "Bearer " + "b" * 32, "mcp-session-id": session}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        refused = httpx2.post(two.url, json=listing, headers={**bob, "mcp-protocol-version": LEGACY}, timeout=10)
        assert refused.status_code == 404 and "Session not found" in refused.text
        own = {**alice, "mcp-session-id": session, "mcp-protocol-version": LEGACY}
        assert httpx2.post(two.url, json=listing, headers=own, timeout=10).status_code == 200


async def test_a_corrupt_session_row_is_no_session_and_harms_nothing_else(cluster: Cluster) -> None:
    gateways, url = cluster.gateways, cluster.url
    subprocess.run(
        ["redis-cli", "-p", str(cluster.redis.port), "set", "manifold:session:broken", "\xff{not json"],
        check=True,
    )
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    headers = {**ACCEPT, "mcp-session-id": "broken", "mcp-protocol-version": LEGACY}
    for gw in gateways:
        assert httpx2.post(gw.url, json=listing, headers=headers, timeout=10).status_code == 404
    async with connect(url, LEGACY) as client:
        assert (await client.call("fx__echo", {"text": "fine"})).content[0].text == "fine"


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # logging/setLevel: 2025 only
async def test_the_log_level_a_client_sets_holds_on_every_replica(cluster: Cluster) -> None:
    lines: list[Any] = []

    async def on_log(params: Any) -> None:
        lines.append(params)

    before = sum(cluster.calls())
    async with connect(cluster.url, LEGACY, logging_callback=on_log) as client:
        await client.session.set_logging_level("error")
        for _ in range(6):
            await client.call("test_tool_with_logging", {})
        assert lines == [], "info lines are below the level the client set, whichever replica served the call"
        await client.session.set_logging_level("debug")
        for _ in range(6):
            await client.call("test_tool_with_logging", {})
    assert len(lines) == 18 and {line.level for line in lines} == {"info"}, "three lines of each call"
    assert sum(cluster.calls()) - before == 12


async def test_a_servers_question_is_answered_whichever_replica_the_answer_reaches(cluster: Cluster) -> None:
    """The client's answer is a POST of its own that round robin sends elsewhere: it is passed to the replica that
    asked, so elicitation and sampling complete through three replicas."""
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append("sampling")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="m"
        )

    before = sum(cluster.calls())
    async with connect(cluster.url, LEGACY, elicitation_callback=elicit, sampling_callback=sample) as client:
        for _ in range(3):
            elicited = await client.call("test_elicitation", {"message": "who are you?"})
            assert not elicited.is_error and "ada" in elicited.content[0].text
            sampled = await client.call("test_sampling", {"prompt": "the answer?"})
            assert not sampled.is_error and "forty-two" in sampled.content[0].text
    assert asked == ["elicitation", "sampling"] * 3, "each question asked once and answered once"
    assert sum(cluster.calls()) - before == 6


async def test_two_replicas_asking_one_client_at_once_each_get_their_own_answer(cluster: Cluster) -> None:
    """Two calls of one session on two replicas both ask the client something, and both questions are out at
    once: each replica numbers its questions from a random point, so neither takes the other's answer."""
    asked: list[str] = []
    both = anyio.Event()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if len(asked) == 2:
            both.set()
        with anyio.fail_after(10):
            await both.wait()  # answer only once the other question is out too
        return types.ElicitResult(action="accept", content={"username": params.message, "email": "a@example.com"})

    before = cluster.calls()
    async with connect(cluster.url, LEGACY, elicitation_callback=elicit) as client:
        results: dict[str, str] = {}

        async def call(who: str) -> None:
            result = await client.call("test_elicitation", {"message": who})
            assert not result.is_error, result
            results[who] = result.content[0].text

        async with anyio.create_task_group() as group:
            group.start_soon(call, "first")
            await anyio.sleep(0.05)
            group.start_soon(call, "second")
    assert sorted(asked) == ["first", "second"]
    for who, text in results.items():
        assert f'"username": "{who}"' in text, f"the {who} call got another's answer: {text}"
    spread = [after - b for after, b in zip(cluster.calls(), before, strict=True)]
    assert sorted(spread)[-1] == 1, f"the two calls were served by two replicas: {spread}"


def test_tasks_list_lists_the_callers_tasks_on_every_replica(tmp_path: Path, redis: RedisServer) -> None:
    """A 2025-era session's tasks, begun on two replicas, are all listed by `tasks/list` on either (each replica
    adds the others' to its own), and another session's listing stays empty."""
    from tests.integration.test_everything import everything_spec

    with replicas(tmp_path, redis, count=2, servers={"everything": everything_spec("stdio", None)}) as (gws, _):
        first, second = gws

        def session() -> dict[str, str]:
            opened = httpx2.post(first.url, json=initialize_body(LEGACY), headers=ACCEPT, timeout=10)
            headers = {**ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
            notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert httpx2.post(first.url, json=notice, headers=headers, timeout=10).status_code == 202
            return headers

        def post(gateway: Gateway, headers: dict[str, str], method: str, params: dict[str, Any]) -> dict[str, Any]:
            body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
            answer = _answer(httpx2.post(gateway.url, json=body, headers=headers, timeout=30))
            assert "result" in answer, answer
            return dict(answer["result"])

        mine, theirs = session(), session()
        call = {
            "name": "everything__simulate-research-query",
            "arguments": {"topic": "python", "ambiguous": False},
            "task": {"ttl": 60000},
        }
        begun = {post(gw, mine, "tools/call", call)["task"]["taskId"] for gw in (first, second)}
        assert len(begun) == 2
        for gateway in (first, second):
            listed = post(gateway, mine, "tasks/list", {})
            assert {t["taskId"] for t in listed["tasks"]} == begun, "each replica lists the tasks of both"
            assert post(gateway, theirs, "tasks/list", {})["tasks"] == []


def test_the_tools_a_search_revealed_to_a_session_are_listed_on_every_replica(
    tmp_path: Path, redis: RedisServer
) -> None:
    """With deferred exposure a 2025-era session's listing grows by what its searches found: a search served by one
    replica grows the listing every replica serves it."""
    with replicas(tmp_path, redis, count=2, settings={"exposure": "deferred"}) as (gateways, _):
        first, second = gateways
        opened = httpx2.post(first.url, json=initialize_body(LEGACY), headers=ACCEPT, timeout=10)
        headers = {**ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
        notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert httpx2.post(first.url, json=notice, headers=headers, timeout=10).status_code == 202

        def listed(gateway: Gateway) -> set[str]:
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            reply = httpx2.post(gateway.url, json=listing, headers=headers, timeout=10)
            return {t["name"] for t in _answer(reply)["result"]["tools"]}

        assert "fx__echo" not in listed(second)
        search = {"name": "manifold__search_tools", "arguments": {"query": "echo the text back", "limit": 1}}
        found = httpx2.post(
            first.url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": search}, headers=headers
        )
        assert [t["name"] for t in _answer(found)["result"]["structuredContent"]["tools"]] == ["fx__echo"]
        assert "fx__echo" in listed(second), "the other replica lists what the search revealed"
        assert "fx__echo" in listed(first)


def _answer(reply: Any) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, whether it came as JSON or as one server-sent event."""
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in reply.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(next(d for d in data if d)))
    return dict(reply.json())


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # resources/subscribe is handshake-era only
async def test_a_subscription_made_on_one_replica_is_served_on_the_stream_another_holds(cluster: Cluster) -> None:
    """The subscribe request, the session's GET stream and the call that changes the resource each reach a
    replica round robin: the replica holding the stream learns of the subscription from the store, follows the
    resource upstream and tells the client. (Another replica that served the session through its SDK may tell it
    too: a notice can arrive twice, never not at all.)"""
    watched = "test://watched-resource"
    seen: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            seen.append(str(message.params.uri))

    for _ in range(3):  # three sessions: the requests fall on the replicas in different orders
        seen.clear()

        async with Client(cluster.url, mode="legacy", cache=None, message_handler=on_message) as client:
            await client.session.subscribe_resource(watched)
            # The stream's replica follows the subscription upstream once it has heard of it from the store; a
            # change made before that is not replayed (no shared event store), so the change is made again.
            with anyio.fail_after(10):
                while not seen:
                    await client.call_tool("test_update_watched_resource", {})
                    with anyio.move_on_after(1):
                        while not seen:
                            await anyio.sleep(0.02)
        assert set(seen) == {watched}


def test_a_held_call_is_resumed_on_any_replica_and_ends_clearly_when_its_replica_dies(
    tmp_path: Path, redis: RedisServer
) -> None:
    """A 2026-era caller's call to a 2025-era server that asks something is held open on the replica it reached;
    the retry with the answer, sent to another replica, is handed to that one. Once it is dead, the retry says so."""
    from bench.mcphttp import (
        CLIENT_INFO,
        META_CAPABILITIES,
        META_CLIENT_INFO,
        META_VERSION,
        MODERN,
        Connection,
        Endpoint,
        Session,
    )

    meta = {META_VERSION: MODERN, META_CLIENT_INFO: CLIENT_INFO, META_CAPABILITIES: {"elicitation": {}}}
    session = Session(MODERN, {"MCP-Protocol-Version": MODERN}, meta)
    args = {"name": "old__test_elicitation", "arguments": {"message": "who are you?"}}
    answer = {"action": "accept", "content": {"username": "ada", "email": "ada@example.com"}}
    with running_fixture() as fixture:
        old = {"url": fixture, "protocol": "2025-11-25"}
        with replicas(tmp_path, redis, count=2, servers={"old": old}) as (gateways, _):
            holder, other = (Connection(Endpoint.parse(gw.url)) for gw in gateways)
            for conn in (holder, other):
                deadline = time.monotonic() + 20
                while "old__test_elicitation" not in {t["name"] for t in conn.request(session, "tools/list")["tools"]}:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)

            def held() -> dict[str, Any]:
                first = holder.request(session, "tools/call", args)
                assert first["resultType"] == "input_required", first
                [(key, asked)] = first["inputRequests"].items()
                assert asked["method"] == "elicitation/create"
                return {**args, "inputResponses": {key: answer}, "requestState": first["requestState"]}

            calls = served(gateways[0], "tools/call")
            resumed = other.request(session, "tools/call", held())
            assert resumed.get("isError") is not True, resumed
            assert resumed["content"][0]["text"] == (
                'User response: action=accept, content={"email": "ada@example.com", "username": "ada"}'
            )
            assert served(gateways[0], "tools/call") == calls + 2, "the holder served the call and its retry"

            retry = held()
            os.killpg(gateways[0].proc.pid, signal.SIGKILL)
            gateways[0].proc.wait(5)
            gone = other.request(session, "tools/call", retry)
            assert gone["isError"] is True and gone["resultType"] == "complete"
            assert (
                "old__test_elicitation: the gateway replica that held this call is gone" in gone["content"][0]["text"]
            )
            assert "the call may have run" in gone["content"][0]["text"]
            holder.close()
            other.close()


def test_a_conversations_instances_live_on_one_replica_and_move_when_it_dies(
    tmp_path: Path, redis: RedisServer
) -> None:
    """`isolation: conversation`: the conversation's requests to such a server are served by the replica that
    first served one (the others hand them over), so the conversation has one instance, not one per replica;
    once that replica is gone, the next one that serves the conversation starts its instance afresh."""
    from bench.mcphttp import (
        CLIENT_INFO,
        META_CAPABILITIES,
        META_CLIENT_INFO,
        META_VERSION,
        MODERN,
        Connection,
        Endpoint,
        Session,
        open_session,
    )

    meta = {META_VERSION: MODERN, META_CLIENT_INFO: CLIENT_INFO, META_CAPABILITIES: {}, "manifold/conversation": "c1"}
    session = Session(MODERN, {"MCP-Protocol-Version": MODERN}, meta)
    iso = {**stdio_spec(), "isolation": "conversation"}
    with replicas(tmp_path, redis, count=2, servers={"iso": iso}) as (gateways, _):
        first, second = (Connection(Endpoint.parse(gw.url)) for gw in gateways)

        def count(conn: Connection, caller: Session = session) -> str:
            result = conn.request(caller, "tools/call", {"name": "iso__count", "arguments": {}})
            assert result.get("isError") is not True, result
            return str(result["content"][0]["text"])

        assert [count(first), count(second), count(first), count(second)] == ["1", "2", "3", "4"]
        legacy = open_session(second, LEGACY)  # a 2025-era session is a conversation of its own
        assert [count(c, legacy) for c in (second, first, second, first)] == ["1", "2", "3", "4"]
        os.killpg(gateways[0].proc.pid, signal.SIGKILL)
        gateways[0].proc.wait(5)
        assert [count(second), count(second)] == ["1", "2"], "a new instance on the replica that took it over"
        first.close()
        second.close()


# What a client is told of a request that was cut off when its replica died: by the replica that held it, by
# HAProxy's 502 (`http-error` above), or by the SDK's own transport when the answer's stream was cut mid-way.
INTERRUPTED = ("the call may have run", "SSE stream ended without a response", "SSE stream failed")


@dataclass
class Outcome:
    """One request of the chaos test, as its client saw it."""

    client: str
    started: float
    ended: float
    kind: str  # ok | interrupted | failed
    detail: str = ""


def _outcome(
    client: str, started: float, result: Any = None, error: BaseException | None = None, want: str = ""
) -> Outcome:
    ended = time.monotonic()
    if error is not None:
        text = str(error)
        kind = "interrupted" if any(s in text for s in INTERRUPTED) else "failed"
        return Outcome(client, started, ended, kind, f"{type(error).__name__}: {text}")
    text = " ".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        return Outcome(client, started, ended, "interrupted" if INTERRUPTED[0] in text else "failed", text)
    return Outcome(client, started, ended, "ok" if want in text else "failed", text)


def _left_held_by_the_kill(o: Outcome, outcomes: list[Outcome], killed: float) -> bool:
    """A held call whose retry was cut off with the killed replica stays held on its holder until the server's
    timeout (README: a held call nobody comes back for). Until then the 2025-era server's questions there cannot
    be told apart from a new call's, and the server is told so (README: when calls of several clients are in
    flight at once, the server gets an error). Only that refusal, only after such a cut, is expected."""
    cut = any(h.client == "held" and h.kind == "interrupted" and h.ended > killed - 1 for h in outcomes)
    ambiguous = "calls of several clients are in flight" in o.detail
    return cut and ambiguous and o.client == "held" and o.started > killed - 1


@pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")  # resources/subscribe is handshake-era only
async def test_mixed_clients_go_on_while_a_replica_is_killed_and_restarted(tmp_path: Path, redis: RedisServer) -> None:
    """2025-era sessions, 2026-era callers, a held elicitation, tasks and a subscription run through HAProxy and
    three replicas while one replica is SIGKILLed and later started again. Every client goes on; a request cut
    off by the death is told it may have run; nothing else fails (a lost session would: its requests would be
    refused as of an unknown session); nothing runs twice."""
    from tests.integration.test_conformance_fixture import TasksClient

    outcomes: list[Outcome] = []
    notices: list[tuple[float, float | None]] = []  # (change made, notice heard) for the subscription
    stop, streaming, begin = anyio.Event(), anyio.Event(), anyio.Event()
    moments: dict[str, float] = {}

    async def calls(name: str, era: str) -> None:
        """Alternate a call that is not idempotent (counted upstream) and one slow enough to be cut off."""
        async with connect(url, era) as client:
            n = 0
            while not stop.is_set():
                n += 1
                tool, args, want = ("shared__tick", {}, "") if n % 2 else ("shared__slow", {"seconds": 0.4}, "slept")
                started = time.monotonic()
                try:
                    outcome = _outcome(name, started, await client.call(tool, args), want=want)
                except Exception as error:
                    outcome = _outcome(name, started, error=error)
                outcomes.append(outcome)
                if tool == "shared__tick":
                    ticks.append(outcome)
                await anyio.sleep(0.02)

    async def held() -> None:
        async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            await anyio.sleep(0.3)  # the question is out a while: the holder may die before it is answered
            return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

        async with connect(url, MODERN, elicitation_callback=elicit) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    result = await client.call("old__test_elicitation", {"message": "who are you?"})
                    outcomes.append(_outcome("held", started, result, want="ada@example.com"))
                except Exception as error:
                    outcomes.append(_outcome("held", started, error=error))

    async def tasks() -> None:
        async with Client(url, cache=None, extensions=[TasksClient()]) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    result = await client.call_tool("slow_compute", {"seconds": 0.5, "label": "chaos"})
                    outcomes.append(_outcome("task", started, result, want="(chaos)"))
                except Exception as error:
                    outcomes.append(_outcome("task", started, error=error))

    async def subscription() -> None:
        heard = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                heard.set()

        async with Client(url, mode="legacy", cache=None, message_handler=on_message) as client:
            await client.session.subscribe_resource("test://watched-resource")
            await anyio.sleep(0.3)
            streaming.set()
            await begin.wait()
            while not stop.is_set():
                heard = anyio.Event()
                changed = time.monotonic()
                started = changed
                try:
                    outcomes.append(
                        _outcome("subscriber", started, await client.call_tool("test_update_watched_resource", {}))
                    )
                except Exception as error:
                    outcomes.append(_outcome("subscriber", started, error=error))
                # Not longer: after a change the kill left unheard, the next must start before the restart.
                with anyio.move_on_after(2):
                    await heard.wait()
                notices.append((changed, time.monotonic() if heard.is_set() else None))
                await anyio.sleep(0.2)

    ticks: list[Outcome] = []
    with ExitStack() as stack:
        shared = stack.enter_context(run_http_fixture())
        conformance = stack.enter_context(running_fixture())
        servers = {
            "shared": {"url": shared.url},  # one upstream process behind every replica: it counts every run
            "conf": {"url": conformance, "prefix": "", "trusted": True},
            "old": {"url": conformance, "protocol": LEGACY},  # 2025-era: a 2026 caller's question to it is held
        }
        # Replicas that close idle connections after 5 s leave only the GET stream's open, which tells its replica.
        settings = {"keep_alive_timeout": 5}
        gateways, url = stack.enter_context(replicas(tmp_path, redis, servers=servers, settings=settings))
        async with anyio.create_task_group() as group:
            group.start_soon(subscription)
            await streaming.wait()
            victim = await anyio.to_thread.run_sync(_streaming_to, gateways)  # the hardest case: its stream dies
            begin.set()
            for i in range(2):
                group.start_soon(calls, f"legacy{i}", LEGACY)
                group.start_soon(calls, f"modern{i}", MODERN)
            group.start_soon(held)
            group.start_soon(tasks)
            await anyio.sleep(4)
            os.killpg(victim.proc.pid, signal.SIGKILL)
            moments["killed"] = time.monotonic()
            await anyio.sleep(4)
            port = int(victim.base.rsplit(":", 1)[1])
            config = replica_config(redis, servers)
            (tmp_path / "again").mkdir()
            again = await anyio.to_thread.run_sync(
                lambda: stack.enter_context(run_gateway(tmp_path / "again", config, port=port))
            )
            await anyio.to_thread.run_sync(_wait_up, again.base)
            moments["restarted"] = time.monotonic()
            await anyio.sleep(5)
            stop.set()

        killed, restarted = moments["killed"], moments["restarted"]
        failed = [o for o in outcomes if o.kind == "failed" and not _left_held_by_the_kill(o, outcomes, killed)]
        assert not failed, "\n".join(f"{o.client}: {o.detail}" for o in failed)
        for o in outcomes:
            if o.kind == "interrupted":
                assert o.started < killed + 1 and o.ended > killed, (
                    f"{o.client} was told 'may have run' outside the kill: {o}"
                )
        for client in sorted({o.client for o in outcomes}):
            mine = [o for o in outcomes if o.client == client and o.kind == "ok"]
            assert any(o.ended < killed for o in mine), f"{client}: nothing went through before the kill"
            assert any(killed + 1 < o.started < restarted for o in mine), (
                f"{client}: nothing went through on two replicas"
            )
            assert any(o.started > restarted for o in mine), f"{client}: nothing went through after the restart"
        missed = [changed for changed, heard in notices if heard is None]
        assert all(killed - 1 < changed < killed + 3 for changed in missed), "a change went unheard outside the kill"
        assert sum(1 for _, heard in notices if heard is not None and heard > restarted) >= 2
        assert served(again, "tools/call") > 0, "the restarted replica took its share"
        ok = sum(1 for o in ticks if o.kind == "ok")
        cut = sum(1 for o in ticks if o.kind == "interrupted")
        async with connect(url, MODERN) as counter:
            ran = int((await counter.call("shared__ticks", {})).content[0].text)
        assert ok <= ran <= ok + cut, (
            f"{ok} ticks answered, {cut} cut off, {ran} ran upstream: a call ran twice or was lost"
        )


def _streaming_to(gateways: list[Gateway]) -> Gateway:
    """The one replica with a connection open while nothing but a GET stream is (each replica closes the others
    once idle for its `keep_alive_timeout`), read from the kernel's table of TCP sockets."""
    ports = {int(gw.base.rsplit(":", 1)[1]): gw for gw in gateways}
    deadline = time.monotonic() + 10
    while True:
        established = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "01" and int(local.split(":")[1], 16) in ports:  # 01: ESTABLISHED
                established.add(int(local.split(":")[1], 16))
        if len(established) == 1:
            return ports[established.pop()]
        assert time.monotonic() < deadline, f"no one replica holds the stream: {sorted(established)}"
        time.sleep(0.05)


@pytest.mark.skipif(not suite_available(), reason="conformance suite / Node 22 not installed")
def test_the_conformance_suite_passes_through_three_replicas(tmp_path: Path, cluster: Cluster) -> None:
    """All three requirement sets through HAProxy and three replicas, as through one gateway: every scenario
    passes, the scored ones and the others (the tasks extension's among them: a request about a task that reaches
    another replica is handed to the one that holds it)."""
    for requirements in ("2025-11-25", "2026-07-28", "2025-06-18"):
        result = run_suite(cluster.url, requirements, tmp_path / requirements, timeout=180)
        scored, _ = requirement_set(requirements)
        assert len(result.scored) == len(scored) and result.ok, result.table(verbose=True)
        assert all(o.passed for o in result.scenarios), result.table(verbose=True)
