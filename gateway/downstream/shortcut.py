"""The fast lane: `tools/call` and `tools/list` answered straight from the HTTP request.

The SDK's streamable HTTP server spends milliseconds of CPU on every call (per-request tasks and
memory streams, SSE framing, model validation both ways). The requests that carry an agent's work
are few in kind and plain in shape, so this ASGI layer answers exactly those whose every header and
field it understands, with the result the SDK path would give (as one `application/json` body), and
hands everything else to the SDK untouched: handshakes, listen streams, progress, confirmations,
cursors, unknown tools, malformed envelopes and every error the SDK words itself.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import anyio
import orjson
from mcp import MCPError
from mcp.client.session import _later_revision_fields
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.calls import forward_call, forwardable_meta
from gateway.downstream.gate import MESSAGE_KEY, view_of
from gateway.downstream.server import LISTING_CACHE, Frontend
from gateway.logs import get_logger
from gateway.upstream.connection import SERVER_INFO_KEY

Json = dict[str, Any]
log = get_logger("shortcut")

CALL_PARAMS = frozenset({"name", "arguments", "_meta"})
LIST_PARAMS = frozenset({"_meta"})
PARAM_HEADER_PREFIX = "mcp-param-"
REQUEST_CANCELLED = -32800
INTERNAL_ERROR = -32603
MAX_REMEMBERED = 1024


def encode(value: Any) -> bytes:
    """JSON bytes; orjson, or the standard library for what orjson refuses (integers past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _plain_id(value: Any) -> bool:
    return isinstance(value, str) or (type(value) is int and -(2**63) <= value < 2**63)


def _accepts_both(accept: str) -> bool:
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "*/*" in types:
        return True
    json_ok = "application/json" in types or "application/*" in types
    return json_ok and ("text/event-stream" in types or "text/*" in types)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Shortcut:
    """ASGI middleware in front of the SDK's `/mcp` app (behind the auth gate, which parses the body)."""

    def __init__(self, app: ASGIApp, frontend: Frontend, security: TransportSecuritySettings | None) -> None:
        self.app = app
        self.frontend = frontend
        self.registry = frontend.registry
        self._security = TransportSecurityMiddleware(security)
        self._header_verdicts: dict[tuple[str | None, str | None, str | None], bool] = {}
        self._accept_verdicts: dict[str, bool] = {}
        self._listings: dict[tuple[int, str, str], bytes] = {}
        self._legacy_calls: dict[tuple[str, Any], asyncio.Task[Json]] = {}
        self._foreign: dict[str, frozenset[str]] = {}
        self._server_info = {"name": frontend.server.name, "version": frontend.server.version}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/mcp":
            message = scope.get("state", {}).get(MESSAGE_KEY)
            if isinstance(message, dict) and await self._serve(scope, message, receive, send):
                return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, message: Json, receive: Receive, send: Send) -> bool:
        """Answer the request and return True, or return False (having sent nothing) to pass it on."""
        method = message.get("method")
        if method not in ("tools/call", "tools/list", "notifications/cancelled"):
            return False
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        headers = dict(pairs)
        if not await self._headers_ok(scope, headers):
            return False
        version = headers.get("mcp-protocol-version")
        session_id = headers.get("mcp-session-id")
        if method == "notifications/cancelled":
            return await self._cancel(message, version, session_id, send)
        request_id = message.get("id")
        if not _plain_id(request_id):
            return False
        params = message.get("params")
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            return False
        if version in MODERN_PROTOCOL_VERSIONS:
            if find_duplicated_routing_header(pairs) is not None:
                return False  # a repeated routing header: the SDK names it
            if not isinstance(classify_inbound_request(message, headers=headers), InboundModernRoute):
                return False
            return await self._answer(scope, receive, send, method, request_id, params, headers, version, None)
        if version in HANDSHAKE_PROTOCOL_VERSIONS and session_id is not None:
            transport = self._live_transport(session_id)
            if transport is None:
                return False
            with _holding(transport):
                return await self._answer(
                    scope, receive, send, method, request_id, params, headers, version, session_id
                )
        return False

    async def _headers_ok(self, scope: Scope, headers: Mapping[str, str]) -> bool:
        """Host, Origin and Content-Type as the SDK checks them (verdicts remembered), and an Accept of both."""
        key = (headers.get("host"), headers.get("origin"), headers.get("content-type"))
        verdict = self._header_verdicts.get(key)
        if verdict is None:
            content_type = (key[2] or "").split(";")[0].strip()
            verdict = content_type == "application/json" and (
                await self._security.validate_request(Request(scope), is_post=True) is None
            )
            if len(self._header_verdicts) < MAX_REMEMBERED:
                self._header_verdicts[key] = verdict
        if not verdict:
            return False
        accept = headers.get("accept", "")
        accepted = self._accept_verdicts.get(accept)
        if accepted is None:
            accepted = _accepts_both(accept)
            if len(self._accept_verdicts) < MAX_REMEMBERED:
                self._accept_verdicts[accept] = accepted
        return accepted

    def _live_transport(self, session_id: str) -> Any | None:
        """The SDK transport of an open 2025-era session the frontend already knows, or None."""
        if not self.frontend.knows_session(session_id):
            return None
        # The SDK keeps no public handle on a session's transport; without these internals the SDK serves.
        sessions = getattr(self.frontend.server.session_manager, "_server_instances", {})
        transport = sessions.get(session_id)
        if transport is None or transport.is_terminated or not hasattr(transport, "_requests_in_flight"):
            return None
        idle = transport.idle_scope
        return None if idle is not None and idle.cancel_called else transport

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        method: str,
        request_id: Any,
        params: Json,
        headers: Mapping[str, str],
        version: str,
        session_id: str | None,
    ) -> bool:
        view = view_of(scope.get("state"))
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            return False
        if method == "tools/list":
            if not params.keys() <= LIST_PARAMS:
                return False  # a cursor: the SDK path words the refusal
            self.registry.metrics.count_request(method)
            await _respond(send, self._listing(version, view), request_id, 200, session_id)
            return True
        name, arguments = params.get("name"), params.get("arguments")
        if not (params.keys() <= CALL_PARAMS and isinstance(name, str)):
            return False
        if arguments is not None and not isinstance(arguments, dict):
            return False
        if meta is not None and "progressToken" in meta:
            return False  # progress is relayed by the SDK path
        entry = self.registry.catalog.resolve(name)
        if entry is None or not view.allows(entry) or view.confirms(entry) or self.frontend.draining:
            return False
        modern = session_id is None
        if modern and (arguments or any(h.startswith(PARAM_HEADER_PREFIX) for h in headers)):
            schema = entry.input_schema
            if schema is not None and validate_mcp_param_headers(schema, arguments or {}, headers) is not None:
                return False
        self.registry.metrics.count_request(method)
        call = forward_call(
            self.registry,
            entry,
            arguments,
            forwardable_meta(meta),
            request_id=request_id,
            modern=modern,
            headers=headers,
        )
        with self.frontend.tracking_call():
            task = asyncio.ensure_future(call)
            key = (session_id, request_id) if session_id is not None else None
            if key is not None:
                self._legacy_calls[key] = task
            watcher = asyncio.ensure_future(_disconnected(receive))
            try:
                await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
                if key is not None and self._legacy_calls.get(key) is task:
                    del self._legacy_calls[key]
                if not task.done():
                    task.cancel()
                    with suppress(asyncio.CancelledError, Exception):
                        await task
        if task.cancelled():
            if not modern and not watcher.done():
                error = {"code": REQUEST_CANCELLED, "message": "Request cancelled"}
                await _respond(send, encode(error), request_id, 200, session_id, key=b"error")
            return True
        await self._send_outcome(send, task, request_id, version, session_id)
        return True

    async def _send_outcome(
        self, send: Send, task: asyncio.Task[Json], request_id: Any, version: str, session_id: str | None
    ) -> None:
        modern = session_id is None
        error = task.exception()
        if isinstance(error, MCPError):
            body: Json = {"code": error.code, "message": error.error.message}
            if error.error.data is not None:
                body["data"] = error.error.data
            status = ERROR_CODE_HTTP_STATUS.get(error.code, 200) if modern else 200
            await _respond(send, encode(body), request_id, status, session_id, key=b"error")
            return
        if error is not None:
            log.error("fast-lane call failed", request_id=request_id, reason=repr(error)[:300])
            body = {"code": INTERNAL_ERROR, "message": "Internal error"}
            await _respond(send, encode(body), request_id, 500 if modern else 200, session_id, key=b"error")
            return
        result = task.result()
        if modern:
            result["_meta"] = {**result.get("_meta", {}), SERVER_INFO_KEY: self._server_info}
        else:
            if "resultType" in result:  # a modern-only answer (e.g. input_required) a 2025 client cannot take
                body = {"code": INTERNAL_ERROR, "message": "Handler returned an invalid result"}
                await _respond(send, encode(body), request_id, 200, session_id, key=b"error")
                return
            foreign = self._foreign.get(version)
            if foreign is None:
                foreign = self._foreign[version] = _later_revision_fields("tools/call", version)
            if not foreign.isdisjoint(result):
                result = {k: v for k, v in result.items() if k not in foreign}
        await _respond(send, encode(result), request_id, 200, session_id)

    def _listing(self, version: str, view: Any) -> bytes:
        """The serialised tools/list result for this catalog version, protocol version and view."""
        catalog_version = self.registry.catalog.version
        key = (catalog_version, version, view.name)
        cached = self._listings.get(key)
        if cached is None:
            result: Json = {"tools": self.frontend.visible(view)}
            if version in MODERN_PROTOCOL_VERSIONS:
                result.update(
                    cacheScope=LISTING_CACHE.scope,
                    resultType="complete",
                    ttlMs=LISTING_CACHE.ttl_ms,
                    _meta={SERVER_INFO_KEY: self._server_info},
                )
            cached = encode(result)
            self._listings = {k: v for k, v in self._listings.items() if k[0] == catalog_version}
            self._listings[key] = cached
        return cached

    async def _cancel(self, message: Json, version: str | None, session_id: str | None, send: Send) -> bool:
        """A 2025-era `notifications/cancelled` for a call this lane is serving: cancel it, answer 202."""
        params = message.get("params")
        if session_id is None or version not in HANDSHAKE_PROTOCOL_VERSIONS or not isinstance(params, dict):
            return False
        task = self._legacy_calls.get((session_id, params.get("requestId")))
        if task is None or self._live_transport(session_id) is None:
            return False
        task.cancel()
        await send({"type": "http.response.start", "status": 202, "headers": _headers(0, session_id)})
        await send({"type": "http.response.body", "body": b""})
        return True


def _headers(length: int, session_id: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(length).encode())]
    if session_id is not None:
        headers.append((b"mcp-session-id", session_id.encode()))
    return headers


async def _respond(
    send: Send, payload: bytes, request_id: Any, status: int, session_id: str | None, key: bytes = b"result"
) -> None:
    """One JSON-RPC response whose result (or error) is already serialised."""
    body = b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"' + key + b'":' + payload + b"}"
    await send({"type": "http.response.start", "status": status, "headers": _headers(len(body), session_id)})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def _holding(transport: Any) -> Iterator[None]:
    """Count a request as in flight on an SDK session, as its own transport does, so it does not idle out."""
    idle, timeout = transport.idle_scope, transport._idle_timeout
    if idle is None or timeout is None:
        yield
        return
    transport._requests_in_flight += 1
    idle.deadline = math.inf
    try:
        yield
    finally:
        transport._requests_in_flight -= 1
        if not transport._requests_in_flight:
            idle.deadline = anyio.current_time() + timeout
