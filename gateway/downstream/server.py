"""The SDK's server behind `/mcp`: handshakes, listen streams, prompts, resources, completions, log levels, and
every call the shortcut does not take."""

from __future__ import annotations

import secrets
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPDeprecationWarning, MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.types.methods import serialize_server_result
from pydantic import ValidationError

from gateway import surface
from gateway.access import OPEN_VIEW, Exposure, View
from gateway.calls import SERVER_INFO, call_tool, forwardable_meta
from gateway.catalog import Entry
from gateway.conversations import CONVERSATION, conversation_key
from gateway.downstream.callers import SessionCaller, declared_capabilities
from gateway.downstream.gate import owner_of, view_of
from gateway.downstream.held import HeldCalls
from gateway.downstream.listing import LISTING_CACHE, Listings
from gateway.downstream.sessions import Sessions
from gateway.egress import EgressPolicy
from gateway.era import Era, handshake_version
from gateway.exposure import (
    CALL_TOOL,
    OWN_TOOLS,
    SEARCH_TOOL,
    BadInput,
    Finder,
    bad_input_result,
    call_request,
    found_result,
    search_request,
)
from gateway.handover import HandOver, Refused
from gateway.internals.sdk import REPLAYED
from gateway.logs import get_logger
from gateway.registry import Registry
from gateway.settings import HandoverSettings
from gateway.tasks import Tasks
from gateway.upstream.asks import ASKING
from gateway.upstream.connection import Upstream
from gateway.upstream.errors import State

log = get_logger("server")
SESSION_HEADER = "mcp-session-id"
MAX_REVEALED = 500  # tools a search may add to one 2025 session's listing
PAGE_SIZE = 100
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
VIEWED = ("prompts", "resources", "completions", "logging", "tasks")
CHANGES = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
FRESH = CacheHint(ttl_ms=0, scope="private")


def page(items: list[Any], cursor: str | None, key: str, version: str) -> Json:
    """One page of a listing; the cursor is the offset of the next page."""
    start = 0
    if cursor:
        if not cursor.isdigit() or int(cursor) > len(items):
            raise MCPError(types.INVALID_PARAMS, f"Invalid cursor: {cursor[:64]!r}")
        start = int(cursor)
    result: Json = {key: items[start : start + PAGE_SIZE]}
    if start + PAGE_SIZE < len(items):
        result["nextCursor"] = str(start + PAGE_SIZE)
    return Era.of(version).with_result_type(result)


Json = dict[str, Any]


def _rounds(params: Any) -> Json:
    """A 2026 retry's `inputResponses` and `requestState` (wire form), to pass on unchanged."""
    dumped: Json = params.model_dump(
        by_alias=True, mode="json", exclude_none=True, include={"input_responses", "request_state"}
    )
    return dumped


class ManifoldServer(Server[Any]):
    """The SDK's low-level server, advertising `listChanged` to 2025-era clients too, and only the capabilities
    some server behind the gateway offers."""

    offered: set[str] | None = None

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        offered = self.offered
        if offered is None:
            return capabilities
        update: Json = {}
        for name in ("prompts", "resources", "completions", "logging"):
            if name not in offered:
                update[name] = None
        if "tasks" in offered and not Era.of(protocol_version).modern:
            update["tasks"] = types.ServerTasksCapability.model_validate(
                {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
            )
        if "resources" in offered and capabilities.resources is not None and "subscribe" not in offered:
            update["resources"] = capabilities.resources.model_copy(update={"subscribe": False})
        return capabilities.model_copy(update=update)

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or CHANGES,
            experimental_capabilities,
            extensions,
        )


def _own_result(result: Json, version: str) -> Json:
    """A result of one of the gateway's own tools, shaped for the caller's protocol era."""
    return Era.of(version).shape(result, "tools/call", SERVER_INFO)


def request_view(ctx: ServerRequestContext[Any, Any]) -> View:
    """The caller's view, as the auth gate left it on the HTTP request."""
    return view_of(ctx.request.state) if ctx.request is not None else OPEN_VIEW


def request_owner(ctx: ServerRequestContext[Any, Any]) -> str:
    """Who the caller is (its token, or its OAuth rule and subject), as the auth gate left it."""
    return owner_of(ctx.request.state) if ctx.request is not None else OPEN_VIEW.name


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
        self,
        registry: Registry,
        views: Sequence[View] = (OPEN_VIEW,),
        confirm_key: bytes | None = None,
        exposure: Exposure = "direct",
    ) -> None:
        self.registry = registry
        self.views = {view.name: view for view in views}
        self.sessions = Sessions()
        self.exposure = exposure
        self.listings = Listings(registry.catalog, self.deferred, self._always)
        self.finder = Finder(registry.catalog)
        self.confirm_key = confirm_key or secrets.token_bytes(32)
        self._channels = {name: _Channel() for name in self.views}
        self._seen: dict[tuple[str, str], Any] = {}
        self._listening: Counter[tuple[str, str]] = Counter()
        self._following: set[tuple[str, str]] = set()
        self.draining = False
        self.held = HeldCalls()
        self.tasks = Tasks()
        # servers clients hand over: the egress rules (the defaults until the app gives the configured ones), bounds
        self.handover = HandOver(registry, EgressPolicy.from_allow(()), HandoverSettings())
        self.calls_in_flight = 0
        self._calls_done = anyio.Event()
        # The gateway serves logging on purpose (2025-era clients set a level and get their servers' log
        # messages), so the SDK's notice that 2026-07-28 deprecates it is not for the operator's console.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The logging capability is deprecated", MCPDeprecationWarning)
            self.server = ManifoldServer(
                SERVER_INFO["name"],
                version=SERVER_INFO["version"],
                instructions="Tools of several MCP servers, each named <server>__<tool>.",
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_subscriptions_listen=self._listen,
                on_list_prompts=self._list_prompts,
                on_get_prompt=self._get_prompt,
                on_list_resources=self._list_resources,
                on_list_resource_templates=self._list_templates,
                on_read_resource=self._read_resource,
                on_subscribe_resource=self._subscribe,
                on_unsubscribe_resource=self._unsubscribe,
                on_completion=self._complete,
                on_set_logging_level=self._set_level,
                get_tool_input_schema=self._input_schema,
                cache_hints={
                    "tools/list": LISTING_CACHE,
                    "prompts/list": FRESH,
                    "resources/list": FRESH,
                    "resources/templates/list": FRESH,
                    "resources/read": FRESH,
                },
            )
        self.server.offered = set()
        self.server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._task_get)
        self.server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._task_result)
        self.server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._task_cancel)
        self.server.add_request_handler("tasks/update", types.RequestParams, self._task_update)
        self.server.add_request_handler("manifold/servers/add", types.RequestParams, self._hand_over)
        self.server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._task_list)
        # The OpenTelemetry middleware costs CPU on every call and exports nothing without a collector.
        self.server.middleware = [self._track_sessions]
        registry.on_catalog_change(self.finder.sync)
        registry.on_catalog_change(self.broadcast_tools_changed)
        registry.on_resource_updated(self.resource_updated)
        registry.conversations.alive = self._conversation_alive
        self.sessions.on_end = self._session_ended
        registry.metrics.downstream_sessions.set_function(self.sessions.count)

    def _session_ended(self, session_id: str) -> None:
        self.registry.conversations.end(f"session:{session_id}")

    def deferred(self, view: View) -> bool:
        """Whether this view lists the search and call tools instead of the catalog."""
        return (view.exposure or self.exposure) == "deferred"

    def _always(self, entry: Entry) -> bool:
        upstream = self.registry.upstreams.get(entry.server)
        override = upstream.spec.tools.get(entry.original) if upstream is not None else None
        return override is not None and override.always

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        entry = self.registry.catalog.resolve(name)
        return entry.input_schema if entry is not None else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if params is not None and params.cursor:
            raise MCPError(types.INVALID_PARAMS, "Invalid cursor: the catalog is served in one page")
        view = request_view(ctx)
        result = self.listings.result(view, ctx.protocol_version)
        own = self.registry.conversations.listing(CONVERSATION.get())
        revealed = self._revealed_tools(ctx, view, {t["name"] for t in result["tools"]})
        if own or revealed:
            result = {**result, "tools": [*result["tools"], *revealed, *own]}
        return result  # type: ignore[return-value]

    def _revealed_tools(self, ctx: ServerRequestContext[Any], view: View, listed: set[str]) -> list[Json]:
        """The tools a search returned to this 2025 session that are still in its view (deferred exposure)."""
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        names = self.sessions.revealed(session_id)
        if not names:
            return []
        entries = self.registry.catalog.entries
        return [entries[n].tool for n in sorted(names) if n in entries and n not in listed and view.allows(entries[n])]

    async def _own_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        """`manifold__search_tools` and `manifold__call_tool`, for callers with deferred exposure."""
        view = request_view(ctx)
        if params.name == SEARCH_TOOL:
            try:
                query, limit, server = search_request(params.arguments or {})
            except BadInput as e:
                return _own_result(bad_input_result(SEARCH_TOOL, str(e)), ctx.protocol_version)
            found = self.finder.search(query, limit, view.allows, server)
            log.info("tool search", request_id=ctx.request_id, results=len(found), server=server)
            await self._reveal(ctx, [e.public for e in found])
            return _own_result(found_result(found, query), ctx.protocol_version)
        try:
            name, arguments = call_request(params.arguments or {})
        except BadInput as e:
            return _own_result(bad_input_result(CALL_TOOL, str(e)), ctx.protocol_version)
        inner = params.model_copy(update={"name": name, "arguments": arguments})
        try:
            return await self._call_tool(ctx, inner)
        except MCPError as e:
            if e.code != types.INVALID_PARAMS:
                raise
            return _own_result(bad_input_result(CALL_TOOL, e.error.message), ctx.protocol_version)

    async def _reveal(self, ctx: ServerRequestContext[Any], names: list[str]) -> None:
        """Add found tools to a 2025 session's listing, and tell it its listing changed."""
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        if Era.of(ctx.protocol_version).modern or not session_id or not names:
            return
        if self.sessions.reveal(session_id, names, MAX_REVEALED):
            try:
                await ctx.session.send_tool_list_changed()
            except Exception as e:
                log.debug("list_changed not delivered", reason=str(e))

    async def _hand_over(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        """`manifold/servers/add`: start the servers this conversation hands over (see `gateway.handover`)."""
        raw = ctx.params if isinstance(ctx.params, dict) else {}
        conversation = CONVERSATION.get()
        assert conversation is not None
        view = request_view(ctx)
        try:
            report = await self.handover.add(conversation, request_owner(ctx), view.may_add, raw.get("mcpServers"))
        except Refused as e:
            raise MCPError(types.INVALID_PARAMS, str(e)) from None
        if any(r["status"] == "started" for r in report):
            await self.broadcast_tools_changed()
        return {"servers": report}

    async def _listen(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        view = request_view(ctx)
        notifications = getattr(params, "notifications", None)
        uris = list(getattr(notifications, "resource_subscriptions", None) or ())
        followed = [(server, uri) for uri in uris if (server := self.registry.catalog.route_uri(uri, view.sees))]
        self._listening.update(followed)
        try:
            if followed:
                await self._follow()
            return await self._channels[view.name].handler(ctx, params)
        finally:
            self._listening.subtract(followed)
            self._listening = +self._listening
            if followed:
                with anyio.CancelScope(shield=True):
                    await self._follow()

    def _caller(self, ctx: ServerRequestContext[Any]) -> SessionCaller:
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        key = session_id or f"request:{id(ctx)}"
        return SessionCaller(ctx, key, self.sessions.level(session_id))

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        with self.tracking_call():
            caller = self._caller(ctx)
            if caller.modern and HeldCalls.ours(params.request_state):
                held = self.held.find(params.request_state, request_owner(ctx), params.name)
                if held is None:
                    raise MCPError(
                        types.INVALID_PARAMS,
                        "requestState is unknown, expired or was altered (or it is another caller's or another tool's)",
                    )
                responses = params.model_dump(by_alias=True, mode="json", include={"input_responses"})
                held.answer(responses.get("inputResponses") or {})
                return await self.held.next_answer(held)
            if params.name in OWN_TOOLS and self.deferred(request_view(ctx)):
                return await self._own_tool(ctx, params)
            upstream = self._holdable(caller, params.name, request_view(ctx))
            if upstream is not None:
                trust = "trusted" if upstream.spec.trusted else "outside"
                labels = {"manifold/server": upstream.name, "manifold/trust": trust}
                held = self.held.open(
                    caller.capabilities, upstream.spec.timeout, labels, owner=request_owner(ctx), tool=params.name
                )

                async def call() -> Any:
                    return await call_tool(
                        self.registry,
                        ctx,
                        params,
                        request_view(ctx),
                        draining=self.draining,
                        confirm_key=self.confirm_key,
                        caller=held,
                    )

                upstream.spawn(self.held.run, held, call)
                return await self.held.next_answer(held)
            result = await call_tool(
                self.registry,
                ctx,
                params,
                request_view(ctx),
                draining=self.draining,
                confirm_key=self.confirm_key,
                caller=caller,
            )
            if (entry := self.registry.catalog.resolve(params.name)) is not None:
                result = self.tasks.publish(result, entry.server, self._owner(ctx))
            return result

    def _conversation_alive(self, conversation: str) -> bool:
        """A 2025 session's conversation lasts as long as the session; a token's, until idle."""
        if conversation.startswith("session:"):
            return self.sessions.live(conversation.removeprefix("session:"))
        return True

    def _owner(self, ctx: ServerRequestContext[Any]) -> str:
        """Whose a task is: a 2025-era caller's session, else (sessionless) the caller's token (for an OAuth
        token: its rule and subject)."""
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        if not Era.of(ctx.protocol_version).modern and session_id:
            return f"session:{session_id}"
        return f"token:{request_owner(ctx)}"

    async def _task_get(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        return await self._task(ctx, "tasks/get")

    async def _task_update(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        if not Era.of(ctx.protocol_version).has("tasks/update"):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/update")
        return await self._task(ctx, "tasks/update")

    async def _task_result(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        if not Era.of(ctx.protocol_version).has("tasks/result"):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/result")  # inlined in tasks/get
        with self.tracking_call():
            return await self._task(ctx, "tasks/result")

    async def _task_cancel(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        return await self._task(ctx, "tasks/cancel")

    async def _task(self, ctx: ServerRequestContext[Any], method: str) -> Any:
        params = ctx.params if isinstance(ctx.params, dict) else {}
        if Era.of(ctx.protocol_version).modern:
            if TASKS_EXTENSION not in (declared_capabilities(ctx).get("extensions") or {}):
                raise MCPError(
                    types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                    f"{method} needs the {TASKS_EXTENSION} extension, which this request does not declare",
                    {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
                )
            named = ctx.request.headers.get("mcp-name") if ctx.request is not None else None
            if ctx.request is not None and named != params.get("taskId"):
                raise MCPError(types.HEADER_MISMATCH, f"the Mcp-Name header does not match {method}'s taskId")
        return await self.tasks.request(
            self.registry,
            method,
            params,
            self._owner(ctx),
            self._caller(ctx),
            ctx.protocol_version,
            draining=self.draining,
        )

    async def _task_list(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams) -> Any:
        if not Era.of(ctx.protocol_version).has("tasks/list"):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/list")
        listing = await self.tasks.listing(self.registry, self._owner(ctx), ctx.protocol_version)
        return page(listing["tasks"], params.cursor, "tasks", ctx.protocol_version)

    def _holdable(self, caller: SessionCaller, name: str, view: View) -> Upstream | None:
        """The 2025-era server of a 2026 caller's call, when the caller can answer requests: the call is held."""
        if not caller.modern or not any(k in caller.capabilities for k in ASKING):
            return None
        entry = self.registry.catalog.resolve(name)
        if entry is None or not view.allows(entry) or view.confirms(entry):
            return None
        upstream = self.registry.upstreams.get(entry.server)
        if upstream is None or upstream.state is not State.UP or not upstream.serving:
            return None
        return None if Era.of(upstream.protocol_version).modern else upstream

    def _visible_prompts(self, view: View) -> list[Json]:
        return [e.tool for e in self.registry.catalog.prompts.values() if view.sees(e.server)]

    def _visible(self, view: View, kind: str) -> list[Json]:
        """Resources (or templates) the view sees, one per URI (the one reads go to), in routing order."""
        catalog = self.registry.catalog
        located = catalog.resources if kind == "resources" else catalog.templates
        key = "uri" if kind == "resources" else "uriTemplate"
        seen: set[str] = set()
        items = []
        for entry in located:
            if view.sees(entry.server) and entry.item[key] not in seen:
                seen.add(entry.item[key])
                items.append(entry.item)
        return items

    async def _list_prompts(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return page(
            self._visible_prompts(request_view(ctx)), params.cursor if params else None, "prompts", ctx.protocol_version
        )

    async def _list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return page(
            self._visible(request_view(ctx), "resources"),
            params.cursor if params else None,
            "resources",
            ctx.protocol_version,
        )

    async def _list_templates(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        items = self._visible(request_view(ctx), "templates")
        return page(items, params.cursor if params else None, "resourceTemplates", ctx.protocol_version)

    def _meta(self, ctx: ServerRequestContext[Any]) -> Json:
        return forwardable_meta(ctx.meta)

    async def _get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> Any:
        with self.tracking_call():
            return await surface.get_prompt(
                self.registry,
                request_view(ctx),
                params.name,
                params.arguments,
                self._meta(ctx),
                ctx.protocol_version,
                self._caller(ctx),
                draining=self.draining,
                extra=_rounds(params),
            )

    async def _read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> Any:
        with self.tracking_call():
            return await surface.read_resource(
                self.registry,
                request_view(ctx),
                str(params.uri),
                self._meta(ctx),
                ctx.protocol_version,
                self._caller(ctx),
                draining=self.draining,
                extra=_rounds(params),
            )

    async def _complete(self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> Any:
        wire = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        return await surface.complete(self.registry, request_view(ctx), wire, ctx.protocol_version)

    async def _set_level(self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> Any:
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        if session_id is not None:
            self.sessions.set_level(session_id, params.level)
        # A server keeps one level for all its callers: the most verbose any session wants; each session's
        # own level filters what reaches it.
        levels = [*self.sessions.levels(), params.level]
        await surface.set_level(self.registry, request_view(ctx), min(levels, key=surface.LEVELS.index))
        return {}

    async def _subscribe(self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> Any:
        return await self._subscription(ctx, str(params.uri), True)

    async def _unsubscribe(self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> Any:
        return await self._subscription(ctx, str(params.uri), False)

    async def _subscription(self, ctx: ServerRequestContext[Any], uri: str, on: bool) -> Any:
        if self.registry.catalog.route_uri(uri, request_view(ctx).sees) is None:
            raise surface.resource_not_found(uri, ctx.protocol_version)
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        if session_id is not None:
            self.sessions.subscribe(session_id, uri, on)
        await self._follow()
        return {}

    async def _follow(self) -> None:
        """Subscribe upstream to every resource some client follows, and drop what nobody follows any more."""
        wanted = set(self._listening)
        for view_name, uri, _ in self.sessions.subscribed():
            seer = self.views.get(view_name)
            server = self.registry.catalog.route_uri(uri, seer.sees) if seer is not None else None
            if server is not None:
                wanted.add((server, uri))
        for server, uri in sorted(wanted ^ self._following):
            upstream = self.registry.upstreams.get(server)
            on = (server, uri) in wanted
            (self._following.add if on else self._following.discard)((server, uri))
            if upstream is None or upstream.state is not State.UP:
                continue
            if not (upstream.offers.capabilities.get("resources") or {}).get("subscribe"):
                continue
            try:
                await upstream.subscribe(uri, on)
            except MCPError as e:
                log.warning("resource subscription not passed on", server=server, uri=uri[:256], reason=str(e))

    async def resource_updated(self, server: str, uri: str) -> None:
        """Tell the clients that follow `uri` (and may see `server`) that it changed."""
        for name, view in self.views.items():
            if view.sees(server):
                await self._channels[name].bus.publish(ResourceUpdated(uri))
        for view_name, followed, pusher in self.sessions.subscribed():
            seer = self.views.get(view_name)
            if followed == uri and seer is not None and seer.sees(server):
                try:
                    await pusher.send_resource_updated(uri)
                except Exception as e:
                    log.debug("resource update not delivered", reason=str(e))

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
        if ctx.request is None or REPLAYED not in ctx.request.headers:  # a woken session's handshake counted once
            self.registry.metrics.count_request(ctx.method)
        legacy_session = (
            ctx.request.headers.get(SESSION_HEADER)
            if ctx.request is not None and not Era.of(ctx.protocol_version).modern
            else None
        )
        meta = ctx.meta if isinstance(ctx.meta, dict) else None
        CONVERSATION.set(conversation_key(legacy_session, request_owner(ctx), meta))
        if ctx.method in ("initialize", "server/discover"):
            return self._narrowed(await call_next(ctx), request_view(ctx))
        if not Era.of(ctx.protocol_version).modern and ctx.request is not None:
            session_id = ctx.request.headers.get(SESSION_HEADER)
            if session_id:
                self.sessions.served(session_id, request_view(ctx).name, ctx.session)
                if ctx.method == "tools/call" and any(k in declared_capabilities(ctx) for k in ASKING):
                    self.sessions.talking(session_id)
            params = ctx.params if isinstance(ctx.params, dict) else {}
            # Task answers are outside the SDK's result tables (it would drop or refuse them): served here.
            answer: HandlerResult
            if ctx.method == "tools/call" and params.get("task") is not None:
                answer = await self._call_tool(ctx, types.CallToolRequestParams.model_validate(params, by_name=False))
                return answer
            if ctx.method == "tasks/result":
                typed = types.GetTaskPayloadRequestParams.model_validate(params, by_name=False)
                answer = await self._task_result(ctx, typed)
                return answer
        return await call_next(ctx)

    def handshake(self, params: Any, view: View) -> tuple[dict[str, Any], str] | None:
        """The result of a 2025-era `initialize` with `params` as the SDK's server gives it (for `view`), and the
        protocol version it settles on; None when the params are not valid (the SDK words the refusal)."""
        try:
            requested = types.InitializeRequestParams.model_validate(params, by_name=False).protocol_version
        except ValidationError:
            return None
        version = handshake_version(requested)
        options = self.server.create_initialization_options()
        result = types.InitializeResult(
            protocol_version=version,
            capabilities=options.capabilities,
            server_info=types.Implementation(
                name=options.server_name,
                title=options.title,
                description=options.description,
                version=options.server_version,
                website_url=options.website_url,
                icons=options.icons,
            ),
            instructions=options.instructions,
        )
        dumped = serialize_server_result(
            "initialize", version, result.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
        narrowed: dict[str, Any] = self._narrowed(dumped, view)  # type: ignore[assignment]
        return narrowed, version

    def _narrowed(self, result: HandlerResult, view: View) -> HandlerResult:
        """A handshake's (or discovery's) capabilities, less what no server in the caller's view offers."""
        if not isinstance(result, dict) or not isinstance(result.get("capabilities"), dict):
            return result
        offered = self._offered(view)
        capabilities = {k: v for k, v in result["capabilities"].items() if k not in VIEWED or k in offered}
        if TASKS_EXTENSION in offered and "supportedVersions" in result:  # a 2026 discovery
            capabilities["extensions"] = {**capabilities.get("extensions", {}), TASKS_EXTENSION: {}}
        resources = capabilities.get("resources")
        if isinstance(resources, dict) and "subscribe" not in offered:
            capabilities["resources"] = {k: v for k, v in resources.items() if k != "subscribe"}
        return {**result, "capabilities": capabilities}

    def _offered(self, view: View | None = None) -> set[str]:
        """The capabilities some server that is up (and in `view`) offers (`subscribe`: one can follow resources)."""
        offered: set[str] = set()
        for upstream in self.registry.upstreams.values():
            if upstream.state is State.UP and (view is None or view.sees(upstream.name)):
                caps = upstream.offers.capabilities
                offered.update(k for k in ("prompts", "resources", "completions", "logging", "tasks") if k in caps)
                if (caps.get("resources") or {}).get("subscribe"):
                    offered.add("subscribe")
                if TASKS_EXTENSION in (caps.get("extensions") or {}):
                    offered.add(TASKS_EXTENSION)
        return offered

    async def broadcast_tools_changed(self) -> None:
        """Tell the clients whose view of tools, prompts or resources changed, each in its own era's way."""
        self.server.offered = self._offered()
        kinds: list[tuple[str, Any, str]] = [
            ("tools", ToolsListChanged(), "send_tool_list_changed"),
            ("prompts", PromptsListChanged(), "send_prompt_list_changed"),
            ("resources", ResourcesListChanged(), "send_resource_list_changed"),
        ]
        for kind, event, push in kinds:
            changed = []
            for name, view in self.views.items():
                if kind == "tools":
                    now: Any = self.listings.names(view)
                elif kind == "prompts":
                    now = self._visible_prompts(view)
                else:
                    now = (self._visible(view, "resources"), self._visible(view, "templates"))
                if self._seen.get((kind, name), frozenset() if kind == "tools" else None) != now:
                    first = (kind, name) not in self._seen
                    self._seen[(kind, name)] = now
                    if not (first and kind != "tools"):
                        changed.append(name)
            for name in changed:
                await self._channels[name].bus.publish(event)
            for view_name, session in self.sessions.pushers():
                if view_name in changed:
                    try:
                        await getattr(session, push)()
                    except Exception as e:
                        log.debug("list_changed not delivered", reason=str(e))
