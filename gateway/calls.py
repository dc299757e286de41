"""Call policy: resolve a public name, forward the call, map failures, label the result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from gateway.catalog import Entry
from gateway.labels import META_PREFIX
from gateway.upstream import SERVER_INFO_KEY, Unavailable, describe

if TYPE_CHECKING:
    from gateway.registry import Registry

Json = dict[str, Any]
RESERVED_META = "io.modelcontextprotocol/"
_LOST = {types.CONNECTION_CLOSED: "the connection was lost", types.REQUEST_TIMEOUT: "the call timed out"}


def forwardable_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's `_meta` minus its protocol envelope and progress token (the upstream gets its own)."""
    if not meta:
        return {}
    return {
        k: v
        for k, v in meta.items()
        if k not in ("progress_token", "progressToken") and not k.startswith(RESERVED_META)
    }


def error_result(entry: Entry, reason: str, modern: bool) -> Json:
    """An `isError` result naming the server and the reason, for the model to read."""
    result: Json = {
        "content": [{"type": "text", "text": f"{entry.public}: {reason}"}],
        "isError": True,
    }
    return label_result(result, entry, modern)


def label_result(raw: Json, entry: Entry, modern: bool) -> Json:
    """The upstream's result in the caller's era, its identity stamp removed and Manifold's labels added."""
    meta = raw.get("_meta")
    kept = {k: v for k, v in meta.items() if k != SERVER_INFO_KEY} if isinstance(meta, dict) else {}
    kept[f"{META_PREFIX}server"] = entry.server
    kept[f"{META_PREFIX}trust"] = entry.labels.trust
    result = {**raw, "_meta": kept}
    if modern:
        result.setdefault("resultType", "complete")
    elif result.get("resultType") == "complete":
        del result["resultType"]
    return result


async def call_tool(registry: Registry, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Json:
    """Serve one downstream `tools/call`."""
    entry = registry.catalog.resolve(params.name)
    if entry is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    upstream = registry.upstreams[entry.server]
    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        await ctx.session.report_progress(progress, total, message)

    wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)
    try:
        raw = await upstream.call(
            entry.original,
            params.arguments,
            forwardable_meta(ctx.meta),
            on_progress if wants_progress else None,
        )
    except Unavailable as e:
        return error_result(entry, str(e), modern)
    except MCPError as e:
        if e.code in _LOST:
            return error_result(entry, f"server '{entry.server}' failed: {_LOST[e.code]}", modern)
        raise MCPError(e.code, describe(e), e.error.data) from None
    return label_result(raw, entry, modern)
