"""Integration harness: the gateway as a real process on loopback, and real SDK clients of both eras."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.fixtures.forkserver import Process, spawn
from tests.fixtures.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
THIRDPARTY = ROOT / "tests" / "thirdparty" / "node_modules" / "@modelcontextprotocol"
ERAS = ["2026-07-28", "2025-11-25"]
LOG_JSON = ("--log-format", "json")


# The files whose tests need the corpus, which `make test` installs beside the first tests (`tests/corpus`).
NEED_THE_CORPUS = ("test_corpus.py", "test_sandbox.py")
# Seconds the longest files of this folder took in `make test` (the sums of `--durations=0`, 2 workers). Only the
# order in which the workers take the files depends on them: a stale figure costs time, never a result.
LONGEST = {
    "test_replicas.py": 156,
    "test_resilience.py": 143,
    "test_admin.py": 77,
    "test_pins.py": 70,
    "test_workers.py": 70,
    "test_security.py": 68,
    "test_conformance.py": 51,
    "test_handover.py": 51,
    "test_deferred.py": 47,
    "test_everything.py": 46,
    "test_oauth_upstream.py": 45,
    "test_tracing.py": 37,
    "test_reference_server.py": 33,
    "test_gateway.py": 32,
}


def _turn(item: pytest.Item) -> tuple[int, int]:
    name = item.nodeid.partition("::")[0].removeprefix("tests/integration/")
    if name in NEED_THE_CORPUS:
        return 1, 0
    seconds = LONGEST.get(name, 0)
    return (0, -seconds) if seconds else (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, longest to shortest, so the last to finish is a short one; then the corpus's
    (installed by then, so no worker waits for it); then the rest in their order. `make test` turns xdist's
    own order (by number of tests) off."""
    items.sort(key=_turn)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Gateway:
    """A running gateway process."""

    url: str
    base: str
    proc: Process
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events

    def logged(self, event: str, **fields: Any) -> bool:
        """Whether the gateway has logged `event` with these field values."""
        return any(e.get("event") == event and all(e.get(k) == v for k, v in fields.items()) for e in self.log_events())


def write_config(tmp_path: Path, config: dict[str, Any] | str, name: str = "manifold.yaml") -> Path:
    path = tmp_path / name
    if isinstance(config, str):
        path.write_text(config)
    elif name.endswith(".json"):
        path.write_text(json.dumps(config))
    else:
        path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def run_gateway(
    tmp_path: Path,
    config: dict[str, Any] | str,
    *,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    config_name: str = "manifold.yaml",
    port: int | None = None,
) -> Iterator[Gateway]:
    """Start `python -m gateway serve` on `port` (default: a free one; forked from the fork server, see
    `tests.fixtures.forkserver`); stop it (and check it exits) afterwards."""
    path = write_config(tmp_path, config, config_name)
    port = port or free_port()
    log_path = tmp_path / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        proc = spawn(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port), *LOG_JSON, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    base = f"http://127.0.0.1:{port}"
    gateway = Gateway(f"{base}/mcp", base, proc, log_path)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"gateway exited with {proc.returncode}:\n{gateway.log()}")
            try:
                if httpx2.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway did not come up:\n{gateway.log()}")
            time.sleep(0.1)
        yield gateway
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


class EraClient:
    """One downstream client of either era, with the calls the tests need."""

    def __init__(self, session: ClientSession, client: Client | None = None) -> None:
        self.session = session
        self.client = client

    async def tool_names(self) -> list[str]:
        return [t.name for t in (await self.session.list_tools()).tools]

    async def raw_tools(self) -> list[dict[str, Any]]:
        result = await self.session.list_tools()
        return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in result.tools]

    async def call(self, name: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if self.client is not None:  # the high-level client also drives 2026-era input_required rounds
            return await self.client.call_tool(name, arguments or {}, **kwargs)
        return await self.session.call_tool(name, arguments or {}, **kwargs)

    async def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float = 20) -> list[str]:
        """Poll tools/list until `predicate(names)` holds."""
        names: list[str] = []
        with anyio.move_on_after(timeout):
            while True:
                names = await self.tool_names()
                if predicate(names):
                    return names
                await anyio.sleep(0.2)
        raise AssertionError(f"tools never matched; last listing: {names}")


@asynccontextmanager
async def connect(
    url: str, era: str, *, headers: dict[str, str] | None = None, **session_kwargs: Any
) -> AsyncIterator[EraClient]:
    """An SDK client of the given era (`Client` in 2026-07-28 mode, or `ClientSession.initialize()`)."""
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(headers=headers or {}, timeout=timeout) as http:
        if era == "2026-07-28":
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="2026-07-28", cache=None, **session_kwargs) as client:
                assert client.session.protocol_version == era
                yield EraClient(client.session, client)
        else:
            async with (
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write, **session_kwargs) as s,
            ):
                await s.initialize()
                assert s.protocol_version == era
                yield EraClient(s)


async def wait_until(predicate: Callable[[], bool], timeout: float = 15, what: str = "condition") -> None:
    """Poll `predicate` until it holds, or fail naming `what`."""
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
        return
    raise AssertionError(f"timed out waiting for {what}")


def initialize_body(version: str = "2025-11-25") -> dict[str, Any]:
    """A raw `initialize` request."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }


class Changes:
    """Counts `tools/list_changed` notices a downstream client receives."""

    def __init__(self) -> None:
        self.count = 0
        self._event = anyio.Event()

    def bump(self) -> None:
        self.count += 1
        self._event.set()
        self._event = anyio.Event()

    async def wait_beyond(self, seen: int, timeout: float = 20) -> int:
        """Wait until more than `seen` notices arrived; return the count."""
        with anyio.fail_after(timeout):
            while self.count <= seen:
                await self._event.wait()
        return self.count


@asynccontextmanager
async def watch_changes(
    url: str, era: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[EraClient, Changes]]:
    """A client of `era` plus a counter of the list_changed notices it receives, in its era's way."""
    from mcp.client.subscriptions import listen
    from mcp.types import ToolListChangedNotification

    changes = Changes()

    async def on_message(message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            changes.bump()

    if era == "2025-11-25":
        async with connect(url, era, headers=headers, message_handler=on_message) as client:
            yield client, changes
        return
    async with connect(url, era, headers=headers) as client, anyio.create_task_group() as tg:
        subscribed = anyio.Event()

        async def listener() -> None:
            async with listen(client.session, tools_list_changed=True) as subscription:
                subscribed.set()
                async for _ in subscription:
                    changes.bump()

        tg.start_soon(listener)
        with anyio.fail_after(10):
            await subscribed.wait()
        yield client, changes
        tg.cancel_scope.cancel()


def upstream_pids(gateway: Gateway, server: str) -> list[int]:
    """PIDs of the stdio processes the gateway started for `server`, oldest first."""
    return [
        e["pid"]
        for e in gateway.log_events()
        if e.get("event") == "upstream process started" and e.get("server") == server
    ]


def server_process(pid: int) -> int:
    """The process a stdio server's command runs as: `pid` itself or, under its sandbox (bwrap), its innermost
    descendant (as a crash would kill it, rather than the sandbox around it)."""
    while True:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return pid
        if not children:
            return pid
        pid = int(children[0])


def own_pid(pid: int) -> int:
    """The pid a process sees for itself (inside its sandbox's PID namespace, if it has one)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


REDIS = shutil.which("redis-server")


class RedisServer:
    """A real redis-server on loopback that can be stopped and started again on the same port and data."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS is not None
        self.proc = subprocess.Popen(
            [
                REDIS,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "1 1",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while (
            subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() != b"PONG"
        ):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)  # saves the data set first
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
