"""The one way a request goes upstream: tool calls, prompts, resources, completions and tasks alike.

`forward` finds the request's server (one its conversation handed over included), takes the
connection the request needs (`Registry.connection`), declares what the caller can answer, passes on
its log level and the headers the server wants, marks the request in flight so the server's
questions and log lines reach its caller, retries a tool call that may be retried, puts a 2026-era
server's questions to a 2025-era caller (`rounds.answer_rounds`), and labels the answer with its
server and trust and shapes it for the caller's era (`Era.shape`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp import MCPError

from gateway import SERVER_INFO
from gateway.catalog.labels import META_PREFIX
from gateway.catalog.merged import Entry
from gateway.observe import tracing
from gateway.observe.logs import get_logger
from gateway.observe.tracing import Tracing, carry, failed
from gateway.policy.backoff import Backoff
from gateway.protocol.era import LOG_LEVEL_KEY, RESERVED_META, Era
from gateway.protocol.errors import CallFailed, State, describe
from gateway.relay.asks import Caller, Mute, declared, talks
from gateway.relay.context import CallContext
from gateway.relay.rounds import answer_rounds
from gateway.upstream.server import UpstreamServer
from gateway.upstream.transports.http import FORWARDED

if TYPE_CHECKING:
    from gateway.core.registry import Registry

Json = dict[str, Any]
log = get_logger("calls")
QUIET_OUTCOMES = frozenset({"ok", "cancelled"})
"""Outcomes of a tool call whose log line is a debug line (see `_account`)."""


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


def tool_request(
    entry: Entry, arguments: Mapping[str, Any] | None, meta: Mapping[str, Any] | None, extra: Json | None = None
) -> Json:
    """The `tools/call` params for `entry`'s server: its original name, the caller's forwardable `_meta`, and
    `extra` (a task, a 2026 retry's answers). `arguments` is optional on the wire, but servers that validate it as
    an object refuse a call without it."""
    params: Json = {"name": entry.original, **(extra or {}), "arguments": dict(arguments or {})}
    if forwarded := forwardable_meta(meta):
        params["_meta"] = forwarded
    return params


def with_log_level(meta: Mapping[str, Any], caller: Caller, upstream: UpstreamServer) -> Mapping[str, Any]:
    """A 2025-era caller's session log level, as the per-request opt-in a 2026-era server reads."""
    level = getattr(caller, "level", None)
    if level is None or not Era.of(upstream.protocol_version).modern or LOG_LEVEL_KEY in meta:
        return meta
    return {**meta, LOG_LEVEL_KEY: level}


def upstream_of(registry: Registry, server: str, conversation: str | None) -> UpstreamServer | None:
    """The server a request names: a configured or runtime one, or one the request's conversation handed over."""
    return registry.upstreams.get(server) or registry.conversations.handed(conversation, server)


def labelled(raw: Json, method: str, server: str, trust: str, version: str, subject: str = "") -> Json:
    """A server's answer for a caller of protocol `version`: labelled with its server and trust, shaped for the
    caller's era (`Era.shape`)."""
    labels = {f"{META_PREFIX}server": server, f"{META_PREFIX}trust": trust}
    return Era.of(version).shape(raw, method, SERVER_INFO, labels=labels, server=server, subject=subject)


def shape_result(raw: Json, entry: Entry, version: str) -> Json:
    """A tool's result for a caller of protocol `version` (`labelled`)."""
    return labelled(raw, "tools/call", entry.server, entry.labels.trust, version, entry.public)


def error_result(entry: Entry, reason: str, version: str) -> Json:
    """An `isError` result naming the tool and the reason, for the model to read."""
    result: Json = {"content": [{"type": "text", "text": f"{entry.public}: {reason}"}], "isError": True}
    return shape_result(result, entry, version)


async def forward(
    registry: Registry,
    call: CallContext,
    server: str,
    method: str,
    params: Json,
    entry: Entry | None = None,
) -> Json:
    """Send one admitted request to `server` and return its answer, labelled and shaped for the caller.

    A tool call names its catalog `entry` (original name in `params`): it is retried by the server's policy,
    counted, timed and logged, and a failure that reached no answer becomes an `isError` result. Any other
    request's such failure is an `MCPError`. An error the server answered with is an `MCPError` either way.
    """
    upstream = upstream_of(registry, server, call.conversation)
    if upstream is None:
        if entry is not None:
            return error_result(entry, f"server '{server}' is gone", call.version)
        raise MCPError(types.INTERNAL_ERROR, f"server '{server}' is gone")
    spec = upstream.spec
    if spec.forward_headers and call.headers is not None:
        wanted = ((h, h.lower()) for h in spec.forward_headers)
        FORWARDED.set({h: call.headers[low] for h, low in wanted if low in call.headers})
    caller = call.caller
    # No caller (the shortcut's plain calls): nothing can be relayed, so no capability to ask through is declared,
    # and the request counts as some other session's, so no other caller is asked in its place.
    capabilities = declared(spec, caller.capabilities) if caller is not None else {}
    if caller is not None:
        meta = with_log_level(params.get("_meta") or {}, caller, upstream)
        params = {**params, "_meta": meta} if meta else params
    lean = method == "tools/call" and not talks(caller)
    tracer = tracing.ACTIVE
    tally = _Tally(entry.original if entry is not None else params.get("name")) if tracer is not None else None

    async def exchange(serving: UpstreamServer) -> Json:
        def send(rounds: Json, lean: bool = lean) -> Awaitable[Json]:
            if tracer is not None and tally is not None:
                return _traced(tracer, tally, serving, method, {**params, **rounds}, call, lean, capabilities)
            return serving.request(method, {**params, **rounds}, call.progress, lean=lean, capabilities=capabilities)

        with serving.callers.serving(caller if caller is not None else Mute()):
            raw = await _with_retries(serving, entry, send) if entry is not None else await send({})
            if caller is not None and not Era.of(call.version).modern:
                raw = await answer_rounds(raw, caller, serving.callers, lambda r: send(r, False), server)
            if caller is not None:
                await serving.callers.settle()
            return raw

    started = time.perf_counter()
    outcome = "cancelled"
    try:
        tool = entry.original if entry is not None else None
        known = caller.capabilities if caller is not None else None
        async with registry.connection(upstream, call.version, known, tool, call.conversation, plain=lean) as serving:
            raw = await exchange(serving)
        outcome = "tool_error" if raw.get("isError") else "ok"
    except CallFailed as failure:
        outcome = failure.outcome
        if entry is not None:
            return error_result(entry, str(failure), call.version)
        log.info("request failed", server=server, method=method, reason=str(failure))
        raise MCPError(types.INTERNAL_ERROR, str(failure)) from None
    except MCPError as e:
        outcome = "tool_error"
        raise MCPError(e.code, describe(e), e.error.data) from None
    finally:
        if tally is not None:
            _traced_outcome(server, outcome, tally)
        if entry is not None:
            elapsed = time.perf_counter() - started
            # counted and logged once the caller's answer is on its way: the bookkeeping stays off its latency
            asyncio.get_running_loop().call_soon(_account, registry, entry, outcome, elapsed, call, params)
    if call.progress is not None:
        await call.progress.drain()
    if entry is not None:
        return shape_result(raw, entry, call.version)
    return labelled(raw, method, server, "trusted" if spec.trusted else "outside", call.version)


async def _with_retries(upstream: UpstreamServer, entry: Entry, send: Callable[[Json], Awaitable[Json]]) -> Json:
    """Send once; on a transient failure retry read-only/idempotent tools with capped backoff (a request that was
    never sent, any tool)."""
    policy = upstream.spec.retry
    backoff = Backoff(policy.initial_delay, policy.max_delay, jitter=(0.8, 1.2))
    attempt = 1
    while True:
        connection = upstream.connections
        try:
            return await send({})
        except CallFailed as failure:
            may_retry = failure.repeatable or (failure.transient and entry.labels.retryable)
            if not may_retry or attempt >= policy.attempts:
                raise
            log.info("retrying call", server=entry.server, tool=entry.public, attempt=attempt, reason=str(failure))
            upstream.retried()
            await anyio.sleep(backoff.delay())
            attempt += 1
            # A server that is reconnecting gets a moment, bounded so a dead one fails the call soon; when the
            # connection the call failed on is gone, the retry waits for a newer one (not the one still ending).
            gone = failure.dropped or upstream.ending or upstream.state is not State.UP
            await upstream.wait_up(min(upstream.spec.startup_timeout, policy.max_delay), connection if gone else None)


class _Tally:
    """A traced request's attempts upstream (tracing on only)."""

    __slots__ = ("attempts", "target")

    def __init__(self, target: Any) -> None:
        self.attempts = 0
        self.target = target if isinstance(target, str) else None


async def _traced(
    tracer: Tracing,
    tally: _Tally,
    serving: UpstreamServer,
    method: str,
    params: Json,
    call: CallContext,
    lean: bool,
    capabilities: Json,
) -> Json:
    """One attempt of a request upstream in a CLIENT span of its own (a child of the current server span), the
    request carrying THAT span's context: in `_meta` (in place of the caller's), and over HTTP in the
    `traceparent` header (see `observe.tracing`)."""
    tally.attempts += 1
    attributes: Json = {
        "mcp.method.name": method,
        "manifold.server": serving.name,
        "manifold.attempt": tally.attempts,
        "mcp.protocol.version": serving.protocol_version or "",
        "network.transport": "pipe" if serving.spec.kind == "stdio" else "tcp",
    }
    target = tally.target if method in ("tools/call", "prompts/get") else None
    if method == "tools/call" and target is not None:
        attributes["gen_ai.operation.name"] = "execute_tool"
        attributes["gen_ai.tool.name"] = target
    elif target is not None:
        attributes["gen_ai.prompt.name"] = target
    elif isinstance(uri := params.get("uri"), str):
        attributes["mcp.resource.uri"] = uri
    with tracer.sending(method, target, attributes) as span:
        meta = dict(params.get("_meta") or {})
        headers = carry(span, meta)
        sent = FORWARDED.set({**(FORWARDED.get() or {}), **headers})
        try:
            raw = await serving.request(
                method, {**params, "_meta": meta}, call.progress, lean=lean, capabilities=capabilities
            )
        except CallFailed as failure:
            failed(span, failure.outcome)
            raise
        finally:
            FORWARDED.reset(sent)
        if raw.get("isError") is True:
            failed(span, "tool_error")
        return raw


def _traced_outcome(server: str, outcome: str, tally: _Tally) -> None:
    """The server span's share of a forwarded request: its server, outcome and retries."""
    span = tracing.current_span()
    span.set_attribute("manifold.server", server)
    span.set_attribute("manifold.outcome", outcome)
    span.set_attribute("manifold.retries", max(0, tally.attempts - 1))
    if outcome != "ok" and not tracing.span_has_error(span):
        failed(span, outcome)


def _account(registry: Registry, entry: Entry, outcome: str, elapsed: float, call: CallContext, params: Json) -> None:
    """A forwarded call's metrics, its audit line (when kept) and its log line."""
    metrics = registry.metrics
    if metrics.audit is None:
        metrics.record_call(entry.server, entry.public, outcome, elapsed, call.endpoint, call.who)
    else:
        metrics.record_call(
            entry.server,
            entry.public,
            outcome,
            elapsed,
            call.endpoint,
            call.who,
            arguments=params.get("arguments"),
            trace_id=tracing.trace_id_of(params.get("_meta"), call.headers),
            request_id=call.request_id,
            subject=call.subject,
        )
    # A call that went as asked (answered, or cancelled by its caller) is a debug line: at the default level a busy
    # gateway would log a line per call, which is what the metrics count. Every other outcome is logged at info.
    (log.debug if outcome in QUIET_OUTCOMES else log.info)(
        "tool call",
        request_id=call.request_id,
        server=entry.server,
        tool=entry.public,
        duration_ms=round(elapsed * 1000, 2),
        outcome=outcome,
    )
