"""The registry in-process, with real stdio fixture servers: changes are serialised, a removal before the
owner task ran still stops it, and a failing catalog listener ends nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from gateway.admin.servers import Runtime, RuntimeError_
from gateway.config.servers import ServerSpec, parse_server
from gateway.config.settings import Settings
from gateway.core.registry import NameTaken, Registry
from gateway.protocol.errors import State
from gateway.store.sqlite import SqliteStore
from tests.fixtures.servers import stdio_spec

pytestmark = pytest.mark.anyio
RUNTIME_STDIO = Settings.model_validate({"runtime": {"stdio": True}})  # stdio runtime servers allowed


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spec(name: str, **options: Any) -> ServerSpec:
    problems: list[str] = []
    parsed = parse_server(name, options or stdio_spec(), "server", problems)
    assert parsed is not None, problems
    return parsed


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line mentions `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@asynccontextmanager
async def running(registry: Registry) -> AsyncIterator[Registry]:
    with anyio.fail_after(60):
        async with registry.running():
            yield registry


async def slow_broadcast() -> None:
    """A listener that takes a while, as telling many downstream clients does."""
    await anyio.sleep(0.3)


async def test_a_failing_listener_is_logged_and_the_others_are_still_told() -> None:
    told: list[int] = []

    async def broken() -> None:
        raise RuntimeError("boom")

    async def counting() -> None:
        told.append(1)

    registry = Registry([spec("fx")])
    registry.on_catalog_change(broken)
    registry.on_catalog_change(counting)
    with capture_logs() as logs:
        async with running(registry):
            assert await registry.upstreams["fx"].wait_up(20), "the upstream's owner task survives the listener"
            await anyio.sleep(0.2)
            assert registry.upstreams["fx"].state is State.UP
            assert told == [1]
            assert await registry.remove("fx")  # the change's caller is not hurt either
            assert told == [1, 1]
    failures = [e for e in logs if e["event"] == "catalog change listener failed"]
    assert len(failures) == 2
    assert "broken" in failures[0]["listener"] and failures[0]["reason"] == "RuntimeError: boom"


async def test_replace_and_a_concurrent_add_of_the_same_name() -> None:
    registry = Registry([spec("fx")])
    registry.on_catalog_change(slow_broadcast)
    replaced = anyio.Event()
    outcome: dict[str, Any] = {}
    changed = spec("fx", **stdio_spec(), deny=["echo"])

    async def replace() -> None:
        outcome["replaced"] = await registry.replace(changed, "config")
        replaced.set()

    async def add_when_free() -> None:
        """An add arriving the moment the name looks free (or once the replace is over)."""
        while "fx" in registry.upstreams and not replaced.is_set():
            await anyio.sleep(0.001)
        try:
            outcome["added"] = await registry.add(spec("fx"), "runtime")
        except KeyError as e:
            outcome["add_refused"] = e

    async with running(registry):
        assert await registry.upstreams["fx"].wait_up(20)
        async with anyio.create_task_group() as tg:
            tg.start_soon(replace)
            tg.start_soon(add_when_free)
        assert isinstance(outcome.get("add_refused"), NameTaken), "the name was never free"
        fx = registry.upstreams["fx"]
        assert fx is outcome["replaced"] and fx.spec == changed and fx.source == "config"
        assert await fx.wait_up(20)
        assert "fx__echo" not in registry.catalog.entries and "fx__add" in registry.catalog.entries


async def test_remove_right_after_add_stops_the_server_before_it_starts() -> None:
    marker = f"never-started-{uuid.uuid4().hex}"
    registry = Registry([])
    async with running(registry):
        upstream = await registry.add(spec("early", **stdio_spec("normal", "--name", marker)), "runtime")
        assert await registry.remove("early")  # before its owner task had a chance to run
        with anyio.fail_after(5):
            await upstream.stopped.wait()
        await anyio.sleep(0.5)
        assert "early" not in registry.upstreams
        assert upstream.state is State.CONNECTING, "it never connected"
        assert processes_with(marker) == [], "no process was started for the removed server"


async def test_remove_of_another_source_changes_nothing() -> None:
    registry = Registry([spec("fx")])
    async with running(registry):
        assert not await registry.remove("fx", source="runtime")
        assert not await registry.remove("nosuch")
        assert "fx" in registry.upstreams
        with pytest.raises(NameTaken):
            await registry.replace(spec("fx"), "runtime", replacing="runtime")
        assert registry.upstreams["fx"].source == "config"


async def test_reload_racing_a_runtime_add_of_the_same_name(tmp_path: Path) -> None:
    registry = Registry([spec("fx")])
    registry.on_catalog_change(slow_broadcast)
    store = SqliteStore(str(tmp_path / "servers.db"))
    await store.start()
    runtime = Runtime(registry, store, RUNTIME_STDIO)
    reloaded = anyio.Event()
    answers: list[int] = []
    changed = spec("fx", **stdio_spec(), deny=["echo"])

    async def reload() -> None:
        await registry.apply_config([changed])
        reloaded.set()

    async def keep_adding() -> None:
        """An admin adding `fx` again and again while the reload runs, and once after."""
        while True:
            done = reloaded.is_set()
            try:
                await runtime.add({"name": "fx", **stdio_spec()})
                answers.append(201)
            except RuntimeError_ as e:
                answers.append(e.status)
            if done:
                return
            await anyio.sleep(0.005)

    async with running(registry):
        assert await registry.upstreams["fx"].wait_up(20)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reload)
            tg.start_soon(keep_adding)
        assert set(answers) == {409}, "the file's server held the name throughout"
        fx = registry.upstreams["fx"]
        assert fx.spec == changed and fx.source == "config"
        assert (await store.load()).servers == {}, "no stored row was left behind"
        assert await fx.wait_up(20)


def stubborn_spec() -> dict[str, Any]:
    """The stdio fixture under a shell that outlives it: stopping takes the 2 s until SIGTERM."""
    base = stdio_spec()
    script = '"$@"; exec sleep 30'
    return {"command": "/bin/sh", "args": ["-c", script, "sh", base["command"], *base["args"]]}


async def test_a_runtime_add_waits_for_a_reload_that_takes_its_name(tmp_path: Path) -> None:
    registry = Registry([spec("old", **stubborn_spec())])
    store = SqliteStore(str(tmp_path / "servers.db"))
    await store.start()
    runtime = Runtime(registry, store, RUNTIME_STDIO)
    answers: list[int] = []

    async def add() -> None:
        try:
            await runtime.add({"name": "new", **stdio_spec()})
            answers.append(201)
        except RuntimeError_ as e:
            answers.append(e.status)

    async with running(registry):
        assert await registry.upstreams["old"].wait_up(20)
        async with anyio.create_task_group() as tg:
            tg.start_soon(registry.apply_config, [spec("new")])  # stopping `old` first takes ~2 s
            await anyio.sleep(0.3)
            tg.start_soon(add)  # finds the name free, stores it, then meets the reload's `new`
        assert answers == [409]
        assert registry.upstreams["new"].source == "config" and "old" not in registry.upstreams
        assert (await store.load()).servers == {}, "the refused add took its row back out of the store"
