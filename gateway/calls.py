"""Call policy, shared by every downstream path: admit a call, forward it with retries, shape the result.

`admit` decides whether a caller may call a name (resolve, view, draining); `forward_call` sends an
admitted call with the server's retry policy, counts it, times it and logs one line for it;
`shape_result` gives the answer the caller's protocol era and Manifold's labels. The SDK's server
(`downstream/server.py`) and the shortcut (`downstream/shortcut.py`) both go through these, so the
two differ only in plumbing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext

from gateway import __version__
from gateway.access import View
from gateway.backoff import Backoff
from gateway.catalog import Entry
from gateway.conversations import CONVERSATION
from gateway.era import LOG_LEVEL_KEY, RESERVED_META, Era
from gateway.internals.sdk import CALLER_CAPABILITIES
from gateway.labels import META_PREFIX
from gateway.logs import get_logger
from gateway.upstream.asks import ASKING, Caller, Mute, declared
from gateway.upstream.connection import FORWARDED, Upstream
from gateway.upstream.errors import CallFailed, describe

if TYPE_CHECKING:
    from gateway.registry import Registry

Json = dict[str, Any]
SERVER_INFO = {"name": "manifold", "version": __version__}
MAX_INPUT_ROUNDS = 16
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


def admit(registry: Registry, view: View, name: str, request_id: Any, *, draining: bool) -> Entry:
    """The catalog entry a caller with `view` may call under `name`.

    Raises `MCPError`: -32602 for a name that is unknown or outside the view (the same answer, so a
    view does not reveal what it hides), `Draining` once the gateway is shutting down; `HeldTool` for a
    tool in the view that its pin holds back.
    """
    entry = registry.catalog.resolve(name)
    if entry is None and (held := registry.catalog.held.get(name)) is not None and view.allows(held):
        log.info("tool call", request_id=request_id, server=held.server, tool=name[:128], outcome="held")
        registry.metrics.record_call(held.server, held.public, "held", endpoint=view.endpoint)
        raise HeldTool(held)
    if entry is None and (own := registry.conversations.resolve(CONVERSATION.get(), name)) is not None:
        entry = own  # a tool of a server this conversation handed over: its own, outside any token's scope
    elif entry is None or not view.allows(entry):
        log.info("tool call", request_id=request_id, tool=name[:128], outcome="unknown_tool")
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
    if draining:
        raise Draining()
    return entry


def forwardable_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's `_meta` minus its protocol envelope and progress token (the upstream gets its own); a 2026
    request's log level opt-in is passed on."""
    if not meta:
        return {}
    return {
        k: v
        for k, v in meta.items()
        if k not in ("progress_token", "progressToken") and (not k.startswith(RESERVED_META) or k == LOG_LEVEL_KEY)
    }


def talks(caller: Caller | None) -> bool:
    """Whether the server's log lines or requests have somewhere to go: then the call takes the SDK's session,
    which hears them, not the lean channel."""
    if caller is None:
        return False
    return caller.wants_logs or any(k in caller.capabilities for k in ASKING)


def with_log_level(meta: Mapping[str, Any], caller: Caller | None, upstream: Upstream) -> Mapping[str, Any]:
    """A 2025-era caller's session log level, as the per-request opt-in a 2026-era server reads."""
    level = getattr(caller, "level", None)
    if level is None or not Era.of(upstream.protocol_version).modern or LOG_LEVEL_KEY in meta:
        return meta
    return {**meta, LOG_LEVEL_KEY: level}


def error_result(entry: Entry, reason: str, version: str) -> Json:
    """An `isError` result naming the server and the reason, for the model to read."""
    result: Json = {"content": [{"type": "text", "text": f"{entry.public}: {reason}"}], "isError": True}
    return shape_result(result, entry, version)


def shape_result(raw: Json, entry: Entry, version: str) -> Json:
    """The upstream's result for a caller of protocol `version`, labelled with its server and trust, shaped for
    the caller's era (`Era.shape`)."""
    labels = {f"{META_PREFIX}server": entry.server, f"{META_PREFIX}trust": entry.labels.trust}
    return Era.of(version).shape(
        raw, "tools/call", SERVER_INFO, labels=labels, server=entry.server, subject=entry.public
    )


class ProgressRelay:
    """Forwards upstream progress to the caller in order, and lets the result wait for the last one."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self._ctx = ctx
        self._lock = anyio.Lock()
        self._pending = 0
        self._idle = anyio.Event()
        self._idle.set()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self._pending += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        try:
            async with self._lock:
                await self._ctx.session.report_progress(progress, total, message)
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()

    async def drain(self) -> None:
        """Wait until every progress notice that has arrived so far has been sent on."""
        await anyio.lowlevel.checkpoint()
        with anyio.move_on_after(5):
            await self._idle.wait()


async def call_with_retries(
    upstream: Upstream,
    entry: Entry,
    arguments: Mapping[str, Any] | None,
    meta: Mapping[str, Any],
    relay: ProgressRelay | None,
    extra: Mapping[str, Any] | None = None,
    *,
    lean: bool = True,
) -> Json:
    """Call once; on a transient failure retry read-only/idempotent tools with capped backoff."""
    policy = upstream.spec.retry
    backoff = Backoff(policy.initial_delay, policy.max_delay, jitter=(0.8, 1.2))
    attempt = 1
    while True:
        try:
            return await upstream.call(entry.original, arguments, meta, relay, extra, lean=lean)
        except CallFailed as failure:
            may_retry = failure.repeatable or (failure.transient and entry.labels.retryable)
            if not may_retry or attempt >= policy.attempts:
                raise
            log.info("retrying call", server=entry.server, tool=entry.public, attempt=attempt, reason=str(failure))
            upstream.retried()
            await anyio.sleep(backoff.delay())
            attempt += 1
            # A server that is reconnecting gets a moment, bounded so a dead one fails the call soon.
            await upstream.wait_up(min(upstream.spec.startup_timeout, policy.max_delay))


CONFIRM_KEY = "manifold/confirm"
CONFIRM_SCHEMA: Json = {
    "type": "object",
    "properties": {"allow": {"type": "boolean", "title": "Allow this call?"}},
    "required": ["allow"],
}


def confirm_state(key: bytes, entry: Entry, arguments: Mapping[str, Any] | None) -> str:
    """The `requestState` of a confirmation: an HMAC under `key` of the tool and its arguments."""
    text = json.dumps([entry.public, arguments or {}], sort_keys=True, default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


async def confirm(
    ctx: ServerRequestContext[Any], entry: Entry, params: types.CallToolRequestParams, key: bytes
) -> Json | None:
    """Ask the human to allow a gated call. None when allowed; else the result to answer with.

    2025-era clients are asked with an `elicitation/create` request; 2026-era clients get an
    `input_required` result and retry with the answer, tied to this tool and these arguments.
    """
    version = ctx.protocol_version
    modern = Era.of(version).modern
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return error_result(
            entry,
            "this tool needs the user's confirmation, but this client cannot ask (it did not declare the "
            "elicitation capability); the call was not made",
            version,
        )
    arguments = json.dumps(params.arguments or {}, indent=2, default=str)
    message = f"Allow {entry.public} (server '{entry.server}') with these arguments?\n{arguments[:4000]}"
    if modern:
        state = confirm_state(key, entry, params.arguments)
        answer = (params.input_responses or {}).get(CONFIRM_KEY)
        if answer is None or not hmac.compare_digest(params.request_state or "", state):
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(message=message, requested_schema=CONFIRM_SCHEMA)
            )
            pending = types.InputRequiredResult(input_requests={CONFIRM_KEY: request}, request_state=state)
            return pending.model_dump(by_alias=True, mode="json", exclude_none=True)
        result = answer if isinstance(answer, types.ElicitResult) else types.ElicitResult.model_validate(answer)
    else:
        result = await ctx.session.elicit_form(message, CONFIRM_SCHEMA, related_request_id=ctx.request_id)
    if result.action == "accept" and (result.content or {}).get("allow") is True:
        return None
    return error_result(entry, "the user did not allow this call; it was not made", version)


async def call_tool(
    registry: Registry,
    ctx: ServerRequestContext[Any],
    params: types.CallToolRequestParams,
    view: View,
    *,
    draining: bool,
    confirm_key: bytes,
    caller: Caller | None = None,
) -> Json:
    """Serve one downstream `tools/call` that came through the SDK's server."""
    try:
        entry = admit(registry, view, params.name, ctx.request_id, draining=draining)
    except HeldTool as held:
        return error_result(held.entry, held.reason, ctx.protocol_version)
    confirming = view.confirms(entry)
    if confirming and (refusal := await confirm(ctx, entry, params, confirm_key)) is not None:
        outcome = "pending" if refusal.get("resultType") == "input_required" else "denied"
        if outcome == "denied":
            registry.metrics.record_call(entry.server, entry.public, outcome, endpoint=view.endpoint)
        log.info("tool call", request_id=ctx.request_id, server=entry.server, tool=entry.public, outcome=outcome)
        return refusal
    wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)
    return await forward_call(
        registry,
        entry,
        params.arguments,
        forwardable_meta(ctx.meta),
        request_id=ctx.request_id,
        version=ctx.protocol_version,
        relay=ProgressRelay(ctx) if wants_progress else None,
        headers=ctx.request.headers if ctx.request is not None else None,
        caller=caller,
        # The answers to a confirmation are the gateway's own; any other round's are the server's.
        extra=params.model_dump(
            by_alias=True,
            mode="json",
            exclude_none=True,
            include={"task"} if confirming else {"input_responses", "request_state", "task"},
        ),
        endpoint=view.endpoint,
    )


async def answer_rounds(
    upstream: Upstream,
    entry: Entry,
    arguments: Mapping[str, Any] | None,
    meta: Mapping[str, Any],
    relay: ProgressRelay | None,
    caller: Caller,
    raw: Json,
) -> Json:
    """A 2026 server's `input_required` answer for a 2025-era caller: ask the caller each request on its
    stream, then call again with the answers and the server's state, until the server completes."""
    for _ in range(MAX_INPUT_ROUNDS):
        if raw.get("resultType") != "input_required":
            return raw
        requests = raw.get("inputRequests")
        answers: Json = {}
        for key, request in (requests if isinstance(requests, dict) else {}).items():
            method = request.get("method") if isinstance(request, dict) else None
            params = request.get("params") if isinstance(request, dict) else None
            answers[key] = await upstream.callers.ask_of(
                caller, str(method), params if isinstance(params, dict) else {}
            )
        extra: Json = {"inputResponses": answers}
        if "requestState" in raw:
            extra["requestState"] = raw["requestState"]
        raw = await upstream.call(entry.original, arguments, meta, relay, extra, lean=False)
    raise MCPError(
        types.INTERNAL_ERROR, f"server '{entry.server}' asked for input more than {MAX_INPUT_ROUNDS} times in a row"
    )


def _account(registry: Registry, entry: Entry, outcome: str, elapsed: float, endpoint: str, request_id: Any) -> None:
    """A forwarded call's metrics and its log line."""
    registry.metrics.record_call(entry.server, entry.public, outcome, elapsed, endpoint)
    log.info(
        "tool call",
        request_id=request_id,
        server=entry.server,
        tool=entry.public,
        duration_ms=round(elapsed * 1000, 2),
        outcome=outcome,
    )


async def forward_call(
    registry: Registry,
    entry: Entry,
    arguments: Mapping[str, Any] | None,
    meta: Mapping[str, Any],
    *,
    request_id: Any,
    version: str,
    relay: ProgressRelay | None = None,
    headers: Mapping[str, str] | None = None,
    caller: Caller | None = None,
    extra: Mapping[str, Any] | None = None,
    endpoint: str = "",
) -> Json:
    """Forward one allowed call to its server; count it, time it and log one line for it.

    Returns the labelled result (failures that never reached a result become `isError` results);
    raises `MCPError` for an error the server answered with. `headers` are the caller's HTTP
    headers (lower-case names), the source of the server's `forward_headers`. `caller` is who the
    server's requests of the user go to; `extra` carries a 2026 retry's `inputResponses`/`requestState`.
    """
    upstream = registry.upstreams.get(entry.server) or registry.conversations.handed(CONVERSATION.get(), entry.server)
    if upstream is None:
        return error_result(entry, f"server '{entry.server}' is gone", version)
    if upstream.spec.forward_headers and headers is not None:
        wanted = ((h, h.lower()) for h in upstream.spec.forward_headers)
        FORWARDED.set({h: headers[low] for h, low in wanted if low in headers})
    # No caller (the shortcut's plain calls): nothing can be relayed, so no capability to ask through is declared,
    # and the call is still counted as some other session's, so no other caller is asked in its place.
    CALLER_CAPABILITIES.set(declared(upstream.spec, caller.capabilities) if caller is not None else {})
    if caller is not None:
        meta = with_log_level(meta, caller, upstream)
    in_flight = caller if caller is not None else Mute()

    async def exchange(upstream: Upstream) -> Json:
        with upstream.callers.serving(in_flight):
            raw = await call_with_retries(upstream, entry, arguments, meta, relay, extra, lean=not talks(caller))
            if caller is not None and not Era.of(version).modern:
                raw = await answer_rounds(upstream, entry, arguments, meta, relay, caller, raw)
            if caller is not None:
                await upstream.callers.settle()
            return raw

    started = time.perf_counter()
    outcome = "cancelled"
    try:
        capabilities = caller.capabilities if caller is not None else None
        async with registry.connection(upstream, version, capabilities, entry.original) as serving:
            raw = await exchange(serving)
        outcome = "tool_error" if raw.get("isError") else "ok"
    except CallFailed as failure:
        outcome = failure.outcome
        return error_result(entry, str(failure), version)
    except MCPError as e:
        outcome = "tool_error"
        raise MCPError(e.code, describe(e), e.error.data) from None
    finally:
        elapsed = time.perf_counter() - started
        # counted and logged once the caller's answer is on its way: the bookkeeping stays off its latency
        asyncio.get_running_loop().call_soon(_account, registry, entry, outcome, elapsed, endpoint, request_id)
    if relay is not None:
        await relay.drain()
    return shape_result(raw, entry, version)
