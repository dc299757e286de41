"""The tail of tool calls: each call's outcome fanned out, in process, to whoever watches (the console's live
page). Publishing never waits: every subscriber has a bounded queue, and an event that finds it full is
dropped for that subscriber alone (and counted), so a slow reader costs a call nothing.

An event holds who called (the name of the view the call was admitted under: an API token's name, an OAuth
rule's, `anonymous`), the server, the public tool name, the outcome and the duration; never arguments or
results.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import anyio

HISTORY = 200
QUEUE = 256


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One tool call's outcome."""

    at: float  # seconds since the epoch
    caller: str
    server: str
    tool: str
    outcome: str
    duration_ms: float | None

    def as_json(self) -> dict[str, Any]:
        """The event as a JSON object."""
        return asdict(self)


class Subscription:
    """One reader's queue: at most `size` events wait; beyond that they are dropped and counted."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._queue: deque[CallEvent] = deque()
        self._ready = anyio.Event()
        self.dropped = 0

    def offer(self, event: CallEvent) -> None:
        """Queue `event`, or drop it when the queue is full."""
        if len(self._queue) >= self._size:
            self.dropped += 1
            return
        self._queue.append(event)
        self._ready.set()

    async def next(self, timeout: float) -> list[CallEvent]:
        """The events queued, once there is one or after `timeout` seconds (then possibly none)."""
        if not self._queue:
            with anyio.move_on_after(timeout):
                await self._ready.wait()
        self._ready = anyio.Event()
        events = list(self._queue)
        self._queue.clear()
        return events


class CallFeed:
    """The last `history` calls, and the subscriptions each new one is offered to."""

    def __init__(self, history: int = HISTORY, queue: int = QUEUE) -> None:
        self.recent: deque[CallEvent] = deque(maxlen=history)
        self._queue = queue
        self._subscriptions: set[Subscription] = set()

    def record(self, server: str, tool: str, outcome: str, seconds: float | None, who: str) -> None:
        """Publish one call's outcome (`who`: the name of the view it was admitted under); returns at once."""
        duration = round(seconds * 1000, 2) if seconds is not None else None
        event = CallEvent(time.time(), who or "anonymous", server, tool, outcome, duration)
        self.recent.append(event)
        for subscription in self._subscriptions:
            subscription.offer(event)

    @contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        """A subscription to every call from now on, for the length of the `with` block."""
        subscription = Subscription(self._queue)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)

    @property
    def watchers(self) -> int:
        """How many subscriptions are open."""
        return len(self._subscriptions)
