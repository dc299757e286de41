"""Runtime servers persisted in SQLite: survive restarts on one node."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from gateway.store import Loaded, Options, StoreError, decode_rows

T = TypeVar("T")


class SqliteStore:
    """Three tables, `servers(name PRIMARY KEY, options JSON)`, `records(kind, key, value JSON)` and
    `locks(name PRIMARY KEY, token, expires)`; every query in a worker thread."""

    kind = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = anyio.Lock()

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            connection = sqlite3.connect(self.path, timeout=10)
            try:
                with connection:
                    return work(connection)
            finally:
                connection.close()

        async with self._lock:
            try:
                return await anyio.to_thread.run_sync(job)
            except sqlite3.Error as e:
                raise StoreError(f"sqlite store {self.path}: {e}") from None

    async def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"sqlite store {self.path}: {e.strerror or e}") from None

        def create(c: sqlite3.Connection) -> None:
            c.execute("CREATE TABLE IF NOT EXISTS servers (name TEXT PRIMARY KEY, options TEXT NOT NULL)")
            c.execute(
                "CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,"
                " PRIMARY KEY (kind, key))"
            )
            c.execute(
                "CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, token TEXT NOT NULL, expires REAL NOT NULL)"
            )

        await self._run(create)

    async def close(self) -> None:
        return None

    async def load(self) -> Loaded:
        def rows(c: sqlite3.Connection) -> list[tuple[object, object]]:
            c.text_factory = bytes  # decoded row by row, so one row that is not UTF-8 spoils only itself
            return c.execute("SELECT name, options FROM servers ORDER BY name").fetchall()

        return decode_rows(await self._run(rows))

    async def add(self, name: str, options: Options) -> bool:
        text = json.dumps(options, sort_keys=True)
        count = await self._run(
            lambda c: c.execute("INSERT OR IGNORE INTO servers (name, options) VALUES (?, ?)", (name, text)).rowcount
        )
        return bool(count)

    async def remove(self, name: str) -> bool:
        count = await self._run(lambda c: c.execute("DELETE FROM servers WHERE name = ?", (name,)).rowcount)
        return bool(count)

    async def records(self, kind: str) -> Loaded:
        def rows(c: sqlite3.Connection) -> list[tuple[object, object]]:
            c.text_factory = bytes
            return c.execute("SELECT key, value FROM records WHERE kind = ? ORDER BY key", (kind,)).fetchall()

        return decode_rows(await self._run(rows))

    async def put_record(self, kind: str, key: str, value: Options, *, only_new: bool = False) -> bool:
        text = json.dumps(value, sort_keys=True)
        verb = "INSERT OR IGNORE" if only_new else "INSERT OR REPLACE"
        count = await self._run(
            lambda c: c.execute(f"{verb} INTO records (kind, key, value) VALUES (?, ?, ?)", (kind, key, text)).rowcount
        )
        return bool(count)

    async def delete_record(self, kind: str, key: str) -> bool:
        count = await self._run(
            lambda c: c.execute("DELETE FROM records WHERE kind = ? AND key = ?", (kind, key)).rowcount
        )
        return bool(count)

    async def lock(self, name: str, token: str, ttl: float) -> bool:
        def take(c: sqlite3.Connection) -> bool:
            now = time.time()  # the wall clock: other processes on the node share the file
            c.execute("DELETE FROM locks WHERE name = ? AND expires <= ?", (name, now))
            added = c.execute(
                "INSERT OR IGNORE INTO locks (name, token, expires) VALUES (?, ?, ?)", (name, token, now + ttl)
            )
            return bool(added.rowcount)

        return await self._run(take)

    async def unlock(self, name: str, token: str) -> None:
        await self._run(lambda c: c.execute("DELETE FROM locks WHERE name = ? AND token = ?", (name, token)))

    async def changes(self) -> AsyncIterator[str]:
        await anyio.sleep_forever()
        yield ""  # pragma: no cover
