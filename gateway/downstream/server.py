"""The SDK's server behind `/mcp`: handshakes, listen streams, and every request the shortcut does not take."""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from gateway.access import OPEN_VIEW, View
from gateway.calls import SERVER_INFO, call_tool
from gateway.downstream.gate import view_of
from gateway.downstream.listing import LISTING_CACHE, Listings
from gateway.downstream.sessions import Sessions
from gateway.logs import get_logger
from gateway.registry import Registry

log = get_logger("server")
SESSION_HEADER = "mcp-session-id"


class ManifoldServer(Server[Any]):
    """The SDK's low-level server, advertising `tools.listChanged` to 2025-era clients too."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def request_view(ctx: ServerRequestContext[Any, Any]) -> View:
    """The caller's view, as the auth gate left it on the HTTP request."""
    return view_of(ctx.request.state) if ctx.request is not None else OPEN_VIEW


class _Channel:
    """One view's change notices to 2026-era clients: a bus and its listen handler."""

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        self.handler = ListenHandler(self.bus)


class Frontend:
    """Serves each caller its view of the catalog and tells clients when THEIR view changes.

    `confirm_key` seals 2026-era confirmations (`requestState`); replicas behind one load balancer
    share it, so a retry that lands on another replica is not asked again.
    """

    def __init__(
        self, registry: Registry, views: Sequence[View] = (OPEN_VIEW,), confirm_key: bytes | None = None
    ) -> None:
        self.registry = registry
        self.views = {view.name: view for view in views}
        self.sessions = Sessions()
        self.listings = Listings(registry.catalog)
        self.confirm_key = confirm_key or secrets.token_bytes(32)
        self._channels = {name: _Channel() for name in self.views}
        self._seen: dict[str, tuple[str, ...]] = {}
        self.draining = False
        self.calls_in_flight = 0
        self._calls_done = anyio.Event()
        self.server = ManifoldServer(
            SERVER_INFO["name"],
            version=SERVER_INFO["version"],
            instructions="Tools of several MCP servers, each named <server>__<tool>.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
            get_tool_input_schema=self._input_schema,
            cache_hints={"tools/list": LISTING_CACHE},
        )
        # The OpenTelemetry middleware costs CPU on every call and exports nothing without a collector.
        self.server.middleware = [self._track_sessions]
        registry.on_catalog_change(self.broadcast_tools_changed)
        registry.metrics.downstream_sessions.set_function(self.sessions.count)

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        entry = self.registry.catalog.resolve(name)
        return entry.input_schema if entry is not None else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if params is not None and params.cursor:
            raise MCPError(types.INVALID_PARAMS, "Invalid cursor: the catalog is served in one page")
        return self.listings.result(request_view(ctx), ctx.protocol_version)  # type: ignore[return-value]

    async def _listen(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        return await self._channels[request_view(ctx).name].handler(ctx, params)

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        with self.tracking_call():
            return await call_tool(
                self.registry,
                ctx,
                params,
                request_view(ctx),
                draining=self.draining,
                confirm_key=self.confirm_key,
            )

    @contextmanager
    def tracking_call(self) -> Iterator[None]:
        """Count a call as in flight, so the shutdown drain waits for it."""
        self.calls_in_flight += 1
        try:
            yield
        finally:
            self.calls_in_flight -= 1
            if self.calls_in_flight == 0:
                self._calls_done.set()

    async def drain(self, timeout: float) -> None:
        """Refuse new calls, close listen streams, and let calls in flight finish (up to `timeout` s)."""
        self.draining = True
        self.close_listen_streams()
        if self.calls_in_flight:
            log.info("draining calls in flight", calls=self.calls_in_flight, timeout_s=timeout)
            self._calls_done = anyio.Event()
            with anyio.move_on_after(timeout):
                await self._calls_done.wait()
        # The last results still travel through the transport's streams to the socket; give them a moment
        # before the caller (DrainingServer.shutdown) ends every remaining stream.
        await anyio.sleep(0.25)

    def close_listen_streams(self) -> None:
        """End every open `subscriptions/listen` stream."""
        for channel in self._channels.values():
            channel.handler.close()

    async def _track_sessions(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        self.registry.metrics.count_request(ctx.method)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and ctx.request is not None:
            session_id = ctx.request.headers.get(SESSION_HEADER)
            if session_id:
                self.sessions.served(session_id, request_view(ctx).name, ctx.session)
        return await call_next(ctx)

    async def broadcast_tools_changed(self) -> None:
        """Tell the clients whose view changed, each in its own era's way."""
        changed = []
        for name, view in self.views.items():
            names = tuple(t["name"] for t in self.listings.visible(view))
            if self._seen.get(name) != names:
                self._seen[name] = names
                changed.append(name)
        for name in changed:
            await self._channels[name].bus.publish(ToolsListChanged())
        for view_name, session in self.sessions.pushers():
            if view_name in changed:
                try:
                    await session.send_tool_list_changed()
                except Exception as e:
                    log.debug("list_changed not delivered", reason=str(e))
