"""The rest of the MCP surface, beside tools: prompts, resources, completions and log levels.

Each request is admitted against the caller's view (a prompt or resource of a server outside the
view is unknown, with the same answer as one that does not exist) and routed to its server, then
sent by `core.forward` as tool calls are: the server's slots and deadline, labels, era shaping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp import MCPError

from gateway.core.calls import Draining
from gateway.core.forward import forward, labelled, upstream_of
from gateway.observe.logs import get_logger
from gateway.policy.access import View
from gateway.protocol.era import Era
from gateway.protocol.errors import CallFailed, State, describe
from gateway.relay.context import CallContext
from gateway.upstream.server import UpstreamServer

if TYPE_CHECKING:
    from gateway.core.registry import Registry

Json = dict[str, Any]
log = get_logger("surface")


def resource_not_found(uri: str, version: str) -> MCPError:
    """The error the caller's revision gives for a URI no server in its view offers."""
    return MCPError(Era.of(version).resource_not_found, f"Resource not found: {uri}", {"uri": uri})


def _with_meta(params: Json, meta: Mapping[str, Any] | None) -> Json:
    return {**params, "_meta": dict(meta)} if meta else params


async def get_prompt(
    registry: Registry,
    view: View,
    name: str,
    arguments: Mapping[str, str] | None,
    meta: Mapping[str, Any] | None,
    call: CallContext,
    *,
    draining: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Json:
    """`prompts/get` of a public prompt name, sent to its server under the original name (`extra`: a 2026
    retry's `inputResponses` and `requestState`, passed on unchanged)."""
    entry = registry.catalog.resolve_prompt(name)
    if entry is None or not view.sees(entry.server):
        raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {name}")
    if draining:
        raise Draining()
    params: Json = {**(extra or {}), "name": entry.original}
    if arguments is not None:
        params["arguments"] = dict(arguments)
    log.info("prompt", server=entry.server, prompt=entry.public)
    return await forward(registry, call, entry.server, "prompts/get", _with_meta(params, meta))


async def read_resource(
    registry: Registry,
    view: View,
    uri: str,
    meta: Mapping[str, Any] | None,
    call: CallContext,
    *,
    draining: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Json:
    """`resources/read` of a URI, routed to the server that offers it (`Catalog.route_uri`)."""
    server = registry.catalog.route_uri(uri, view.sees)
    if server is None:
        raise resource_not_found(uri, call.version)
    if draining:
        raise Draining()
    params = _with_meta({**(extra or {}), "uri": uri}, meta)
    return await forward(registry, call, server, "resources/read", params)


async def complete(registry: Registry, view: View, params: Json, call: CallContext) -> Json:
    """`completion/complete`, routed by its reference: a public prompt name, or a resource template (or URI)."""
    ref = params.get("ref")
    if not isinstance(ref, dict):
        raise MCPError(types.INVALID_PARAMS, "completion/complete needs a `ref`")
    forwarded = {k: v for k, v in params.items() if k != "_meta"}
    server: str | None
    if ref.get("type") == "ref/prompt":
        name = str(ref.get("name"))
        entry = registry.catalog.resolve_prompt(name)
        if entry is None or not view.sees(entry.server):
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {name}")
        server = entry.server
        forwarded["ref"] = {**ref, "name": entry.original}
    elif ref.get("type") == "ref/resource":
        uri = str(ref.get("uri"))
        server = registry.catalog.route_template(uri, view.sees) or registry.catalog.route_uri(uri, view.sees)
        if server is None:
            raise resource_not_found(uri, call.version)
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown completion reference type: {ref.get('type')!r}")
    upstream = upstream_of(registry, server, call.conversation)
    if upstream is None or not upstream.offers.has("completions"):
        nothing: Json = {"completion": {"values": [], "hasMore": False}}
        trust = "trusted" if upstream is not None and upstream.spec.trusted else "outside"
        return labelled(nothing, "completion/complete", server, trust, call.version)
    # completions are asked as the user types: nobody to relay a server's questions to
    return await forward(registry, replace(call, caller=None), server, "completion/complete", forwarded)


async def set_level(registry: Registry, view: View, level: str) -> None:
    """Pass a caller's log level on to every server in its view that logs (2025-era servers keep a level)."""
    for upstream in list(registry.upstreams.values()):
        if not (view.sees(upstream.name) and _logs(upstream)):
            continue
        try:
            await upstream.request("logging/setLevel", {"level": level})
        except (CallFailed, MCPError) as e:
            log.info("log level not passed on", server=upstream.name, reason=describe(e))


def _logs(upstream: UpstreamServer) -> bool:
    return (
        upstream.state is State.UP and upstream.offers.has("logging") and not Era.of(upstream.protocol_version).modern
    )
