"""The SDK's server behind `/mcp`, assembled: handshakes, listen streams, and every request the shortcut does not
take, handled by method family (`tools`, `content`, `tasks`, `notices`, `handshake`)."""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp import MCPDeprecationWarning, MCPError
from mcp.server import ServerRequestContext
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult

from gateway import SERVER_INFO
from gateway.catalog.merged import Entry
from gateway.config.access import Exposure
from gateway.config.settings import HandoverSettings
from gateway.core.handover import HandOver, Refused
from gateway.core.registry import Registry
from gateway.downstream.content import ContentHandlers
from gateway.downstream.handshake import ManifoldServer, handshake, narrowed
from gateway.downstream.inflight import InFlight
from gateway.downstream.listing import LISTING_CACHE, Listings
from gateway.downstream.notices import Notices
from gateway.downstream.requests import conversation_of, legacy_session, request_owner, request_view, session_of
from gateway.downstream.sessions import Sessions
from gateway.downstream.tasks import TaskHandlers
from gateway.downstream.tools import ToolHandlers
from gateway.internals.sdk import REPLAYED
from gateway.observe import tracing
from gateway.observe.logs import get_logger
from gateway.policy.access import OPEN_VIEW, View
from gateway.policy.egress import EgressPolicy
from gateway.protocol.era import Era
from gateway.relay.asks import asks_through
from gateway.relay.callers import declared_capabilities

if TYPE_CHECKING:
    from gateway.catalog.embedding import Embedding

log = get_logger("server")
FRESH = CacheHint(ttl_ms=0, scope="private")


class Frontend:
    """Serves each caller its view of the catalog and tells clients when THEIR view changes.

    `confirm_key` seals 2026-era confirmations (`requestState`); replicas behind one load balancer
    share it, so a retry that lands on another replica is not asked again.
    """

    def __init__(
        self,
        registry: Registry,
        views: Sequence[View] = (OPEN_VIEW,),
        confirm_key: bytes | None = None,
        exposure: Exposure = "direct",
        search_model: Embedding | None = None,
    ) -> None:
        self.registry = registry
        self.views = {view.name: view for view in views}
        self.sessions = Sessions()
        self.exposure = exposure
        self.listings = Listings(registry.catalog, self.deferred, self._always)
        self.inflight = InFlight()
        self.tools = ToolHandlers(
            registry,
            self.sessions,
            self.listings,
            self.inflight,
            self.deferred,
            confirm_key or secrets.token_bytes(32),
            search_model,
        )
        # servers clients hand over: the egress rules (the defaults until the app gives the configured ones), bounds
        self.handover = HandOver(registry, EgressPolicy.from_allow(()), HandoverSettings())
        self.notices = Notices(registry, self.views, self.sessions, self.listings)
        self.content = ContentHandlers(registry, self.sessions, self.inflight, self.notices)
        self.task_handlers = TaskHandlers(registry, self.sessions, self.inflight, self.tools.tasks)
        # The gateway serves logging on purpose (2025-era clients set a level and get their servers' log
        # messages), so the SDK's notice that 2026-07-28 deprecates it is not for the operator's console.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The logging capability is deprecated", MCPDeprecationWarning)
            self.server = ManifoldServer(
                SERVER_INFO["name"],
                version=SERVER_INFO["version"],
                instructions="Tools of several MCP servers, each named <server>__<tool>.",
                on_list_tools=self.tools.listing,
                on_call_tool=self.tools.call,
                on_subscriptions_listen=self.notices.listen,
                on_list_prompts=self.content.list_prompts,
                on_get_prompt=self.content.get_prompt,
                on_list_resources=self.content.list_resources,
                on_list_resource_templates=self.content.list_templates,
                on_read_resource=self.content.read_resource,
                on_subscribe_resource=self.content.subscribe,
                on_unsubscribe_resource=self.content.unsubscribe,
                on_completion=self.content.complete,
                on_set_logging_level=self.content.set_level,
                get_tool_input_schema=self.tools.input_schema,
                cache_hints={
                    "tools/list": LISTING_CACHE,
                    "prompts/list": FRESH,
                    "resources/list": FRESH,
                    "resources/templates/list": FRESH,
                    "resources/read": FRESH,
                },
            )
        self.server.offered = set()
        self.notices.server = self.server
        self._register()
        registry.on_catalog_change(self.tools.finder.sync)
        registry.on_catalog_change(self.broadcast_tools_changed)
        registry.on_resource_updated(self.notices.resource_updated)
        registry.conversations.alive = self._conversation_alive
        self.sessions.on_end = self._session_ended
        registry.metrics.downstream_sessions.set_function(self.sessions.count)

    def _register(self) -> None:
        """The handlers the SDK's server has no constructor argument for, and the middleware in front of all."""
        add = self.server.add_request_handler
        tasks = self.task_handlers
        add("tasks/get", types.GetTaskRequestParams, tasks.get)
        add("tasks/result", types.GetTaskPayloadRequestParams, tasks.result)
        add("tasks/cancel", types.CancelTaskRequestParams, tasks.cancel)
        add("tasks/update", types.RequestParams, tasks.update)
        add("tasks/list", types.PaginatedRequestParams, tasks.listing)
        add("manifold/servers/add", types.RequestParams, self._hand_over)
        # The SDK's OpenTelemetry middleware costs CPU on every call and exports nothing without a collector; the
        # gateway's own (`_trace`, with tracing on only) makes the server span of each request.
        self.server.middleware = [self._track_sessions]
        if tracing.ACTIVE is not None:
            self.server.middleware.insert(0, self._trace)

    @property
    def draining(self) -> bool:
        """Whether the gateway is shutting down (new calls are refused)."""
        return self.inflight.draining

    @contextmanager
    def tracking_call(self) -> Iterator[None]:
        """Count a call as in flight, so the shutdown drain waits for it."""
        with self.inflight.tracking():
            yield

    def deferred(self, view: View) -> bool:
        """Whether this view lists the search and call tools instead of the catalog."""
        return (view.exposure or self.exposure) == "deferred"

    def _always(self, entry: Entry) -> bool:
        upstream = self.registry.upstreams.get(entry.server)
        override = upstream.spec.tools.get(entry.original) if upstream is not None else None
        return override is not None and override.always

    def _session_ended(self, session_id: str) -> None:
        self.registry.conversations.end(f"session:{session_id}")

    def _conversation_alive(self, conversation: str) -> bool:
        """A 2025 session's conversation lasts as long as the session; a token's, until idle."""
        if conversation.startswith("session:"):
            return self.sessions.live(conversation.removeprefix("session:"))
        return True

    async def _hand_over(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        """`manifold/servers/add`: start the servers this conversation hands over (see `gateway.core.handover`)."""
        raw = ctx.params if isinstance(ctx.params, dict) else {}
        view = request_view(ctx)
        try:
            report = await self.handover.add(
                conversation_of(ctx), request_owner(ctx), view.may_add, raw.get("mcpServers")
            )
        except Refused as e:
            raise MCPError(types.INVALID_PARAMS, str(e)) from None
        if any(r["status"] == "started" for r in report):
            await self.broadcast_tools_changed()
        return {"servers": report}

    async def _trace(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """A SERVER span per request the SDK's server serves (tracing on only; `observe.tracing`): a child of the
        caller's context in `_meta`, else of its `traceparent` header. Not for notifications, nor for a
        `subscriptions/listen` stream (it lasts as long as the caller listens)."""
        tracer = tracing.ACTIVE
        if tracer is None or ctx.request_id is None or ctx.method == "subscriptions/listen":
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, dict) else None
        view = request_view(ctx)
        with tracer.request(
            ctx.method,
            params,
            ctx.request.headers if ctx.request is not None else None,
            version=ctx.protocol_version,
            session_id=legacy_session(ctx),
            request_id=ctx.request_id,
            endpoint=view.endpoint,
            caller=view.name,
            path="sdk",
        ):
            try:
                return await call_next(ctx)
            except MCPError as e:
                tracing.note_failure(e.code)
                raise

    async def _track_sessions(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.request is None or REPLAYED not in ctx.request.headers:  # a woken session's handshake counted once
            self.registry.metrics.count_request(ctx.method)
        if ctx.method in ("initialize", "server/discover"):
            if ctx.request is not None and REPLAYED in ctx.request.headers and (session_id := session_of(ctx)):
                await self._served(session_id, ctx)  # a session taken up here: its GET stream may be opened here next
            return narrowed(self.registry, await call_next(ctx), request_view(ctx))
        if not Era.of(ctx.protocol_version).modern and ctx.request is not None:
            session_id = legacy_session(ctx)
            if session_id:
                await self._served(session_id, ctx)
                if ctx.method == "tools/call" and asks_through(declared_capabilities(ctx)):
                    self.sessions.talking(session_id)
            params = ctx.params if isinstance(ctx.params, dict) else {}
            # Task answers are outside the SDK's result tables (it would drop or refuse them): served here.
            answer: HandlerResult
            if ctx.method == "tools/call" and params.get("task") is not None:
                typed = types.CallToolRequestParams.model_validate(params, by_name=False)
                answer = await self.tools.call(ctx, typed)
                return answer
            if ctx.method == "tasks/result":
                answer = await self.task_handlers.result(
                    ctx, types.GetTaskPayloadRequestParams.model_validate(params, by_name=False)
                )
                return answer
        return await call_next(ctx)

    async def _served(self, session_id: str, ctx: ServerRequestContext[Any, Any]) -> None:
        """Note the SDK session a 2025-era session is served on here; follow its subscriptions once it has one."""
        if self.sessions.served(session_id, request_view(ctx).name, ctx.session):
            await self.notices.follow()

    def handshake(self, params: Any, view: View) -> tuple[dict[str, Any], str] | None:
        """The result of a 2025-era `initialize` with `params`, as the SDK's server gives it (`handshake.handshake`)."""
        return handshake(self.server, self.registry, params, view)

    async def broadcast_tools_changed(self) -> None:
        """Tell the clients whose view of tools, prompts or resources changed, each in its own era's way."""
        await self.notices.broadcast_changes()

    def close_listen_streams(self) -> None:
        """End every open `subscriptions/listen` stream."""
        self.notices.close()

    async def drain(self, timeout: float) -> None:
        """Refuse new calls, close listen streams, and let calls in flight finish (up to `timeout` s)."""
        self.inflight.draining = True
        self.close_listen_streams()
        if self.inflight.count:
            log.info("draining calls in flight", calls=self.inflight.count, timeout_s=timeout)
        await self.inflight.wait(timeout)
        # The last results still travel through the transport's streams to the socket; give them a moment
        # before the caller (DrainingServer.shutdown) ends every remaining stream.
        await anyio.sleep(0.25)
