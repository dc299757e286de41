"""The downstream MCP server: one `/mcp` endpoint for both protocol eras, and list_changed fan-out."""

from __future__ import annotations

from collections.abc import Mapping
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
from gateway.calls import call_tool
from gateway.logs import get_logger
from gateway.registry import Registry

log = get_logger("frontend")
SESSION_HEADER = "mcp-session-id"


class GatewayServer(Server[Any]):
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


class Frontend:
    """Serves the registry's catalog downstream and tells every client when it changes."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.bus = InMemorySubscriptionBus()
        self.listen_handler = ListenHandler(self.bus)
        self._legacy_sessions: dict[str, Any] = {}
        self._listing_cache: dict[tuple[int, str], HandlerResult] = {}
        self.draining = False
        self.calls_in_flight = 0
        self._calls_done = anyio.Event()
        self.server = GatewayServer(
            "manifold",
            version=__version__,
            instructions="Tools of several MCP servers, each named <server>__<tool>.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self.listen_handler,
            get_tool_input_schema=self._input_schema,
            # Per-token views (and live changes) make a listing private and immediately stale.
            cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
        )
        # The OpenTelemetry middleware costs CPU on every call and exports nothing without a collector.
        self.server.middleware = [self._track_sessions, self._cached_listing]
        registry.on_catalog_change(self.broadcast_tools_changed)

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        entry = self.registry.catalog.resolve(name)
        return entry.input_schema if entry is not None else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if params is not None and params.cursor:
            raise MCPError(types.INVALID_PARAMS, "Invalid cursor: the catalog is served in one page")
        result: dict[str, Any] = {"tools": self.registry.catalog.listing}
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            result["resultType"] = "complete"
        return result  # type: ignore[return-value]

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        if self.draining:
            raise MCPError(types.INTERNAL_ERROR, "The gateway is shutting down; retry on another replica")
        self.calls_in_flight += 1
        try:
            return await call_tool(self.registry, ctx, params)
        finally:
            self.calls_in_flight -= 1
            if self.calls_in_flight == 0:
                self._calls_done.set()

    async def drain(self, timeout: float) -> None:
        """Refuse new calls, close listen streams, and let calls in flight finish (up to `timeout` s)."""
        self.draining = True
        self.listen_handler.close()
        if self.calls_in_flight:
            log.info("draining calls in flight", calls=self.calls_in_flight, timeout_s=timeout)
            self._calls_done = anyio.Event()
            with anyio.move_on_after(timeout):
                await self._calls_done.wait()
        # The last results still travel through the transport's streams to the socket; give them a moment
        # before the caller (GatewayServer.shutdown) ends every remaining stream.
        await anyio.sleep(0.25)

    async def _cached_listing(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Serve tools/list from a result shaped once per catalog version and protocol version."""
        if ctx.method != "tools/list" or (ctx.params and ctx.params.get("cursor")):
            return await call_next(ctx)
        key = (self.registry.catalog.version, ctx.protocol_version)
        cached = self._listing_cache.get(key)
        if cached is None:
            cached = await call_next(ctx)
            self._listing_cache = {k: v for k, v in self._listing_cache.items() if k[0] == key[0]}
            self._listing_cache[key] = cached
        return cached

    async def _track_sessions(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        self.registry.metrics.count_request(ctx.method)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and ctx.request is not None:
            session_id = ctx.request.headers.get(SESSION_HEADER)
            if session_id and session_id not in self._legacy_sessions:
                self._legacy_sessions[session_id] = ctx.session
        return await call_next(ctx)

    def legacy_session_count(self) -> int:
        """Open 2025-era sessions (closed ones are pruned first)."""
        self._prune_sessions()
        return len(self._legacy_sessions)

    def _prune_sessions(self) -> None:
        manager = getattr(self.server, "_session_manager", None)
        live = getattr(manager, "_server_instances", None)
        if live is None:
            return
        for session_id in [s for s in self._legacy_sessions if s not in live]:
            del self._legacy_sessions[session_id]

    async def broadcast_tools_changed(self) -> None:
        """Tell every downstream client the tool list changed, in its own era's way."""
        await self.bus.publish(ToolsListChanged())
        self._prune_sessions()
        for session in list(self._legacy_sessions.values()):
            try:
                await session.send_tool_list_changed()
            except Exception as e:
                log.debug("list_changed not delivered", reason=str(e))
