"""The rest of the MCP surface, beside tools: prompts, resources, completions and log levels.

Each request is admitted against the caller's view (a prompt or resource of a server outside the
view is unknown, with the same answer as one that does not exist), routed to its server under the
server's slots and deadline, and its answer is labelled with the server and its trust and shaped
for the caller's protocol era, by the same rules as tool results (`Era.shape`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp import MCPError

from gateway.access import View
from gateway.calls import SERVER_INFO, Draining, with_log_level
from gateway.era import Era
from gateway.internals.sdk import CALLER_CAPABILITIES
from gateway.labels import META_PREFIX
from gateway.logs import get_logger
from gateway.upstream.asks import Caller, declared
from gateway.upstream.connection import Upstream
from gateway.upstream.errors import CallFailed, State, describe

if TYPE_CHECKING:
    from gateway.registry import Registry

Json = dict[str, Any]
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
log = get_logger("surface")


def resource_not_found(uri: str, version: str) -> MCPError:
    """The error the caller's revision gives for a URI no server in its view offers."""
    return MCPError(Era.of(version).resource_not_found, f"Resource not found: {uri}", {"uri": uri})


def shape(raw: Json, method: str, server: str, trusted: bool, version: str) -> Json:
    """An upstream's answer for the caller, labelled with its server and trust, shaped for the caller's era."""
    labels = {f"{META_PREFIX}server": server, f"{META_PREFIX}trust": "trusted" if trusted else "outside"}
    return Era.of(version).shape(raw, method, SERVER_INFO, labels=labels, server=server)


async def forward(
    registry: Registry,
    server: str,
    method: str,
    params: Json,
    version: str,
    caller: Caller | None = None,
    *,
    draining: bool = False,
) -> Json:
    """Send one request to `server` and shape its answer; a failure that reached no answer is an `MCPError`."""
    if draining:
        raise Draining()
    upstream = registry.upstreams.get(server)
    if upstream is None:
        raise MCPError(types.INTERNAL_ERROR, f"server '{server}' is gone")
    CALLER_CAPABILITIES.set(declared(upstream.spec, caller.capabilities) if caller is not None else {})
    if caller is not None:
        meta = with_log_level(params.get("_meta") or {}, caller, upstream)
        params = {**params, "_meta": meta} if meta else params
    try:
        async with registry.connection(upstream, version, caller.capabilities if caller else None) as serving:
            raw = await _exchange(serving, method, params, caller)
    except CallFailed as failure:
        log.info("request failed", server=server, method=method, reason=str(failure))
        raise MCPError(types.INTERNAL_ERROR, str(failure)) from None
    except MCPError as e:
        raise MCPError(e.code, describe(e), e.error.data) from None
    return shape(raw, method, server, upstream.spec.trusted, version)


async def _exchange(upstream: Upstream, method: str, params: Json, caller: Caller | None) -> Json:
    with upstream.callers.serving(caller):
        raw = await upstream.request(method, params)
        if caller is not None:
            await upstream.callers.settle()
        return raw


def _with_meta(params: Json, meta: Mapping[str, Any] | None) -> Json:
    return {**params, "_meta": dict(meta)} if meta else params


async def get_prompt(
    registry: Registry,
    view: View,
    name: str,
    arguments: Mapping[str, str] | None,
    meta: Mapping[str, Any] | None,
    version: str,
    caller: Caller | None = None,
    *,
    draining: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Json:
    """`prompts/get` of a public prompt name, sent to its server under the original name (`extra`: a 2026
    retry's `inputResponses` and `requestState`, passed on unchanged)."""
    entry = registry.catalog.resolve_prompt(name)
    if entry is None or not view.sees(entry.server):
        raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {name}")
    params: Json = {**(extra or {}), "name": entry.original}
    if arguments is not None:
        params["arguments"] = dict(arguments)
    log.info("prompt", server=entry.server, prompt=entry.public)
    return await forward(
        registry, entry.server, "prompts/get", _with_meta(params, meta), version, caller, draining=draining
    )


async def read_resource(
    registry: Registry,
    view: View,
    uri: str,
    meta: Mapping[str, Any] | None,
    version: str,
    caller: Caller | None = None,
    *,
    draining: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Json:
    """`resources/read` of a URI, routed to the server that offers it (`Catalog.route_uri`)."""
    server = registry.catalog.route_uri(uri, view.sees)
    if server is None:
        raise resource_not_found(uri, version)
    params = _with_meta({**(extra or {}), "uri": uri}, meta)
    return await forward(registry, server, "resources/read", params, version, caller, draining=draining)


async def complete(registry: Registry, view: View, params: Json, version: str) -> Json:
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
            raise resource_not_found(uri, version)
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown completion reference type: {ref.get('type')!r}")
    upstream = registry.upstreams.get(server)
    if upstream is None or not upstream.offers.has("completions"):
        nothing: Json = {"completion": {"values": [], "hasMore": False}}
        return shape(nothing, "completion/complete", server, upstream is not None and upstream.spec.trusted, version)
    return await forward(registry, server, "completion/complete", forwarded, version)


async def set_level(registry: Registry, view: View, level: str) -> None:
    """Pass a caller's log level on to every server in its view that logs (2025-era servers keep a level)."""
    for upstream in list(registry.upstreams.values()):
        if not (view.sees(upstream.name) and _logs(upstream)):
            continue
        try:
            await upstream.request("logging/setLevel", {"level": level})
        except (CallFailed, MCPError) as e:
            log.info("log level not passed on", server=upstream.name, reason=describe(e))


def _logs(upstream: Upstream) -> bool:
    return (
        upstream.state is State.UP and upstream.offers.has("logging") and not Era.of(upstream.protocol_version).modern
    )


def at_least(level: str, threshold: str | None) -> bool:
    """Whether a log line of `level` passes a session's `threshold` (None: everything passes)."""
    if threshold is None or level not in LEVELS or threshold not in LEVELS:
        return True
    return LEVELS.index(level) >= LEVELS.index(threshold)
