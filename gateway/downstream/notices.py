"""Change notices to clients, each in its era's way: 2026-era listen streams (one bus per view), 2025-era sessions'
own streams; and the resources clients follow, subscribed upstream while someone follows them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import anyio
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)

from gateway.core.registry import Registry
from gateway.downstream.handshake import ManifoldServer, offered
from gateway.downstream.listing import Listings, visible_prompts, visible_resources
from gateway.downstream.requests import request_view
from gateway.downstream.sessions import Sessions
from gateway.observe.logs import get_logger
from gateway.policy.access import View
from gateway.protocol.errors import State

log = get_logger("server")


class _Channel:
    """One view's change notices to 2026-era clients: a bus and its listen handler."""

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        self.handler = ListenHandler(self.bus)


class Notices:
    """Tells clients when THEIR view changes, and follows upstream the resources some client follows."""

    def __init__(
        self,
        registry: Registry,
        views: Mapping[str, View],
        sessions: Sessions,
        listings: Listings,
    ) -> None:
        self.registry = registry
        self.views = views
        self.sessions = sessions
        self.listings = listings
        self.server: ManifoldServer | None = None  # whose capabilities follow what is offered (set once built)
        self._channels = {name: _Channel() for name in views}
        self._seen: dict[tuple[str, str], Any] = {}
        self._listening: Counter[tuple[str, str]] = Counter()
        self._following: set[tuple[str, str]] = set()

    async def listen(self, ctx: ServerRequestContext[Any], params: Any) -> Any:
        """`subscriptions/listen`: a 2026-era client's stream of change notices (and of the resources it names)."""
        view = request_view(ctx)
        notifications = getattr(params, "notifications", None)
        uris = list(getattr(notifications, "resource_subscriptions", None) or ())
        followed = [(server, uri) for uri in uris if (server := self.registry.catalog.route_uri(uri, view.sees))]
        self._listening.update(followed)
        try:
            if followed:
                await self.follow()
            return await self._channels[view.name].handler(ctx, params)
        finally:
            self._listening.subtract(followed)
            self._listening = +self._listening
            if followed:
                with anyio.CancelScope(shield=True):
                    await self.follow()

    async def follow(self) -> None:
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

    def close(self) -> None:
        """End every open `subscriptions/listen` stream."""
        for channel in self._channels.values():
            channel.handler.close()

    async def broadcast_changes(self) -> None:
        """Tell the clients whose view of tools, prompts or resources changed, each in its own era's way."""
        catalog = self.registry.catalog
        if self.server is not None:
            self.server.offered = offered(self.registry)
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
                    now = visible_prompts(catalog, view)
                else:
                    now = (visible_resources(catalog, view, "resources"), visible_resources(catalog, view, "templates"))
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
