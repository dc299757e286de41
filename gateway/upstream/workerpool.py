"""Workers: servers that dial in to the gateway instead of being dialled.

A worker opens a WebSocket to `/workers`; over it the roles are reversed and the gateway is the MCP
client of the server the worker offers (`transports/websocket.py`). Each such connection is a
`WorkerLink`: an `Upstream` whose transport is the socket, so negotiation, listings, change notices,
calls, progress, cancellation and failure classification are the same code as for any server. The
links offering one name form a `WorkerPool`, the server the registry holds under that name (an
`UpstreamServer`, not a connection of its own): its tools are the oldest link's listing, and each
call goes to the link with the fewest calls in flight (exactly one link per attempt). A link whose
listing differs from the pool's is refused. The pool leaves the registry (and its tools the catalog)
when its last link ends.
"""

from __future__ import annotations

import itertools
import time
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession, MCPError
from mcp.shared.dispatcher import ProgressFnT

from gateway.config.servers import ResolvedServer, ServerSpec
from gateway.observe.logs import get_logger
from gateway.observe.metrics import Metrics
from gateway.protocol.errors import State, describe, unavailable
from gateway.upstream.connection import Upstream
from gateway.upstream.offers import Offers, TooMany, list_offers
from gateway.upstream.server import ChangeCallback, ServerState
from gateway.upstream.transports.websocket import (
    CONFLICT,
    GOING_AWAY,
    TIMEOUT,
    TOO_MANY,
    Refusal,
    SocketEnd,
)

Json = dict[str, Any]
log = get_logger("workers")

_link_ids = itertools.count(1)


class WorkerLink(Upstream):
    """One worker's connection: the gateway as the MCP client of the server offered over it.

    It connects once, over the socket the worker opened, and never dials again: a worker that drops
    dials in anew. It pings the worker every `heartbeat_interval` seconds; no answer within
    `heartbeat_timeout` ends it.
    """

    def __init__(
        self,
        pool: WorkerPool,
        socket: SocketEnd,
        token_name: str,
        *,
        max_tools: int,
        heartbeat_interval: float,
        heartbeat_timeout: float,
    ) -> None:
        super().__init__(pool.spec, pool.link_changed, {}, None, source="worker", fast=False)
        self.callers = pool.callers  # a worker's requests of the user go to the callers of the pool's calls
        self.pool = pool
        self.socket = socket
        self.token_name = token_name
        self.id = next(_link_ids)
        self.connected = time.time()
        self.in_flight = 0
        self.calls = 0
        self.last_pick = 0
        self.admitted = False
        self.refusal: Refusal | None = None
        self._max_tools = max_tools
        self._interval, self._timeout = heartbeat_interval, heartbeat_timeout
        self._stop = anyio.CancelScope()

    async def run(self) -> None:
        """Negotiate, list and serve until the socket ends, a heartbeat goes unanswered or the link is refused."""
        reason = "the worker closed the connection"
        with self._stop:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._heartbeat)
                    await self._connect_and_serve(ResolvedServer(None, [], {}, None, None, {}))
                    tg.cancel_scope.cancel()
            except Exception as e:
                reason = describe(e)
                self._report_bug(e, self.pool._workers_metric, "worker")
        if self.refusal is None and self.socket.problem is not None:
            self.refusal = self.socket.problem
        self.session = None
        with anyio.CancelScope(shield=True):
            await self._set_state(State.DOWN, self.refusal.reason if self.refusal is not None else reason)

    def refuse(self, refusal: Refusal) -> None:
        """End the link for `refusal` (the first reason given is the one the worker is told)."""
        if self.refusal is None:
            self.refusal = refusal
        self._stop.cancel()

    async def _transport(self, r: ResolvedServer) -> Any:
        return self.socket.streams()

    async def _list(self, session: ClientSession, parent: Any = None) -> Offers:  # a worker's: never traced
        try:
            return await list_offers(
                session, self.spec, max_tools=self._max_tools, tools_only=True, previous=self.offers
            )
        except TooMany:
            self.refuse(
                Refusal(TOO_MANY, f"it offers more than {self._max_tools} tools (workers.max_tools)", "too_many_tools")
            )
            raise

    async def _heartbeat(self) -> None:
        while True:
            await anyio.sleep(self._interval)
            session = self.session
            if session is None:
                continue  # still negotiating: startup_timeout bounds that
            # An error is an answer too; a closed session ends the link by itself.
            with anyio.move_on_after(self._timeout) as waited, suppress(MCPError):
                await session.send_ping()
            if waited.cancelled_caught:
                self.refuse(Refusal(TIMEOUT, f"no answer to a ping within {self._timeout:g} s", "heartbeat"))
                return

    def describe(self) -> Json:
        """This connection as the admin API shows it (never the token's secret)."""
        return {
            "id": self.id,
            "token": self.token_name,
            "state": self.state.value,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "since": datetime.fromtimestamp(self.connected, UTC).isoformat(timespec="seconds"),
        }


def same_tools(a: tuple[Json, ...], b: tuple[Json, ...]) -> bool:
    """Whether two listings offer the same tools, whatever their order."""
    return sorted(a, key=lambda t: str(t.get("name"))) == sorted(b, key=lambda t: str(t.get("name")))


class WorkerPool(ServerState):
    """The workers offering one name, as one upstream of the registry.

    Up while at least one link is admitted; its tools are the oldest admitted link's. A link is admitted
    when its first listing is in and agrees with the pool's; one that differs (then or after a change) is
    refused, so every call, whichever worker takes it, meets the tools the catalog shows. The registry
    removes the pool once no worker is connected or connecting (see `Registry.worker_pool`).
    """

    def __init__(self, spec: ServerSpec, on_change: ChangeCallback, metrics: Metrics) -> None:
        super().__init__(spec, on_change, metrics, source="worker")
        self.links: list[WorkerLink] = []  # admitted, oldest first
        self.pending: set[WorkerLink] = set()  # connected, first listing not yet judged
        self.reserved = 0  # connections being served under this pool (the registry keeps it while > 0)
        self.retired = False
        self._judging = anyio.Lock()
        self._picks = itertools.count(1)
        self._workers_metric = metrics

    async def run(self) -> None:
        """Nothing to connect: the workers dial in. When the registry stops the pool, its links end."""
        self.settled.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.retired = True
            for link in [*self.links, *self.pending]:
                link.refuse(Refusal(GOING_AWAY, f"the gateway no longer offers '{self.name}' from workers", "removed"))

    async def serve(self, link: WorkerLink) -> None:
        """Serve one worker's connection until it ends."""
        self.pending.add(link)
        try:
            await link.run()
        finally:
            if link in self.pending or link in self.links:  # cancelled before its end was judged
                self.pending.discard(link)
                if link in self.links:
                    self.links.remove(link)
                    self._count_workers()

    async def link_changed(self, link: Upstream) -> None:
        """A link came up, listed anew, or ended: admit, refuse or drop it, and publish the pool's listing."""
        assert isinstance(link, WorkerLink)
        async with self._judging:
            before = self.offers.tools if self.links else None
            self._judge(link)
            after = self.links[0].offers.tools if self.links else None
            if self.retired or (before is not None and after is not None and before == after):
                return
            if after is None:
                if before is not None:
                    await self._set_state(State.DOWN, "no worker is connected")
                return
            self.offers = self.links[0].offers
            if self.state is State.UP:
                await self._on_change(self)
            else:
                await self._set_state(State.UP, None)

    def _judge(self, link: WorkerLink) -> None:
        if link.state is not State.UP:
            self.pending.discard(link)
            if link in self.links:
                self.links.remove(link)
                self._count_workers()
            return
        defining = self.links[0] if self.links else None
        if link in self.pending:
            if defining is not None and not same_tools(link.offers.tools, defining.offers.tools):
                self.pending.discard(link)
                link.refuse(
                    Refusal(
                        CONFLICT,
                        f"its tools differ from those of the {len(self.links)} worker(s) already offering "
                        f"'{self.name}'",
                        "listing",
                    )
                )
                return
            self.pending.discard(link)
            self.links.append(link)
            link.admitted = True
            self._count_workers()
            if (audit := self._workers_metric.audit) is not None:
                audit.act("worker_admitted", who=link.token_name, server=self.name, tools=len(link.offers.tools))
            return
        if link is defining:
            for other in self.links[1:]:
                if not same_tools(other.offers.tools, link.offers.tools):
                    other.refuse(Refusal(CONFLICT, f"the tools of '{self.name}' changed and its own differ", "listing"))
        elif defining is not None and not same_tools(link.offers.tools, defining.offers.tools):
            link.refuse(Refusal(CONFLICT, f"its tools changed and differ from those of '{self.name}'", "listing"))

    def _count_workers(self) -> None:
        self._workers_metric.set_workers(self.name, len(self.links))

    def _pick(self) -> WorkerLink:
        """The admitted link with the fewest calls in flight; among equals, the one picked longest ago."""
        ready = [link for link in self.links if link.state is State.UP and link.refusal is None]
        if not ready:
            raise unavailable(self.name, "no worker is connected")
        link = min(ready, key=lambda candidate: (candidate.in_flight, candidate.last_pick))
        link.last_pick = next(self._picks)
        return link

    async def request(
        self,
        method: str,
        params: Json,
        report: ProgressFnT | None = None,
        *,
        lean: bool = False,
        capabilities: Json | None = None,
    ) -> Json:
        """Send one request to one worker (see `_pick`); each attempt goes to exactly one."""
        link = self._pick()
        link.in_flight += 1
        if method == "tools/call":
            link.calls += 1
            self._workers_metric.count_worker_call(self.name, link.token_name)
        try:
            return await link.request(method, params, report, capabilities=capabilities)
        finally:
            link.in_flight -= 1

    async def subscribe(self, uri: str, on: bool) -> None:
        """Workers offer tools only: there are no resources to follow."""
        raise MCPError(types.INVALID_PARAMS, f"server '{self.name}' offers no resources")

    @property
    def protocol_version(self) -> str | None:
        """None: each link negotiates its own revision (see `describe_links`)."""
        return None

    @property
    def ending(self) -> bool:
        """False: a link that ends leaves the others serving."""
        return False

    @property
    def credential_kind(self) -> str | None:
        """None: workers present the gateway's tokens, the gateway holds no credential of theirs."""
        return None

    def reconnect(self) -> None:
        """Nothing to dial: a worker whose link ends dials in anew."""

    def status(self) -> dict[str, Any]:
        """The server's status, with how many workers offer it."""
        return {**super().status(), "workers": len(self.links)}

    def describe_links(self) -> list[Json]:
        """Every connection serving this name, admitted ones first."""
        pending = sorted(self.pending, key=lambda link: link.id)
        return [link.describe() for link in [*self.links, *pending]]
