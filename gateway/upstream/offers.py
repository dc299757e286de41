"""What one server offers: its tools, prompts, resources and resource templates, read page by page.

A listing that fails (an error answer such as -32601 from a server that declared a capability it does not
serve, a timeout, a page that is not a listing) does not fail the server: it is taken as empty (or, on a
refresh, as it was before), and the server is `degraded` in that listing until a later listing succeeds.
Only a closed connection, or more tools than the server may offer, fails the whole listing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from mcp import ClientSession, MCPError
from pydantic import BaseModel, ValidationError

from gateway.catalog.filters import apply_filters
from gateway.config.servers import ServerSpec
from gateway.internals.sdk import absorb_tools, send_unchecked
from gateway.observe.logs import get_logger
from gateway.protocol.errors import describe

Json = dict[str, Any]
log = get_logger("upstream")


@dataclass(frozen=True)
class Offers:
    """One server's offer after its filters, as wire dicts, and the capabilities it declared."""

    tools: tuple[Json, ...] = ()
    prompts: tuple[Json, ...] = ()
    resources: tuple[Json, ...] = ()
    templates: tuple[Json, ...] = ()
    capabilities: Json = field(default_factory=dict)
    # listing (`tools`, `prompts`, `resources`, `resourceTemplates`) -> why it failed, secret-free
    degraded: tuple[tuple[str, str], ...] = ()

    def has(self, capability: str) -> bool:
        """Whether the server declared a capability (`prompts`, `resources`, `completions`, `logging`, ...)."""
        return self.capabilities.get(capability) is not None


NONE = Offers()


class Unlistable(Exception):
    """One listing could not be read (the connection itself still works)."""


class TooMany(Exception):
    """A listing holds more items than the server may offer."""

    def __init__(self, key: str, limit: int) -> None:
        super().__init__(f"it offers more than {limit} {key}")
        self.key, self.limit = key, limit


def capabilities_of(session: ClientSession) -> Json:
    """The server's declared capabilities as a wire dict (empty before the handshake)."""
    caps = session.server_capabilities
    return caps.model_dump(by_alias=True, mode="json", exclude_none=True) if caps is not None else {}


async def list_offers(
    session: ClientSession,
    spec: ServerSpec,
    *,
    max_tools: int | None = None,
    tools_only: bool = False,
    previous: Offers = NONE,
) -> Offers:
    """Walk every page of each listing the server's capabilities promise; apply the tool filters.

    `max_tools` bounds the tool listing (`TooMany` past it, raised as soon as a page goes over);
    `tools_only` leaves prompts and resources unread, and keeps only the `tools` capability. A listing that
    fails keeps what `previous` held of it and is named in `degraded` with the reason.
    """
    caps = capabilities_of(session)
    degraded: dict[str, str] = {}

    async def optional(
        key: str, walk: Callable[[], Awaitable[tuple[Json, ...]]], kept: tuple[Json, ...]
    ) -> tuple[Json, ...]:
        try:
            return await walk()
        except MCPError as e:
            if e.code == types.CONNECTION_CLOSED:
                raise
            degraded[key] = describe(e)
        except Unlistable as e:
            degraded[key] = str(e)
        return kept

    tools: tuple[Json, ...] = ()
    # A server that declares nothing else is asked for tools even if it forgot to declare them.
    if "tools" in caps or not caps.keys() & {"prompts", "resources"}:
        tools = await optional(
            "tools", lambda: _walk(session, "tools/list", "tools", types.Tool, spec, max_tools), previous.tools
        )
        kept_names = absorb_tools(session, list(tools))
        for dropped in [t["name"] for t in tools if t["name"] not in kept_names]:
            log.warning("upstream tool skipped: invalid x-mcp-header annotation", server=spec.name, tool=dropped)
        tools = tuple(t for t in tools if t["name"] in kept_names)
        by_name = {t["name"]: t for t in tools}
        kept = apply_filters(list(by_name), spec.only, spec.deny)
        for pattern in kept.unmatched_only:
            log.warning("`only` entry matches no tool", server=spec.name, pattern=pattern)
        tools = tuple(by_name[n] for n in kept.kept)
    prompts: tuple[Json, ...] = ()
    resources: tuple[Json, ...] = ()
    templates: tuple[Json, ...] = ()
    if tools_only:
        return Offers(tools, capabilities={"tools": caps.get("tools") or {}}, degraded=tuple(degraded.items()))
    if "prompts" in caps:
        prompts = await optional(
            "prompts", lambda: _walk(session, "prompts/list", "prompts", types.Prompt, spec), previous.prompts
        )
        prompts = tuple({p["name"]: p for p in prompts}.values())
    if "resources" in caps:
        resources = await optional(
            "resources",
            lambda: _walk(session, "resources/list", "resources", types.Resource, spec),
            previous.resources,
        )
        templates = await optional(
            "resourceTemplates",
            lambda: _walk(session, "resources/templates/list", "resourceTemplates", types.ResourceTemplate, spec),
            previous.templates,
        )
    return Offers(tools, prompts, resources, templates, caps, tuple(degraded.items()))


async def _walk(
    session: ClientSession,
    method: str,
    key: str,
    model: type[BaseModel],
    spec: ServerSpec,
    limit: int | None = None,
) -> tuple[Json, ...]:
    """Every page of one listing; items that do not validate are skipped with a warning. More than `limit`
    items raise `TooMany`; a page that is not a listing raises `Unlistable`."""
    items: list[Json] = []
    cursor: str | None = None
    for _ in range(10_000):
        page = await send_unchecked(session, method, {"cursor": cursor} if cursor else {}, timeout=spec.timeout)
        items_of_page = page.get(key, []) if isinstance(page, dict) else None
        if not isinstance(items_of_page, list):
            raise Unlistable(f"{method} answered with something that is not a listing")
        for item in items_of_page:
            if not isinstance(item, dict):
                continue
            try:
                model.model_validate(item)
            except ValidationError:
                label = item.get("name") or item.get("uri") or item.get("uriTemplate")
                log.warning(f"upstream {key[:-1]} skipped: invalid definition", server=spec.name, item=str(label)[:128])
                continue
            items.append(item)
        if limit is not None and len(items) > limit:
            raise TooMany(key, limit)
        cursor = page.get("nextCursor")
        if not cursor or not isinstance(cursor, str):
            break
    return tuple(items)
