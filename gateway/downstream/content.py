"""Prompts, resources, completions and log levels on the SDK's server: listings of what the caller's view sees,
and requests routed to their server (`gateway.core.surface`)."""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server import ServerRequestContext

from gateway.core import surface
from gateway.core.forward import forwardable_meta
from gateway.core.registry import Registry
from gateway.downstream.inflight import InFlight
from gateway.downstream.listing import visible_prompts, visible_resources
from gateway.downstream.notices import Notices
from gateway.downstream.requests import (
    call_context,
    caller_of,
    page,
    request_view,
    rounds_of,
    session_of,
)
from gateway.downstream.sessions import Sessions
from gateway.relay.callers import LEVELS

Ctx = ServerRequestContext[Any]


class ContentHandlers:
    """The SDK server's handlers for prompts, resources, resource templates, completions and log levels."""

    def __init__(self, registry: Registry, sessions: Sessions, inflight: InFlight, notices: Notices) -> None:
        self.registry = registry
        self.sessions = sessions
        self.inflight = inflight
        self.notices = notices

    async def list_prompts(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
        """`prompts/list`."""
        items = visible_prompts(self.registry.catalog, request_view(ctx))
        return page(items, params.cursor if params else None, "prompts", ctx.protocol_version)

    async def list_resources(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
        """`resources/list`."""
        items = visible_resources(self.registry.catalog, request_view(ctx), "resources")
        return page(items, params.cursor if params else None, "resources", ctx.protocol_version)

    async def list_templates(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> Any:
        """`resources/templates/list`."""
        items = visible_resources(self.registry.catalog, request_view(ctx), "templates")
        return page(items, params.cursor if params else None, "resourceTemplates", ctx.protocol_version)

    async def get_prompt(self, ctx: Ctx, params: types.GetPromptRequestParams) -> Any:
        """`prompts/get`."""
        with self.inflight.tracking():
            return await surface.get_prompt(
                self.registry,
                request_view(ctx),
                params.name,
                params.arguments,
                forwardable_meta(ctx.meta),
                call_context(ctx, caller_of(ctx, self.sessions)),
                draining=self.inflight.draining,
                extra=rounds_of(params),
            )

    async def read_resource(self, ctx: Ctx, params: types.ReadResourceRequestParams) -> Any:
        """`resources/read`."""
        with self.inflight.tracking():
            return await surface.read_resource(
                self.registry,
                request_view(ctx),
                str(params.uri),
                forwardable_meta(ctx.meta),
                call_context(ctx, caller_of(ctx, self.sessions)),
                draining=self.inflight.draining,
                extra=rounds_of(params),
            )

    async def complete(self, ctx: Ctx, params: types.CompleteRequestParams) -> Any:
        """`completion/complete`."""
        wire = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        return await surface.complete(self.registry, request_view(ctx), wire, call_context(ctx, None))

    async def set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> Any:
        """`logging/setLevel`: the session's own level, and the most verbose any session wants for each server."""
        session_id = session_of(ctx)
        if session_id is not None:
            self.sessions.set_level(session_id, params.level)
            if self.sessions.share is not None:
                await self.sessions.share(session_id, {"level": params.level})
        # A server keeps one level for all its callers: the most verbose any session wants; each session's
        # own level filters what reaches it.
        levels = [*self.sessions.levels(), params.level]
        await surface.set_level(self.registry, request_view(ctx), min(levels, key=LEVELS.index))
        return {}

    async def subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> Any:
        """`resources/subscribe`."""
        return await self._subscription(ctx, str(params.uri), True)

    async def unsubscribe(self, ctx: Ctx, params: types.UnsubscribeRequestParams) -> Any:
        """`resources/unsubscribe`."""
        return await self._subscription(ctx, str(params.uri), False)

    async def _subscription(self, ctx: Ctx, uri: str, on: bool) -> Any:
        if self.registry.catalog.route_uri(uri, request_view(ctx).sees) is None:
            raise surface.resource_not_found(uri, ctx.protocol_version)
        session_id = session_of(ctx)
        if session_id is not None:
            subscribed = self.sessions.subscribe(session_id, uri, on)
            if self.sessions.share is not None:
                await self.sessions.share(session_id, {"subscribed": subscribed})
        await self.notices.follow()
        return {}
