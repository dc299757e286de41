"""Runtime servers in this process only (the default)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio

from gateway.store import Loaded, Options


class MemoryStore:
    """A dict; nothing survives a restart and nothing is shared."""

    kind = "memory"

    def __init__(self) -> None:
        self._servers: dict[str, Options] = {}
        self._records: dict[str, dict[str, Options]] = {}
        self._locks: dict[str, tuple[str, float]] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def load(self) -> Loaded:
        return Loaded(dict(sorted(self._servers.items())))

    async def add(self, name: str, options: Options) -> bool:
        if name in self._servers:
            return False
        self._servers[name] = dict(options)
        return True

    async def remove(self, name: str) -> bool:
        return self._servers.pop(name, None) is not None

    async def records(self, kind: str) -> Loaded:
        return Loaded(dict(sorted(self._records.get(kind, {}).items())))

    async def put_record(self, kind: str, key: str, value: Options, *, only_new: bool = False) -> bool:
        rows = self._records.setdefault(kind, {})
        if only_new and key in rows:
            return False
        rows[key] = dict(value)
        return True

    async def delete_record(self, kind: str, key: str) -> bool:
        return self._records.get(kind, {}).pop(key, None) is not None

    async def changes(self) -> AsyncIterator[str]:
        await anyio.sleep_forever()
        yield ""  # pragma: no cover

    async def lock(self, name: str, token: str, ttl: float) -> bool:
        now = time.monotonic()
        holder = self._locks.get(name)
        if holder is not None and holder[1] > now:
            return False
        self._locks[name] = (token, now + ttl)
        return True

    async def unlock(self, name: str, token: str) -> None:
        if self._locks.get(name, ("", 0.0))[0] == token:
            del self._locks[name]
