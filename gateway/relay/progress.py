"""Progress notices of a server, passed on to the caller of the call they belong to."""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server import ServerRequestContext


class ProgressRelay:
    """Forwards upstream progress to the caller in order, and lets the result wait for the last one."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self._ctx = ctx
        self._lock = anyio.Lock()
        self._pending = 0
        self._idle = anyio.Event()
        self._idle.set()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self._pending += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        try:
            async with self._lock:
                await self._ctx.session.report_progress(progress, total, message)
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()

    async def drain(self) -> None:
        """Wait until every progress notice that has arrived so far has been sent on."""
        await anyio.lowlevel.checkpoint()
        with anyio.move_on_after(5):
            await self._idle.wait()
