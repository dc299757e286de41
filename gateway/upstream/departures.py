"""Worker names whose last worker left: what each leaves behind is bounded.

A name offered by workers leaves its metric series and, for workers that are not trusted, its pins in the
store, so that a name whose workers come and go keeps one history and is judged against what was reviewed.
A departed name is remembered in the store (kind `worker-departures`, so a restart does not lose it) and
forgotten `forget_after` seconds after its last worker left, or sooner when more than `keep` names are
departed at once (the longest gone first): its series and its pins are deleted, and a worker offering it
again is met as a new name (its first listing pinned as on first use). A name whose workers come back in
time is no longer departed and keeps everything.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from gateway.observe.logs import get_logger
from gateway.protocol.errors import describe
from gateway.store import Store, StoreError

KIND = "worker-departures"
log = get_logger("workers")


class Departures:
    """The departed worker names, in the store; `forget(name)` deletes what a forgotten name left behind."""

    def __init__(
        self,
        store: Store,
        forget: Callable[[str], Awaitable[None]],
        live: Callable[[str], bool],
        *,
        forget_after: float,
        keep: int,
    ) -> None:
        self.store = store
        self.forget_after, self.keep = forget_after, keep
        self._forget, self._live = forget, live

    async def left(self, name: str) -> None:
        """The last worker of `name` left."""
        await self._put(name, {"at": time.time()})
        await self.sweep()

    async def back(self, name: str) -> None:
        """A worker offers `name` again: it is not departed."""
        try:
            await self.store.delete_record(KIND, name)
        except StoreError as e:
            log.error("worker name could not be marked as back", server=name, reason=describe(e))

    async def sweep(self) -> list[str]:
        """Forget the names gone for longer than `forget_after`, and the longest gone beyond `keep`; the names
        forgotten."""
        try:
            departed = await self.store.records(KIND)
        except StoreError as e:
            log.error("departed worker names could not be read", reason=describe(e))
            return []
        now = time.time()
        gone = sorted(departed.servers.items(), key=lambda item: _at(item[1]), reverse=True)  # newest first
        due = [name for n, (name, row) in enumerate(gone) if n >= self.keep or now - _at(row) >= self.forget_after]
        forgotten = []
        for name in [*due, *departed.bad]:
            try:
                if not self._live(name):
                    await self._forget(name)
                    forgotten.append(name)
                await self.store.delete_record(KIND, name)
            except StoreError as e:
                log.error("departed worker name could not be forgotten", server=name[:64], reason=describe(e))
        if forgotten:
            log.info("departed worker names forgotten", names=len(forgotten), first=forgotten[0])
        return forgotten

    async def run(self) -> None:
        """Sweep now and then, for as long as the gateway runs."""
        while True:
            await self.sweep()
            await anyio.sleep(min(self.forget_after, 60.0))

    async def _put(self, name: str, row: dict[str, float]) -> None:
        try:
            await self.store.put_record(KIND, name, row)
        except StoreError as e:
            log.error("departed worker name could not be recorded", server=name, reason=describe(e))


def _at(row: dict[str, object]) -> float:
    at = row.get("at")
    return at if isinstance(at, float | int) else 0.0
