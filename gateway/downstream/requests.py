"""What the SDK's server knows of a request beyond its params: the caller's view and identity (as the auth gate
left them), its 2025 session, its conversation, and what it carries upstream (`relay.context.CallContext`)."""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext

from gateway.core.conversations import conversation_key
from gateway.downstream.gate import owner_of, subject_of, view_of
from gateway.downstream.sessions import Sessions
from gateway.policy.access import OPEN_VIEW, View
from gateway.protocol.era import Era
from gateway.relay.asks import Caller
from gateway.relay.callers import SessionCaller
from gateway.relay.context import CallContext
from gateway.relay.progress import ProgressRelay

Json = dict[str, Any]
Ctx = ServerRequestContext[Any, Any]
SESSION_HEADER = "mcp-session-id"
PAGE_SIZE = 100


def request_view(ctx: Ctx) -> View:
    """The caller's view, as the auth gate left it on the HTTP request."""
    return view_of(ctx.request.state) if ctx.request is not None else OPEN_VIEW


def request_owner(ctx: Ctx) -> str:
    """Who the caller is (its token, or its OAuth rule and subject), as the auth gate left it."""
    return owner_of(ctx.request.state) if ctx.request is not None else OPEN_VIEW.name


def session_of(ctx: Ctx) -> str | None:
    """The request's `Mcp-Session-Id` (a 2025-era session's; a 2026-era request carries none that counts)."""
    return ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None


def legacy_session(ctx: Ctx) -> str | None:
    """The 2025-era session a request belongs to, if any."""
    return None if Era.of(ctx.protocol_version).modern else session_of(ctx)


def conversation_of(ctx: Ctx) -> str:
    """The conversation a request belongs to (`conversations.conversation_key`)."""
    meta = ctx.meta if isinstance(ctx.meta, dict) else None
    return conversation_key(legacy_session(ctx), request_owner(ctx), meta)


def task_owner(ctx: Ctx) -> str:
    """Whose a task is: a 2025-era caller's session, else (sessionless) the caller's token (for an OAuth token: its
    rule and subject)."""
    session_id = legacy_session(ctx)
    return f"session:{session_id}" if session_id else f"token:{request_owner(ctx)}"


def caller_of(ctx: Ctx, sessions: Sessions) -> SessionCaller:
    """The request's caller, as the relays see it (its session's log level included)."""
    session_id = session_of(ctx)
    asking = sessions.asking(session_id) if sessions.asking is not None and session_id else None
    return SessionCaller(ctx, session_id or f"request:{id(ctx)}", sessions.level(session_id), asking=asking)


def call_context(ctx: Ctx, caller: Caller | None) -> CallContext:
    """What the request carries upstream: its era, its caller, its conversation, headers and progress."""
    wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)
    return CallContext(
        ctx.protocol_version,
        ctx.request_id,
        caller=caller,
        conversation=conversation_of(ctx),
        headers=ctx.request.headers if ctx.request is not None else None,
        endpoint=request_view(ctx).endpoint,
        who=request_view(ctx).name,
        progress=ProgressRelay(ctx) if wants_progress else None,
        subject=subject_of(request_owner(ctx)),
    )


def rounds_of(params: Any) -> Json:
    """A 2026 retry's `inputResponses` and `requestState` (wire form), to pass on unchanged."""
    dumped: Json = params.model_dump(
        by_alias=True, mode="json", exclude_none=True, include={"input_responses", "request_state"}
    )
    return dumped


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
