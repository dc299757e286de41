"""Stores against real SQLite files and a real redis-server on loopback: a row that cannot be read back is set
aside by name, and the runtime keeps applying the others."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from structlog.testing import capture_logs

from gateway.admin.servers import Runtime
from gateway.config.settings import Settings
from gateway.core.registry import Registry
from gateway.store import Store
from gateway.store.redis import KEY, RedisStore
from gateway.store.sqlite import SqliteStore
from tests.fixtures.servers import free_port, stdio_spec

pytestmark = pytest.mark.anyio
RUNTIME_STDIO = Settings.model_validate({"runtime": {"stdio": True}})  # stdio runtime servers allowed

ROW_TEXT = "ROW-TEXT-never-logged-7c41"
GOOD = {"url": "http://127.0.0.1:9/mcp"}
# name -> stored bytes, and the reason each is set aside
BAD = {
    "cut": (b'{"url": "http://' + ROW_TEXT.encode(), "not valid JSON"),
    "listed": (json.dumps([ROW_TEXT]).encode(), "not a JSON object"),
    "binary": (b'{"url": "\xff\xfe' + ROW_TEXT.encode() + b'"}', "not UTF-8"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sqlite_with_rows(path: Path) -> SqliteStore:
    """A store file holding one good row and every kind of bad one, written behind the store's back."""
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("CREATE TABLE servers (name TEXT PRIMARY KEY, options TEXT NOT NULL)")
        connection.execute("INSERT INTO servers VALUES (?, ?)", ("good", json.dumps(GOOD)))
        for name, (raw, _) in BAD.items():
            connection.execute("INSERT INTO servers VALUES (?, ?)", (name, raw))  # stored as BLOBs
        connection.execute("INSERT INTO servers VALUES (?, ?)", ("text", '{"url": ' + ROW_TEXT))  # as TEXT
    connection.close()
    return SqliteStore(str(path))


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[int]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield port
    client.close()
    proc.terminate()
    proc.wait(10)


def redis_with_rows(port: int) -> RedisStore:
    client = redis.Redis(port=port)
    client.hset(KEY, "good", json.dumps(GOOD))
    for name, (raw, _) in BAD.items():
        client.hset(KEY, name, raw)
    client.hset(KEY, "text", '{"url": ' + ROW_TEXT)
    client.close()
    return RedisStore(f"redis://127.0.0.1:{port}/0")


EXPECTED_BAD = {**{name: reason for name, (_, reason) in BAD.items()}, "text": "not valid JSON"}


async def test_sqlite_sets_bad_rows_aside(tmp_path: Path) -> None:
    store = sqlite_with_rows(tmp_path / "servers.db")
    await store.start()
    loaded = await store.load()
    assert loaded.servers == {"good": GOOD}
    assert loaded.bad == EXPECTED_BAD


async def test_redis_sets_bad_rows_aside(redis_port: int) -> None:
    store = redis_with_rows(redis_port)
    await store.start()
    try:
        loaded = await store.load()
        assert loaded.servers == {"good": GOOD}
        assert loaded.bad == EXPECTED_BAD
        assert await store.add("other", {"url": "http://127.0.0.1:9/x"})
        assert not await store.add("other", {"url": "http://127.0.0.1:9/y"})
        assert (await store.load()).servers == {"good": GOOD, "other": {"url": "http://127.0.0.1:9/x"}}
        assert await store.remove("other")
    finally:
        await store.close()


async def test_redis_announces_changes_as_text(redis_port: int) -> None:
    store = RedisStore(f"redis://127.0.0.1:{redis_port}/0")
    seen: list[str] = []
    with anyio.fail_after(10):
        async for reason in store.changes():
            seen.append(reason)
            if reason == "subscribed":
                await store.add("web", GOOD)
            else:
                break
    await store.close()
    assert seen == ["subscribed", "add web"]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_runtime_skips_bad_rows_and_applies_the_rest(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store: Store
    if kind == "sqlite":
        store = sqlite_with_rows(tmp_path / "servers.db")
    else:
        store = redis_with_rows(request.getfixturevalue("redis_port"))
    registry = Registry([])
    runtime = Runtime(registry, store, RUNTIME_STDIO)
    with capture_logs() as logs, anyio.fail_after(30):
        async with registry.running(), anyio.create_task_group() as tg:
            tg.start_soon(runtime.run)
            while "good" not in registry.upstreams:
                await anyio.sleep(0.02)
            await runtime.reconcile()  # a second round logs nothing new
            assert runtime.bad_rows == EXPECTED_BAD
            assert runtime.health.ok
            exported = registry.metrics.render()[0].decode()
            for name in EXPECTED_BAD:
                assert f'manifold_store_bad_rows{{server="{name}"}} 1.0' in exported

            await store.remove("cut")  # repaired by hand: no longer reported
            await runtime.reconcile()
            assert "cut" not in runtime.bad_rows
            assert 'server="cut"' not in registry.metrics.render()[0].decode()
            tg.cancel_scope.cancel()
        await store.close()
    skipped = [e for e in logs if e["event"] == "stored server row cannot be read; skipped"]
    assert sorted((e["server"], e["reason"]) for e in skipped) == sorted(EXPECTED_BAD.items())
    assert ROW_TEXT not in repr(logs)


async def test_a_running_server_whose_row_turns_bad_keeps_running(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "servers.db"))
    await store.start()
    registry = Registry([])
    runtime = Runtime(registry, store, RUNTIME_STDIO)
    async with registry.running():
        await store.add("fx", stdio_spec())
        await runtime.reconcile()
        assert "fx" in registry.upstreams
        connection = sqlite3.connect(tmp_path / "servers.db")
        with connection:
            connection.execute("UPDATE servers SET options = ? WHERE name = 'fx'", ("{oops",))
        connection.close()
        await runtime.reconcile()
        assert "fx" in registry.upstreams and runtime.bad_rows == {"fx": "not valid JSON"}
        await store.remove("fx")
        await runtime.reconcile()
        assert "fx" not in registry.upstreams and runtime.bad_rows == {}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_records_put_only_new_and_read_back(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from gateway.store.memory import MemoryStore

    store: Store
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        store = SqliteStore(str(tmp_path / "records.db"))
    else:
        store = RedisStore(f"redis://127.0.0.1:{request.getfixturevalue('redis_port')}/0")
    await store.start()
    try:
        assert (await store.records("pins")).servers == {}
        assert await store.put_record("pins", "fx/a", {"digest": "1"}, only_new=True)
        assert not await store.put_record("pins", "fx/a", {"digest": "2"}, only_new=True), "only_new keeps the first"
        assert await store.put_record("pins", "fx/b", {"digest": "3"})
        assert await store.put_record("pins", "fx/b", {"digest": "4"}), "a plain put overwrites"
        assert await store.put_record("other", "fx/a", {"x": 1})
        assert (await store.records("pins")).servers == {"fx/a": {"digest": "1"}, "fx/b": {"digest": "4"}}
        assert (await store.records("other")).servers == {"fx/a": {"x": 1}}
        assert (await store.load()).servers == {}, "records are not servers"
        assert await store.delete_record("pins", "fx/a")
        assert not await store.delete_record("pins", "fx/a"), "a record is deleted once"
        assert not await store.delete_record("pins", "nope")
        assert (await store.records("pins")).servers == {"fx/b": {"digest": "4"}}
        assert (await store.records("other")).servers == {"fx/a": {"x": 1}}, "only the kind named"
    finally:
        await store.close()


async def test_a_corrupt_pin_row_is_set_aside_by_key(tmp_path: Path) -> None:
    from gateway.policy.pins import Pins

    store = SqliteStore(str(tmp_path / "pins.db"))
    await store.start()
    await store.put_record("pins", "fx/good", {"digest": "sha256:1", "definition": {"name": "fx__good"}})
    connection = sqlite3.connect(tmp_path / "pins.db")
    with connection:
        connection.execute("INSERT INTO records VALUES ('pins', 'fx/cut', ?)", (b'{"digest": "' + ROW_TEXT.encode(),))
        connection.execute("INSERT INTO records VALUES ('pins', 'fx/odd', ?)", (json.dumps({"digest": 5}),))
    connection.close()
    pins = Pins(store, lambda _: "hold")
    with capture_logs() as logs:
        assert await pins.load()
    assert [(p.server, p.tool) for p in pins.pins()] == [("fx", "good")]
    assert sorted(e["pin"] for e in logs if e["event"].startswith("stored pin cannot be read")) == ["fx/cut", "fx/odd"]
    assert ROW_TEXT not in json.dumps(logs)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_locks_are_exclusive_expire_and_release_only_their_own(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from gateway.store import StoreError, held
    from gateway.store.memory import MemoryStore

    def open_one() -> Store:
        if kind == "memory":
            return MemoryStore()
        if kind == "sqlite":
            return SqliteStore(str(tmp_path / "locks.db"))
        return RedisStore(f"redis://127.0.0.1:{request.getfixturevalue('redis_port')}/0")

    store = open_one()
    other = store if kind == "memory" else open_one()  # another process's view of the same store
    await store.start()
    try:
        assert await store.lock("oauth:x", "a", 0.3)
        assert not await other.lock("oauth:x", "b", 0.3), "taken"
        assert await other.lock("oauth:y", "b", 0.3), "another name is free"
        await other.unlock("oauth:x", "b")  # not b's: stays
        assert not await store.lock("oauth:x", "c", 0.3)
        await anyio.sleep(0.4)
        assert await other.lock("oauth:x", "b", 5), "an expired lock is free"
        await store.unlock("oauth:x", "a")  # a's lock expired and b took it: stays b's
        assert not await store.lock("oauth:x", "a", 5)
        await other.unlock("oauth:x", "b")
        assert await store.lock("oauth:x", "a", 5)
        await store.unlock("oauth:x", "a")

        order: list[str] = []

        async def holder(name: str) -> None:
            async with held(store, "oauth:z", 5, 5):
                order.append(f"{name} in")
                await anyio.sleep(0.05)
                order.append(f"{name} out")

        async with anyio.create_task_group() as tg:
            for name in "abc":
                tg.start_soon(holder, name)
        assert [o.split()[1] for o in order] == ["in", "out"] * 3, order

        assert await store.lock("oauth:w", "a", 5)
        with pytest.raises(StoreError, match="still taken"):
            async with held(other, "oauth:w", 5, 0.2):
                pass
    finally:
        await store.close()
        if other is not store:
            await other.close()
