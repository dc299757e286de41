"""`tools/list` and `tools/call` on the SDK's server: the listing a caller's view (and conversation, and searches)
gives it, held calls, the gateway's own search and call tools, and which calls the shortcut may take instead."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext

from gateway import SERVER_INFO
from gateway.catalog.exposure import (
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
from gateway.catalog.merged import Catalog
from gateway.core.calls import call_tool
from gateway.core.registry import Registry
from gateway.core.tasks import Tasks
from gateway.downstream.inflight import InFlight
from gateway.downstream.listing import Listings
from gateway.downstream.requests import (
    call_context,
    caller_of,
    conversation_of,
    request_owner,
    request_view,
    session_of,
    task_owner,
)
from gateway.downstream.sessions import Sessions
from gateway.observe.logs import get_logger
from gateway.policy.access import View
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, LOG_LEVEL_KEY, Era
from gateway.protocol.errors import State
from gateway.relay.asks import asks_through
from gateway.relay.callers import SessionCaller
from gateway.relay.held import HeldCalls
from gateway.upstream.connection import Upstream

if TYPE_CHECKING:
    from gateway.catalog.embedding import Embedding

Json = dict[str, Any]
Ctx = ServerRequestContext[Any]
MAX_REVEALED = 500  # tools a search may add to one 2025 session's listing
log = get_logger("server")


def own_result(result: Json, version: str) -> Json:
    """A result of one of the gateway's own tools, shaped for the caller's protocol era."""
    return Era.of(version).shape(result, "tools/call", SERVER_INFO)


def plain_call(catalog: Catalog, view: View, name: str, meta: Json | None, *, modern: bool, talks: bool) -> bool:
    """Whether the shortcut may serve a `tools/call` of `name` as a plain call (admit, forward, answer in one JSON
    body): everything `ToolHandlers.call` does beside that needs the SDK's server. `talks`: a 2025 session's client
    can be asked things or wants log lines (a 2026 request says so in its `meta`)."""
    if meta is not None and "progressToken" in meta:
        return False  # progress is relayed by the SDK path
    if modern:
        capabilities = meta.get(CLIENT_CAPABILITIES_KEY) if meta else None
        asks = isinstance(capabilities, dict) and (asks_through(capabilities) or "extensions" in capabilities)
        talks = asks or bool(meta and LOG_LEVEL_KEY in meta)  # extensions (a task, say): answers the SDK path shapes
    if talks:
        return False  # asked things or logged to on its call's stream (2025), or held (2026)
    if name in OWN_TOOLS:
        return False  # the search and call tools
    entry = catalog.resolve(name)
    if entry is None and name in catalog.held:
        return False  # the SDK path words the refusal of a held tool
    return entry is None or not view.confirms(entry)  # a confirmation needs the back-channel or input rounds


class ToolHandlers:
    """The SDK server's `tools/list` and `tools/call` handlers."""

    def __init__(
        self,
        registry: Registry,
        sessions: Sessions,
        listings: Listings,
        inflight: InFlight,
        deferred: Callable[[View], bool],
        confirm_key: bytes,
        search_model: Embedding | None = None,
    ) -> None:
        self.registry = registry
        self.sessions = sessions
        self.listings = listings
        self.inflight = inflight
        self.deferred = deferred
        self.confirm_key = confirm_key
        self.finder = Finder(registry.catalog, search_model)
        self.origin = secrets.token_hex(8)  # this process's mark on the held calls and tasks it hands out
        self.held = HeldCalls(self.origin)
        self.tasks = Tasks(self.origin)

    def input_schema(self, name: str) -> Any:
        """The input schema of a public tool name, for the SDK's `Mcp-Param-*` header checks."""
        entry = self.registry.catalog.resolve(name)
        return entry.input_schema if entry is not None else None

    async def listing(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        """`tools/list`: the view's listing, plus what searches revealed to the session and the conversation's own."""
        if params is not None and params.cursor:
            raise MCPError(types.INVALID_PARAMS, "Invalid cursor: the catalog is served in one page")
        view = request_view(ctx)
        result = self.listings.result(view, ctx.protocol_version)
        own = self.registry.conversations.listing(conversation_of(ctx))
        revealed = self._revealed(ctx, view, {t["name"] for t in result["tools"]})
        if own or revealed:
            result = {**result, "tools": [*result["tools"], *revealed, *own]}
        return result  # type: ignore[return-value]

    def _revealed(self, ctx: Ctx, view: View, listed: set[str]) -> list[Json]:
        """The tools a search returned to this 2025 session that are still in its view (deferred exposure)."""
        names = self.sessions.revealed(session_of(ctx))
        if not names:
            return []
        entries = self.registry.catalog.entries
        return [entries[n].tool for n in sorted(names) if n in entries and n not in listed and view.allows(entries[n])]

    async def call(self, ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        """`tools/call`: a held call's answers, the gateway's own tools, a call held for its questions, or a call."""
        with self.inflight.tracking():
            caller = caller_of(ctx, self.sessions)
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
            view = request_view(ctx)
            if params.name in OWN_TOOLS and self.deferred(view):
                return await self._own_tool(ctx, params)
            upstream = self._holdable(caller, params.name, view)
            if upstream is not None:
                trust = "trusted" if upstream.spec.trusted else "outside"
                labels = {"manifold/server": upstream.name, "manifold/trust": trust}
                held = self.held.open(
                    caller.capabilities, upstream.spec.timeout, labels, owner=request_owner(ctx), tool=params.name
                )
                call = replace(call_context(ctx, caller), caller=held)

                async def run() -> Any:
                    return await call_tool(
                        self.registry,
                        ctx,
                        params,
                        view,
                        call,
                        draining=self.inflight.draining,
                        confirm_key=self.confirm_key,
                    )

                upstream.spawn(self.held.run, held, run)
                return await self.held.next_answer(held)
            result = await call_tool(
                self.registry,
                ctx,
                params,
                view,
                call_context(ctx, caller),
                draining=self.inflight.draining,
                confirm_key=self.confirm_key,
            )
            if (entry := self.registry.catalog.resolve(params.name)) is not None:
                result = self.tasks.publish(result, entry.server, task_owner(ctx))
            return result

    def _holdable(self, caller: SessionCaller, name: str, view: View) -> Upstream | None:
        """The 2025-era server of a 2026 caller's call, when the caller can answer requests: the call is held."""
        if not caller.modern or not asks_through(caller.capabilities):
            return None
        entry = self.registry.catalog.resolve(name)
        if entry is None or not view.allows(entry) or view.confirms(entry):
            return None
        upstream = self.registry.upstreams.get(entry.server)
        if not isinstance(upstream, Upstream) or upstream.state is not State.UP or not upstream.serving:
            return None
        return None if Era.of(upstream.protocol_version).modern else upstream

    async def _own_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        """`manifold__search_tools` and `manifold__call_tool`, for callers with deferred exposure."""
        view = request_view(ctx)
        if params.name == SEARCH_TOOL:
            try:
                query, limit, server = search_request(params.arguments or {})
            except BadInput as e:
                return own_result(bad_input_result(SEARCH_TOOL, str(e)), ctx.protocol_version)
            found = self.finder.search(query, limit, view.allows, server)
            log.info("tool search", request_id=ctx.request_id, results=len(found), server=server)
            await self._reveal(ctx, [e.public for e in found])
            return own_result(found_result(found, query), ctx.protocol_version)
        try:
            name, arguments = call_request(params.arguments or {})
        except BadInput as e:
            return own_result(bad_input_result(CALL_TOOL, str(e)), ctx.protocol_version)
        inner = params.model_copy(update={"name": name, "arguments": arguments})
        try:
            return await self.call(ctx, inner)
        except MCPError as e:
            if e.code != types.INVALID_PARAMS:
                raise
            return own_result(bad_input_result(CALL_TOOL, e.error.message), ctx.protocol_version)

    async def _reveal(self, ctx: Ctx, names: list[str]) -> None:
        """Add found tools to a 2025 session's listing, and tell it its listing changed."""
        session_id = session_of(ctx)
        if Era.of(ctx.protocol_version).modern or not session_id or not names:
            return
        if self.sessions.reveal(session_id, names, MAX_REVEALED):
            if self.sessions.share is not None:
                await self.sessions.share(session_id, {"revealed": sorted(self.sessions.revealed(session_id))})
            try:
                await ctx.session.send_tool_list_changed()
            except Exception as e:
                log.debug("list_changed not delivered", reason=str(e))
