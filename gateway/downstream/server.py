"""The downstream MCP server: one `/mcp` endpoint for both protocol eras, per-caller views, change fan-out."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from gateway import __version__
from gateway.access import OPEN_VIEW, View
from gateway.calls import call_tool
from gateway.downstream.gate import view_of
from gateway.logs import get_logger
from gateway.registry import Registry

log = get_logger("frontend")
SESSION_HEADER = "mcp-session-id"
# Per-token views (and live changes) make a listing private and immediately stale.
LISTING_CACHE = CacheHint(ttl_ms=0, scope="private")


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
    """Serves each caller its view of the catalog and tells clients when THEIR view changes."""

    def __init__(self, registry: Registry, views: Sequence[View] = (OPEN_VIEW,)) -> None:
        self.registry = registry
        self.views = {view.name: view for view in views}
        self._channels = {name: _Channel() for name in self.views}
        self._legacy_sessions: dict[str, tuple[Any, str]] = {}
        self._listing_cache: dict[tuple[int, str, str], HandlerResult] = {}
        self._seen: dict[str, tuple[str, ...]] = {}
        self.draining = False
        self.calls_in_flight = 0
        self._calls_done = anyio.Event()
        self.server = ManifoldServer(
            "manifold",
            version=__version__,
            instructions="Tools of several MCP servers, each named <server>__<tool>.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
            get_tool_input_schema=self._input_schema,
            cache_hints={"tools/list": LISTING_CACHE},
        )
        # The OpenTelemetry middleware costs CPU on every call and exports nothing without a collector.
        self.server.middleware = [self._track_sessions, self._cached_listing]
        registry.on_catalog_change(self.broadcast_tools_changed)

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        entry = self.registry.catalog.resolve(name)
        return entry.input_schema if entry is not None else None

    def visible(self, view: View) -> list[dict[str, Any]]:
        """The published tools this view may see."""
        if view is OPEN_VIEW:
            return self.registry.catalog.listing
        return [e.tool for e in self.registry.catalog.entries.values() if view.allows(e)]

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if params is not None and params.cursor:
            raise MCPError(types.INVALID_PARAMS, "Invalid cursor: the catalog is served in one page")
        result: dict[str, Any] = {"tools": self.visible(request_view(ctx))}
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            result["resultType"] = "complete"
        return result  # type: ignore[return-value]

    async def _listen(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        return await self._channels[request_view(ctx).name].handler(ctx, params)

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        if self.draining:
            raise MCPError(types.INTERNAL_ERROR, "The gateway is shutting down; retry on another replica")
        with self.tracking_call():
            return await call_tool(self.registry, ctx, params, request_view(ctx))

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

    def knows_session(self, session_id: str) -> bool:
        """Whether a 2025-era session has been seen serving a request (so it is initialised and tracked)."""
        return session_id in self._legacy_sessions

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

    async def _cached_listing(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Serve tools/list from a result shaped once per catalog version, protocol version and view."""
        if ctx.method != "tools/list" or (ctx.params and ctx.params.get("cursor")):
            return await call_next(ctx)
        version = self.registry.catalog.version
        key = (version, ctx.protocol_version, request_view(ctx).name)
        cached = self._listing_cache.get(key)
        if cached is None:
            cached = await call_next(ctx)
            self._listing_cache = {k: v for k, v in self._listing_cache.items() if k[0] == version}
            self._listing_cache[key] = cached
        return cached

    async def _track_sessions(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        self.registry.metrics.count_request(ctx.method)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and ctx.request is not None:
            session_id = ctx.request.headers.get(SESSION_HEADER)
            if session_id and session_id not in self._legacy_sessions:
                self._legacy_sessions[session_id] = (ctx.session, request_view(ctx).name)
        return await call_next(ctx)

    def live_sessions(self) -> list[str]:
        """Ids of the open 2025-era sessions (closed ones are pruned first)."""
        self._prune_sessions()
        return list(self._legacy_sessions)

    def legacy_session_count(self) -> int:
        """Open 2025-era sessions."""
        return len(self.live_sessions())

    def _prune_sessions(self) -> None:
        manager = getattr(self.server, "_session_manager", None)
        live = getattr(manager, "_server_instances", None)
        if live is None:
            return
        for session_id in [s for s in self._legacy_sessions if s not in live]:
            del self._legacy_sessions[session_id]

    async def broadcast_tools_changed(self) -> None:
        """Tell the clients whose view changed, each in its own era's way."""
        changed = []
        for name, view in self.views.items():
            names = tuple(t["name"] for t in self.visible(view))
            if self._seen.get(name) != names:
                self._seen[name] = names
                changed.append(name)
        self._prune_sessions()
        for name in changed:
            await self._channels[name].bus.publish(ToolsListChanged())
        for session, view_name in list(self._legacy_sessions.values()):
            if view_name in changed:
                try:
                    await session.send_tool_list_changed()
                except Exception as e:
                    log.debug("list_changed not delivered", reason=str(e))
