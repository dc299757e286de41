"""The calls in flight, and the drain that waits for them at shutdown."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio


class InFlight:
    """Counts the calls in flight; once `draining`, new calls are refused (by admission) and `drain` waits."""

    def __init__(self) -> None:
        self.draining = False
        self.count = 0
        self._done = anyio.Event()

    @contextmanager
    def tracking(self) -> Iterator[None]:
        """Count a call as in flight, so the shutdown drain waits for it."""
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._done.set()

    async def wait(self, timeout: float) -> None:
        """Wait until no call is in flight, or `timeout` passes."""
        if self.count:
            self._done = anyio.Event()
            with anyio.move_on_after(timeout):
                await self._done.wait()
