"""Stores of what the gateway learns at run time: memory (this process), SQLite (one node), Redis (shared by
replicas). Two kinds of rows: runtime-added servers, and records (keyed JSON objects, such as tool pins)."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

Options = dict[str, Any]


class StoreError(Exception):
    """The store cannot be reached or used; the message says why (without secrets)."""


@dataclass
class Loaded:
    """What a store holds: the servers that read back, and the names of rows that did not (with why)."""

    servers: dict[str, Options] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)


def decode_rows(rows: Iterable[tuple[object, object]]) -> Loaded:
    """Read `(name, options JSON)` rows: a row that is not UTF-8, not JSON, or not a JSON object is set
    aside under its name with a reason that never quotes the row."""
    loaded = Loaded()
    for raw_name, raw_options in rows:
        name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
        try:
            text = raw_options.decode() if isinstance(raw_options, bytes) else raw_options
            if not isinstance(text, str):
                raise TypeError
            options = json.loads(text)
        except UnicodeDecodeError:
            loaded.bad[name] = "not UTF-8"
            continue
        except (TypeError, ValueError, RecursionError):  # json.JSONDecodeError is a ValueError
            loaded.bad[name] = "not valid JSON"
            continue
        if not isinstance(options, dict):
            loaded.bad[name] = "not a JSON object"
            continue
        loaded.servers[name] = options
    return Loaded(dict(sorted(loaded.servers.items())), dict(sorted(loaded.bad.items())))


class Store(Protocol):
    """Where runtime servers' options live. Options are plain data and never hold secrets."""

    kind: str

    async def start(self) -> None:
        """Connect and create what is missing."""

    async def close(self) -> None:
        """Release connections."""

    async def load(self) -> Loaded:
        """Every stored server (name -> options), and the rows that cannot be read back."""

    async def add(self, name: str, options: Options) -> bool:
        """Store a new server; False when the name is taken."""

    async def remove(self, name: str) -> bool:
        """Delete a server; False when there was none."""

    async def records(self, kind: str) -> Loaded:
        """Every record of one kind (key -> JSON object, in `Loaded.servers`), and the keys that cannot be read."""

    async def put_record(self, kind: str, key: str, value: Options, *, only_new: bool = False) -> bool:
        """Write a record (with `only_new`, only where the key is free); True when written. Announced on
        `changes()` as `"{kind} {key}"`."""

    async def delete_record(self, kind: str, key: str) -> bool:
        """Delete a record; True when there was one. Announced on `changes()` as `"{kind} {key}"`."""

    def changes(self) -> AsyncIterator[str]:
        """Yield a reason each time the store may have changed elsewhere (forever; empty for local stores):
        `add NAME`, `remove NAME`, `{kind} {key}` for a record, or `subscribed` after each (re)subscription."""

    async def lock(self, name: str, token: str, ttl: float) -> bool:
        """Take the lock `name` for at most `ttl` seconds, as `token`; False while another holder has it (in any
        process sharing the store)."""

    async def unlock(self, name: str, token: str) -> None:
        """Release the lock `name` if `token` still holds it (one that expired and was taken since stays taken)."""


@asynccontextmanager
async def held(store: Store, name: str, ttl: float, wait: float) -> AsyncIterator[None]:
    """Hold the store lock `name` for the block (for at most `ttl` seconds); waits up to `wait` seconds for it,
    then raises `StoreError`."""
    token = secrets.token_hex(16)
    delay = 0.01
    taken = False
    with anyio.move_on_after(wait):
        while not (taken := await store.lock(name, token, ttl)):
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.2)
    if not taken:
        raise StoreError(f"the lock {name!r} was still taken after {wait:g} s")
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True), suppress(StoreError):  # else it expires after `ttl`
            await store.unlock(name, token)


def open_store(url: str | None) -> Store:
    """The store for a `store:` setting: None (memory), `sqlite:///path` or `redis://host:port/db`."""
    from gateway.store.memory import MemoryStore

    if not url:
        return MemoryStore()
    if url.startswith("sqlite:///"):
        from gateway.store.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:///"))
    if url.startswith(("redis://", "rediss://", "unix://")):
        from gateway.store.redis import RedisStore

        return RedisStore(url)
    raise StoreError(
        f"unknown store URL scheme in {url.split('://')[0]!r} (use sqlite:///path or redis://host:port/db)"
    )
