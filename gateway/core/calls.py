"""Call admission, shared by every downstream path, and the SDK server's `tools/call`.

`admit` decides whether a caller may call a name (resolve, view, held by its pin, draining);
`call_tool` serves a `tools/call` that came through the SDK's server: admit, confirm a gated call,
then `core.forward`. The shortcut (`downstream/shortcut.py`) admits and forwards the same way, so
the two differ only in plumbing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext

from gateway.catalog.merged import Entry
from gateway.core.forward import error_result, forward, tool_request
from gateway.observe.logs import get_logger
from gateway.policy.access import View
from gateway.relay.context import CallContext
from gateway.relay.rounds import confirm

if TYPE_CHECKING:
    from gateway.core.registry import Registry

Json = dict[str, Any]
log = get_logger("calls")


class Draining(MCPError):
    """The gateway is shutting down and takes no new calls."""

    def __init__(self) -> None:
        super().__init__(types.INTERNAL_ERROR, "The gateway is shutting down; retry on another replica")


class HeldTool(Exception):
    """A call to a tool its pin holds back; `reason` tells the caller how an operator approves it."""

    def __init__(self, entry: Entry) -> None:
        super().__init__(entry.public)
        self.entry = entry
        self.reason = (
            f"the definition of tool '{entry.original}' of server '{entry.server}' changed since it was approved"
            " (or is new), so it is held until an operator reviews it: "
            f"`manifold pins diff {entry.server} {entry.original}`, then "
            f"`manifold pins approve {entry.server} {entry.original} --digest <the digest the diff shows>`"
        )


def admit(
    registry: Registry, view: View, name: str, request_id: Any, *, draining: bool, conversation: str | None = None
) -> Entry:
    """The catalog entry a caller with `view` may call under `name` (in `conversation`, whose handed-over
    servers' tools are its own, outside any token's scope).

    Raises `MCPError`: -32602 for a name that is unknown or outside the view (the same answer, so a
    view does not reveal what it hides), `Draining` once the gateway is shutting down; `HeldTool` for a
    tool in the view that its pin holds back.
    """
    entry = registry.catalog.resolve(name)
    if entry is None and (held := registry.catalog.held.get(name)) is not None and view.allows(held):
        log.info("tool call", request_id=request_id, server=held.server, tool=name[:128], outcome="held")
        registry.metrics.record_call(held.server, held.public, "held", endpoint=view.endpoint, who=view.name)
        raise HeldTool(held)
    if entry is None and (own := registry.conversations.resolve(conversation, name)) is not None:
        entry = own
    elif entry is None or not view.allows(entry):
        log.info("tool call", request_id=request_id, tool=name[:128], outcome="unknown_tool")
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
    if draining:
        raise Draining()
    return entry


async def call_tool(
    registry: Registry,
    ctx: ServerRequestContext[Any],
    params: types.CallToolRequestParams,
    view: View,
    call: CallContext,
    *,
    draining: bool,
    confirm_key: bytes,
) -> Json:
    """Serve one downstream `tools/call` that came through the SDK's server."""
    try:
        entry = admit(registry, view, params.name, ctx.request_id, draining=draining, conversation=call.conversation)
    except HeldTool as held:
        return error_result(held.entry, held.reason, ctx.protocol_version)
    confirming = view.confirms(entry)
    if confirming and (refusal := await confirm(ctx, entry, params, confirm_key)) is not None:
        outcome = "denied" if isinstance(refusal, str) else "pending"
        if outcome == "denied":
            registry.metrics.record_call(entry.server, entry.public, outcome, endpoint=view.endpoint, who=view.name)
        log.info("tool call", request_id=ctx.request_id, server=entry.server, tool=entry.public, outcome=outcome)
        return error_result(entry, refusal, ctx.protocol_version) if isinstance(refusal, str) else refusal
    # The answers to a confirmation are the gateway's own; any other round's are the server's.
    rounds = {"task"} if confirming else {"input_responses", "request_state", "task"}
    extra = params.model_dump(by_alias=True, mode="json", exclude_none=True, include=rounds)
    wire = tool_request(entry, params.arguments, ctx.meta, extra)
    return await forward(registry, call, entry.server, "tools/call", wire, entry)
