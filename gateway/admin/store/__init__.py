"""Stores of runtime-added servers: memory (this process), SQLite (one node), Redis (shared by replicas)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

Options = dict[str, Any]


class StoreError(Exception):
    """The store cannot be reached or used; the message says why (without secrets)."""


class Store(Protocol):
    """Where runtime servers' options live. Options are plain data and never hold secrets."""

    kind: str

    async def start(self) -> None:
        """Connect and create what is missing."""

    async def close(self) -> None:
        """Release connections."""

    async def load(self) -> dict[str, Options]:
        """Every stored server: name -> options."""

    async def add(self, name: str, options: Options) -> bool:
        """Store a new server; False when the name is taken."""

    async def remove(self, name: str) -> bool:
        """Delete a server; False when there was none."""

    def changes(self) -> AsyncIterator[str]:
        """Yield a reason each time the store may have changed elsewhere (forever; empty for local stores)."""


def open_store(url: str | None) -> Store:
    """The store for a `store:` setting: None (memory), `sqlite:///path` or `redis://host:port/db`."""
    from gateway.admin.store.memory import MemoryStore

    if not url:
        return MemoryStore()
    if url.startswith("sqlite:///"):
        from gateway.admin.store.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:///"))
    if url.startswith(("redis://", "rediss://", "unix://")):
        from gateway.admin.store.redis import RedisStore

        return RedisStore(url)
    raise StoreError(
        f"unknown store URL scheme in {url.split('://')[0]!r} (use sqlite:///path or redis://host:port/db)"
    )
