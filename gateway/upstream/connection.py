"""Upstream: the life of one connection to one MCP server, owned by a single task.

The owner task connects (stdio, streamable HTTP or legacy SSE), negotiates modern-first
(`server/discover`, falling back to `initialize`), walks every page of `tools/list`, applies the
server's filters, then serves calls until the connection ends; it reconnects with backoff.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import mcp.types as types
from mcp import ClientSession, MCPError
from mcp.client.session import IncomingMessage
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost, listen
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import ResourceUpdated

from gateway import __version__
from gateway.config.servers import ConfigError, ResolvedServer, ServerSpec, resolve
from gateway.internals.sdk import negotiate
from gateway.observe import tracing
from gateway.observe.logs import get_logger
from gateway.observe.metrics import Metrics
from gateway.policy.backoff import Backoff
from gateway.policy.egress import EgressPolicy, check_url
from gateway.protocol.era import Era
from gateway.protocol.errors import EgressDenied, State, describe, unavailable
from gateway.upstream.invoke import Channel, Invoker, Line
from gateway.upstream.offers import Offers, list_offers
from gateway.upstream.sandbox import sandbox_for
from gateway.upstream.server import ChangeCallback, ServerState
from gateway.upstream.tokens import Tokens
from gateway.upstream.transports.http import streamable_http_transport
from gateway.upstream.transports.http11 import HttpWire
from gateway.upstream.transports.sse import sse_transport
from gateway.upstream.transports.stdio import DirectChannel, stdio_transport

if TYPE_CHECKING:
    from opentelemetry.trace import Span

Json = dict[str, Any]
CLIENT_INFO = types.Implementation(name="manifold", version=__version__)
# How many times startup_timeout a try may take at most, after earlier tries ran out of it.
STARTUP_GROWTH = 4.0

log = get_logger("upstream")


class _WatchedReadStream:
    """A read stream that sets `closed` when the transport ends."""

    def __init__(self, inner: Any, closed: anyio.Event) -> None:
        self._inner, self._closed = inner, closed

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._closed.set()
            raise
        return item

    async def aclose(self) -> None:
        self._closed.set()
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)


async def _unchanged(_: Upstream) -> None:
    """A sibling connection's listings change nothing."""


LIST_CHANGES = (
    types.ToolListChangedNotification,
    types.PromptListChangedNotification,
    types.ResourceListChangedNotification,
)


class Upstream(ServerState):
    """One server the gateway dials: its state, its filtered tools, and the session that serves its calls."""

    def __init__(
        self,
        spec: ServerSpec,
        on_change: ChangeCallback,
        environ: Mapping[str, str] | None = None,
        metrics: Metrics | None = None,
        *,
        credentials: Mapping[str, Any] | None = None,
        egress: EgressPolicy | None = None,
        source: str = "config",
        fast: bool = True,
        tokens: Tokens | None = None,
    ) -> None:
        super().__init__(spec, on_change, metrics, source=source)
        self._tokens = tokens
        self._fast = fast
        self._direct: DirectChannel | None = None
        self._wire: HttpWire | None = None
        self._credentials = credentials or {}
        self._egress = egress
        self.egress = egress
        self._environ = os.environ if environ is None else environ
        self._listen_scope: anyio.CancelScope | None = None
        self.session: ClientSession | None = None
        self.protocol_version: str | None = None
        self._refresh_wanted = anyio.Event()
        self._closed = anyio.Event()
        self._backoff = Backoff(1.0, 60.0, healthy_after=30.0)
        # A try that ran out of startup_timeout gives the next one twice the time, up to STARTUP_GROWTH times it:
        # a server that boots slowly on a busy host (or an npx download) comes up instead of being cut each time.
        self._startup_scale = 1.0
        self._reconnect_now = False
        self._wake = anyio.Event()  # set by `reconnect`: ends a wait between tries
        self._tasks: anyio.abc.TaskGroup | None = None
        self._invoker = Invoker(spec, self)

    def sibling(self, spec: ServerSpec, env: Mapping[str, str] | None = None) -> Upstream:
        """Another connection to this server (a conversation's own, a 2025-era session beside a 2026 one): the
        same environment (plus `env`), credentials, egress rules, source and channels; its listings change
        nothing, since the catalog comes from this connection."""
        return Upstream(
            spec,
            _unchanged,
            {**self._environ, **(env or {})},
            credentials=self._credentials,
            egress=self.egress,
            source=self.source,
            fast=self._fast,
            tokens=self._tokens,
        )

    def share_slots(self, other: Upstream) -> None:
        """Take the call slots of `other` (the server's main connection), so both together keep its limits."""
        self._invoker.slots = other._invoker.slots

    async def run(self) -> None:
        """The owner task: connect, serve, reconnect with backoff, until cancelled."""
        if self.spec.disabled:
            self.settled.set()
            return
        try:
            resolved = resolve(self.spec, self._environ, self._credentials)
        except ConfigError as e:
            await self._set_state(State.DOWN, "; ".join(e.problems))
            self.settled.set()
            return
        while True:
            started, connections = time.monotonic(), self.connections
            try:
                await self._traced_connect(resolved)
                reason = "connection closed"
            except Exception as e:
                reason = describe(e)
                self._report_bug(e)
                if self.connections == connections and self._metrics is not None:
                    self._metrics.count_connect(self.name, "error")
            healthy_for = time.monotonic() - started if self.connections > connections else 0.0
            self.session = None
            await self._set_state(State.DOWN, reason)
            self.settled.set()
            delay = 0.0 if self._reconnect_now else self._backoff.delay(healthy_for)
            self._reconnect_now = False
            log.info("upstream reconnect scheduled", server=self.name, delay_s=round(delay, 2))
            with anyio.move_on_after(delay):
                await self._wake.wait()
            self._wake, self._reconnect_now = anyio.Event(), False
            await self._set_state(State.CONNECTING, self.error)

    async def _traced_connect(self, resolved: ResolvedServer) -> None:
        """`_connect_and_serve`, in a `connect` span (tracing on only) that ends once the server is listed."""
        tracer = tracing.ACTIVE
        if tracer is None:
            await self._connect_and_serve(resolved)
            return
        attributes = {
            "manifold.server": self.name,
            "manifold.transport": self.spec.kind,
            "manifold.source": self.source,
        }
        connecting = tracer.begin("connect", attributes)
        try:
            await self._connect_and_serve(resolved, connecting)
        except BaseException as e:
            tracing.end(connecting, e)
            raise
        finally:
            tracing.end(connecting)

    async def _connect_and_serve(self, resolved: ResolvedServer, connecting: Span | None = None) -> None:
        self._closed = anyio.Event()
        budget = self.spec.startup_timeout * self._startup_scale
        # The startup deadline wraps the whole connection so every context is exited in order;
        # it is lifted once the first listing is in.
        with anyio.CancelScope(deadline=anyio.current_time() + budget) as startup:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(await self._transport(resolved))
                session = await stack.enter_async_context(
                    ClientSession(
                        _WatchedReadStream(read, self._closed),  # type: ignore[arg-type]
                        write,
                        read_timeout_seconds=None,  # each request sets its own bound
                        message_handler=self._on_message,
                        client_info=CLIENT_INFO,
                        **self.callers.callbacks(),
                    )
                )
                if self.spec.protocol == "auto":
                    # half the startup time for the probe leaves the other half for the handshake after it
                    await negotiate(session, budget / 2)
                elif Era.of(self.spec.protocol).modern:
                    await session.discover()
                else:
                    await session.initialize()
                offers = await self._list(session, connecting)
                self._report_listings(offers)
                startup.deadline = math.inf
                self._startup_scale = 1.0
                if connecting is not None:
                    connecting.set_attribute("mcp.protocol.version", session.protocol_version or "")
                    tracing.end(connecting)
                await self._serve(session, offers)
        if startup.cancelled_caught:
            self._startup_scale = min(self._startup_scale * 2, STARTUP_GROWTH)
            raise TimeoutError(f"no answer within {budget:g} s (startup_timeout {self.spec.startup_timeout:g} s)")

    async def _serve(self, session: ClientSession, offers: Offers) -> None:
        self.session = session
        self.protocol_version = session.protocol_version
        self.offers = offers
        if self._metrics is not None:
            self._metrics.count_connect(self.name, "ok")
        await self._set_state(State.UP, None)
        self.settled.set()
        async with anyio.create_task_group() as tg:
            self._tasks = tg
            tg.start_soon(self._refresher, session)
            if Era.of(session.protocol_version).modern:
                tg.start_soon(self._listen, session)
            if self.spec.refresh_interval:
                tg.start_soon(self._poll, self.spec.refresh_interval)
            await self._closed.wait()
            self._tasks = None
            tg.cancel_scope.cancel()
        # Down once the connection is known gone, not once its transport is torn down (a stdio server's process
        # group is given seconds to exit): its tools leave the catalog, and callers are told, now.
        await self._set_state(State.DOWN, "connection closed")

    async def _transport(self, r: ResolvedServer) -> AbstractAsyncContextManager[Any]:
        kind = self.spec.kind
        if kind == "stdio":
            assert r.command is not None
            if self._egress is not None:
                raise EgressDenied("runtime servers must use HTTP(S) (a stdio server needs runtime.stdio: true)")
            self._direct = DirectChannel() if self._fast else None
            limits = self._metrics.count_sandbox_limit if self._metrics is not None else None
            sandbox = await sandbox_for(self.spec, limits)
            return stdio_transport(self.name, r.command, r.args, r.env, r.cwd, self._direct, sandbox)
        assert r.url is not None
        # Each connection re-checks the URL of a server not read from the config file: DNS answers can change.
        if self._egress is None and self.source != "config":
            raise EgressDenied(f"a {self.source} server connects only under the egress rules, and it was given none")
        checked = await check_url(r.url, self._egress) if self._egress is not None else None
        bearer = None
        if r.oauth is not None:
            if self._tokens is None:
                self._tokens = Tokens()
            bearer = self._tokens.source(r.oauth)
            await (
                bearer.token()
            )  # obtained at connect: a credential that cannot get one is the reason the server is down
        if kind == "sse":
            return sse_transport(r.url, r.headers, checked, bearer, self.spec.timeout)

        def set_wire(wire: HttpWire | None) -> None:
            self._wire = wire

        return streamable_http_transport(
            r.url,
            r.headers,
            checked,
            bearer,
            timeout=self.spec.timeout,
            # the request hook also carries a traced request's `traceparent` (`core.forward`)
            forward_headers=bool(self.spec.forward_headers) or tracing.ACTIVE is not None,
            lean=self._fast,
            on_wire=set_wire,
        )

    async def _list(self, session: ClientSession, parent: Span | None = None) -> Offers:
        """What the server offers, every page of it, after its filters (a failed listing keeps what it held); in a
        `list` span with tracing on (a child of `parent`, the connection's, when given)."""
        tracer = tracing.ACTIVE
        if tracer is None:
            return await list_offers(session, self.spec, previous=self.offers)
        with tracer.internal("list", {"manifold.server": self.name}, parent) as span:
            offers = await list_offers(session, self.spec, previous=self.offers)
            if offers.degraded:
                span.set_attribute("manifold.degraded", sorted(offers.degraded))
            return offers

    def _report_listings(self, offers: Offers) -> None:
        """Log each listing that newly failed (or now fails for another reason) once, and one that recovered;
        count every failure."""
        before, now = dict(self.offers.degraded), dict(offers.degraded)
        for listing, reason in now.items():
            if before.get(listing) != reason:
                log.warning(
                    "upstream listing failed; serving without it", server=self.name, listing=listing, reason=reason
                )
        for listing in before.keys() - now.keys():
            log.info("upstream listing recovered", server=self.name, listing=listing)
        if self._metrics is not None:
            self._metrics.set_listings(self.name, now)

    @property
    def credential_kind(self) -> str | None:
        """What kind of credential the server uses (`static`, `oauth:client_credentials`, ...), never its values."""
        credential = self._credentials.get(self.spec.credential) if self.spec.credential is not None else None
        kind = getattr(credential, "kind", None)
        return kind if isinstance(kind, str) else None

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(
            message,
            types.ToolListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceListChangedNotification,
        ):
            self._refresh_wanted.set()
        elif isinstance(message, types.ResourceUpdatedNotification):
            await self._updated(str(message.params.uri))
        elif isinstance(message, Exception):
            log.warning("upstream transport error", server=self.name, reason=describe(message))

    async def _updated(self, uri: str) -> None:
        if self.on_resource_updated is not None:
            await self.on_resource_updated(self, uri)

    async def subscribe(self, uri: str, on: bool) -> None:
        """Follow (or stop following) changes of one resource: `resources/subscribe` on a 2025-era
        session, the listen stream's resource filter on a 2026 one. Raises `MCPError`."""
        session = self.session
        if session is None:
            raise MCPError(types.INTERNAL_ERROR, f"server '{self.name}' is not connected")
        if on:
            self.subscriptions.add(uri)
        else:
            self.subscriptions.discard(uri)
        if Era.of(session.protocol_version).modern:
            if self._listen_scope is not None:
                self._listen_scope.cancel()  # listen again, with the new set of resources
            return
        request: types.SubscribeRequest | types.UnsubscribeRequest = (
            types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
            if on
            else types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
        )
        await session.send_request(
            request,
            types.EmptyResult,
            request_read_timeout_seconds=self.spec.timeout,
        )

    async def _listen(self, session: ClientSession) -> None:
        caps = self.offers.capabilities
        resources = caps.get("resources") or {}
        first = True
        while True:
            with anyio.CancelScope() as self._listen_scope:
                try:
                    async with listen(
                        session,
                        tools_list_changed="tools" in caps,
                        prompts_list_changed="prompts" in caps,
                        resources_list_changed="resources" in caps,
                        resource_subscriptions=sorted(self.subscriptions) if resources.get("subscribe") else (),
                    ) as subscription:
                        if first:  # a change made between the first listing and this acknowledgment was told nobody
                            first = False
                            self._refresh_wanted.set()
                        async for event in subscription:
                            if isinstance(event, ResourceUpdated):
                                await self._updated(event.uri)
                            else:
                                self._refresh_wanted.set()
                except ListenNotSupportedError:
                    return
                except MCPError as e:
                    if e.code == types.METHOD_NOT_FOUND:
                        return  # a modern server without change notices
                    log.info("upstream listen refused", server=self.name, reason=describe(e))
                    await anyio.sleep(5)
                except SubscriptionLost as e:
                    log.info("upstream listen stream lost", server=self.name, reason=describe(e))
                    await anyio.sleep(0.5)
                    self._refresh_wanted.set()

    async def _refresher(self, session: ClientSession) -> None:
        while True:
            await self._refresh_wanted.wait()
            await anyio.sleep(0.05)  # coalesce a burst of change notices into one listing
            self._refresh_wanted = anyio.Event()
            try:
                offers = await self._list(session)
            except MCPError as e:
                log.warning("upstream refresh failed", server=self.name, reason=describe(e))
                if e.code == types.CONNECTION_CLOSED:
                    self._closed.set()
                continue
            self._report_listings(offers)
            if offers != self.offers:
                self.offers = offers
                await self._on_change(self)

    async def _poll(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            self._refresh_wanted.set()

    def status(self) -> dict[str, Any]:
        """The server's status (see `ServerState.status`), with the revision it speaks and listings that failed."""
        status = super().status()
        if self.state is State.UP:
            status["protocol"] = self.protocol_version
            if self.offers.degraded:
                status["degraded"] = dict(self.offers.degraded)
        return status

    def reconnect(self) -> None:
        """Drop the connection and connect again at once (e.g. after the HTTP session expired)."""
        self._reconnect_now = True
        self._closed.set()
        self._wake.set()

    async def request(
        self,
        method: str,
        params: Json,
        report: ProgressFnT | None = None,
        *,
        lean: bool = False,
        capabilities: Json | None = None,
    ) -> Json:
        """Send one request under the server's slots and deadline (see `Invoker.request`) on the connection
        serving now. Raises `CallFailed` while there is none."""
        session = self.session
        if session is None or self.state is not State.UP:
            raise unavailable(self.name, self.error or self.state.value)
        line = Line(session, self.channel, self.protocol_version, self.cancels_by_notice, self.spawn)
        return await self._invoker.request(line, method, params, report, lean=lean, capabilities=capabilities)

    @property
    def channel(self) -> Channel | None:
        """The lean channel calls take, when the connection has one."""
        return self._direct if self._direct is not None else self._wire

    @property
    def cancels_by_notice(self) -> bool:
        """Whether a call is cancelled with `notifications/cancelled` (stdio, and 2025-era HTTP servers);
        on the 2026 HTTP wire, dropping the request's connection is the cancel."""
        return self._direct is not None or not Era.of(self.protocol_version).modern

    @property
    def serving(self) -> bool:
        """Whether the connection is serving (work can be spawned in its task group)."""
        return self._tasks is not None

    def spawn(self, work: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run `work` in the connection's task group: it ends when the connection does."""
        if self._tasks is not None:
            self._tasks.start_soon(work, *args)

    @property
    def ending(self) -> bool:
        """Whether the current connection is known to be gone (it broke under a call, or a reconnect was asked)."""
        return self._closed.is_set()

    def lost(self) -> None:
        """The connection broke under a call: end it, and reconnect with backoff."""
        self._closed.set()
