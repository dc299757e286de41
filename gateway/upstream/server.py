"""What the registry holds under a server's name, whatever serves it: a connection the gateway dials
(`connection.Upstream`) or the workers that dialled in under that name (`workerpool.WorkerPool`).

`UpstreamServer` is the contract the hub relies on; `ServerState` is the one piece both keep alike: the
server's state, its last error, its offers, and the announcement of every change. Neither derives from
the other.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
from mcp.shared.dispatcher import ProgressFnT

from gateway.config.servers import ServerSpec
from gateway.observe.logs import get_logger, traceback_text
from gateway.observe.metrics import Metrics
from gateway.protocol.errors import State, programming_error
from gateway.relay.asks import Callers
from gateway.upstream.offers import NONE, Offers

Json = dict[str, Any]
ChangeCallback = Callable[[Any], Awaitable[None]]  # told the server whose state or offers changed
UpdateCallback = Callable[[Any, str], Awaitable[None]]  # told the server and the URI of a resource that changed

log = get_logger("upstream")


class UpstreamServer(Protocol):
    """A server as the hub sees it: what it offers, whether it is up, and the requests sent to it."""

    spec: ServerSpec
    name: str
    source: str
    state: State
    error: str | None
    offers: Offers
    callers: Callers
    settled: anyio.Event
    stopped: anyio.Event
    scope: anyio.CancelScope | None
    subscriptions: set[str]
    on_resource_updated: UpdateCallback | None

    @property
    def tools(self) -> tuple[Json, ...]:
        """The server's tools after its filters (empty while it is not up)."""

    @property
    def protocol_version(self) -> str | None:
        """The revision the server speaks (None: not connected, or not one connection)."""

    @property
    def connections(self) -> int:
        """How many times the server came up."""

    @property
    def ending(self) -> bool:
        """Whether the connection calls travel on now is known to be gone."""

    @property
    def credential_kind(self) -> str | None:
        """What kind of credential the server uses, never its values."""

    async def run(self) -> None:
        """Serve until cancelled (the registry runs this in the server's own task)."""

    async def request(
        self,
        method: str,
        params: Json,
        report: ProgressFnT | None = None,
        *,
        lean: bool = False,
        capabilities: Json | None = None,
    ) -> Json:
        """Send one request; raises `CallFailed`, or `MCPError` for an error the server answered with."""

    async def subscribe(self, uri: str, on: bool) -> None:
        """Follow (or stop following) changes of one resource."""

    async def wait_up(self, timeout: float, newer_than: int | None = None) -> bool:
        """Wait up to `timeout` seconds for the server to be up; True if it is."""

    def reconnect(self) -> None:
        """Drop what serves the server now and serve it afresh."""

    def retried(self) -> None:
        """Count one retried call attempt."""

    def status(self) -> dict[str, Any]:
        """State, tool count, last error and since when, as the HTTP endpoints show them."""


class ServerState:
    """A server's state, last error, offers and their announcement (`on_change`), kept alike by every kind
    of server the registry holds."""

    def __init__(self, spec: ServerSpec, on_change: ChangeCallback, metrics: Metrics | None, *, source: str) -> None:
        self.spec = spec
        self.name = spec.name
        self.source = source
        self._on_change = on_change
        self._metrics = metrics
        self.state = State.DISABLED if spec.disabled else State.CONNECTING
        self.error: str | None = None
        self.since = time.time()
        self.offers: Offers = NONE
        self.callers = Callers(spec)
        self.on_resource_updated: UpdateCallback | None = None
        self.subscriptions: set[str] = set()
        self.settled = anyio.Event()
        self.stopped = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self._up = anyio.Event()
        self._connections = 0  # how many times the server came up: a retry waits for one newer than its own

    @property
    def connections(self) -> int:
        """How many times the server came up."""
        return self._connections

    @property
    def tools(self) -> tuple[Json, ...]:
        """The server's tools after its filters (empty while it is not up)."""
        return self.offers.tools

    def status(self) -> dict[str, Any]:
        """State, tool count, last error (secret-free) and since when (ISO 8601), as the HTTP endpoints show them."""
        return {
            "name": self.name,
            "state": self.state.value,
            "tools": len(self.tools) if self.state is State.UP else 0,
            "error": self.error,
            "since": datetime.fromtimestamp(self.since, UTC).isoformat(timespec="seconds"),
        }

    async def wait_up(self, timeout: float, newer_than: int | None = None) -> bool:
        """Wait up to `timeout` seconds for the server to be up (on a connection made after the `newer_than`-th,
        when given: the one a call failed on may not be known to be gone yet); True if it is."""
        with anyio.move_on_after(timeout):
            while True:
                up = self._up
                await up.wait()
                if newer_than is None or self._connections > newer_than:
                    break
                while self._up is up and self.state is State.UP:  # the stale connection, until it is seen to end
                    await anyio.sleep(0.05)
        return self.state is State.UP and (newer_than is None or self._connections > newer_than)

    def retried(self) -> None:
        """Count one retried call attempt."""
        if self._metrics is not None:
            self._metrics.count_retry(self.name)

    def _report_bug(self, exc: Exception, metrics: Metrics | None = None, where: str = "upstream") -> None:
        """Log a programming error's traceback and count it: it would otherwise pass for the server's failure."""
        if not programming_error(exc):
            return
        log.error(
            "programming error while serving the connection; it is retried as if the server had failed",
            server=self.name,
            error=type(exc).__name__,
            traceback=traceback_text(exc),
        )
        if (metrics := metrics or self._metrics) is not None:
            metrics.count_internal_error(where)

    async def _set_state(self, state: State, error: str | None) -> None:
        changed, explained = state is not self.state, state is State.DOWN and error != self.error
        self.state, self.error = state, error
        if state is State.UP:
            if not self._up.is_set():
                self._connections += 1
            self._up.set()
        elif self._up.is_set():
            self._up = anyio.Event()
        if changed:
            self.since = time.time()
            if state is not State.UP:
                self.offers = NONE
                if self._metrics is not None:
                    self._metrics.set_listings(self.name, ())
            log.info("upstream state", server=self.name, state=state.value, reason=error)
            await self._on_change(self)
        elif explained:  # down already, and now the reason is known (its transport's end told more)
            log.info("upstream state", server=self.name, state=state.value, reason=error)
