"""The shortcut: plain `tools/call` and `tools/list` answered straight from the HTTP request.

The SDK's streamable HTTP server spends milliseconds of CPU on every call (per-request tasks and
memory streams, SSE framing, model validation both ways). The requests that carry an agent's work
are few in kind and plain in shape, so this ASGI layer answers exactly those whose every header and
field it understands, as one `application/json` body, and hands everything else to the SDK untouched:
handshakes, listen streams, progress, confirmations, cursors and malformed envelopes.

Which requests it may take is its own rule (`_answer`'s checks: anything it cannot serve exactly as the
SDK path would goes there); admission is `gateway.core.calls`', forwarding and result shaping `core.forward`'s,
the listing `downstream.listing`'s, sessions `downstream.sessions`'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any
from uuid import uuid4

import anyio
from mcp import MCPError
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.catalog.merged import Entry
from gateway.core.calls import admit
from gateway.core.conversations import conversation_key
from gateway.core.forward import forward, tool_request
from gateway.downstream.gate import MESSAGE_KEY, owner_of, subject_of, view_of
from gateway.downstream.server import Frontend
from gateway.downstream.sessions import asks_capabilities
from gateway.downstream.tools import plain_call
from gateway.observe import tracing
from gateway.observe.logs import get_logger
from gateway.policy.access import View
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import INTERNAL_ERROR, REQUEST_CANCELLED, encode
from gateway.relay.context import CallContext

Json = dict[str, Any]
log = get_logger("shortcut")

SERVED = frozenset(
    {"tools/call", "tools/list", "notifications/cancelled", "initialize", "notifications/initialized", "ping"}
)
CALL_PARAMS = frozenset({"name", "arguments", "_meta"})
LIST_PARAMS = frozenset({"_meta"})
MAX_REMEMBERED = 1024
SPLIT_BODY = 256 * 1024  # a payload this large goes out in its own write
WATCH_AFTER = 0.1  # seconds a call runs before its caller's connection is watched


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
        self._legacy_calls: dict[tuple[str, Any], anyio.CancelScope] = {}
        self._header_bound: dict[str, tuple[Json | None, bool]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp":
            message = scope.get("state", {}).get(MESSAGE_KEY)
            if (
                scope["method"] == "POST"
                and isinstance(message, dict)
                and await self._serve(scope, message, receive, send)
            ):
                return
            session_id = _session_of(scope)
            sessions = self.frontend.sessions
            if session_id is not None and sessions.waking(session_id):
                if scope["method"] == "DELETE" and sessions.dormant(session_id):
                    await _reply(send, 200, b"", session_id)  # the gate forgets the session
                    return
                await sessions.wake(session_id, scope)  # the SDK serves this request, and the session from now on
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, message: Json, receive: Receive, send: Send) -> bool:
        """Answer the request and return True, or return False (having sent nothing) to pass it on."""
        method = message.get("method")
        if method not in SERVED:
            return False
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        headers = dict(pairs)
        if not await self._headers_ok(scope, headers):
            return False
        version = headers.get("mcp-protocol-version")
        session_id = headers.get("mcp-session-id")
        if method == "notifications/cancelled":
            return await self._cancel(message, version, session_id, send)
        if method == "notifications/initialized":
            if session_id is None or "id" in message or not self.frontend.sessions.dormant(session_id):
                return False
            await _reply(send, 202, b"", session_id)
            return True
        request_id = message.get("id")
        if not _plain_id(request_id):
            return False
        params = message.get("params")
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            return False
        if method == "initialize":
            return await self._open(scope, send, message, request_id, params, version, session_id)
        if method == "ping":
            if session_id is None or params or not self.frontend.sessions.dormant(session_id):
                return False
            await _respond(send, b"{}", request_id, 200, session_id)
            return True
        era = Era.of(version)
        if era.modern:
            if find_duplicated_routing_header(pairs) is not None:
                return False  # a repeated routing header: the SDK names it
            if not isinstance(classify_inbound_request(message, headers=headers), InboundModernRoute):
                return False
            return await self._answer(scope, receive, send, method, request_id, params, headers, era.version, None)
        if era.handshake and session_id is not None:
            sessions = self.frontend.sessions
            dormant = sessions.dormant(session_id)
            transport = None if dormant else sessions.transport(session_id)
            if transport is None and not dormant:
                return False
            with sessions.holding(transport):
                return await self._answer(
                    scope, receive, send, method, request_id, params, headers, era.version, session_id
                )
        return False

    async def _open(
        self,
        scope: Scope,
        send: Send,
        message: Json,
        request_id: Any,
        params: Json,
        version: str | None,
        session_id: str | None,
    ) -> bool:
        """A 2025-era `initialize` of a client that cannot be asked anything: answered as the SDK would, the
        session kept as one small record until it needs the SDK (see `downstream.sessions`)."""
        if session_id is not None or Era.of(version).modern or asks_capabilities(message):
            return False
        sessions = self.frontend.sessions
        limit = self.frontend.server.session_manager.max_sessions
        if limit is not None and sessions.full(limit):
            body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Too many open sessions"}}'
            await _reply(send, 503, body, None)
            return True
        view = view_of(scope.get("state"))
        answer = self.frontend.handshake(params, view)
        if answer is None:
            return False
        result, settled = answer
        opened = uuid4().hex
        opening = bytes(memoryview(encode(message)))  # an exact copy: orjson's own bytes keep 4 KiB spare
        sessions.open_dormant(opened, view.name, owner_of(scope.get("state")) or view.name, opening, settled)
        self.registry.metrics.count_request("initialize")
        await _respond(send, encode(result), request_id, 200, opened)
        return True

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
        conversation = conversation_key(session_id, owner_of(scope.get("state")), meta)
        if self.registry.conversations.has_handed(conversation):
            return False  # a conversation with servers of its own sees a listing of its own
        if method == "tools/list":
            if not params.keys() <= LIST_PARAMS:
                return False  # a cursor: the SDK path words the refusal
            if self.frontend.sessions.revealed(session_id):
                return False  # a search added tools to this session's listing
            self.registry.metrics.count_request(method)
            listing = tracing.NO_SPAN
            if tracing.ACTIVE is not None:
                listing = self._traced(method, params, headers, version, session_id, request_id, view)
            with listing:
                await _respond(send, self.frontend.listings.body(view, version), request_id, 200, session_id)
            return True
        name, arguments = params.get("name"), params.get("arguments")
        if not (params.keys() <= CALL_PARAMS and isinstance(name, str)):
            return False
        if arguments is not None and not isinstance(arguments, dict):
            return False
        modern = session_id is None
        talks = not modern and self.frontend.sessions.talks(session_id or "")
        if not plain_call(self.registry.catalog, view, name, meta, modern=modern, talks=talks):
            return False  # the SDK path serves it: `downstream.tools.plain_call` says why
        entry = self.registry.catalog.resolve(name)
        if modern and entry is not None and self._binds_headers(entry):
            schema = entry.input_schema
            if schema is not None and validate_mcp_param_headers(schema, arguments or {}, headers) is not None:
                return False  # the SDK words the header mismatch
        self.registry.metrics.count_request(method)
        key = (session_id, request_id) if session_id is not None else None
        result: Json | None = None
        failure: MCPError | None = None
        broken = False  # the gateway failed, not the call: HTTP 500 for a 2026 caller
        call_scope = anyio.CancelScope()
        watch = DisconnectWatch(receive, call_scope)
        try:
            traced = tracing.NO_SPAN  # off: one None check, nothing allocated
            if tracing.ACTIVE is not None:
                traced = self._traced(method, params, headers, version, session_id, request_id, view)
            with self.frontend.tracking_call(), call_scope, traced:
                if key is not None:
                    self._legacy_calls[key] = call_scope
                try:
                    draining = self.frontend.draining
                    entry = admit(self.registry, view, name, request_id, draining=draining, conversation=conversation)
                    call = CallContext(
                        version,
                        request_id,
                        conversation=conversation,
                        headers=headers,
                        endpoint=view.endpoint,
                        who=view.name,
                        subject=subject_of(owner_of(scope.get("state"))),
                    )
                    wire = tool_request(entry, arguments, meta)
                    result = await forward(self.registry, call, entry.server, "tools/call", wire, entry)
                except MCPError as e:
                    failure = e
                    tracing.note_failure(e.code)
                except Exception as e:
                    log.error("shortcut call failed", request_id=request_id, reason=repr(e)[:300])
                    failure, broken = MCPError(INTERNAL_ERROR, "Internal error"), True
                    tracing.note_failure(INTERNAL_ERROR)
                finally:
                    if key is not None and self._legacy_calls.get(key) is call_scope:
                        del self._legacy_calls[key]
        finally:
            disconnected = watch.stop()
        if failure is not None:
            status = 200 if not modern else 500 if broken else ERROR_CODE_HTTP_STATUS.get(failure.code, 200)
            body: Json = {"code": failure.code, "message": failure.error.message}
            if failure.error.data is not None:
                body["data"] = failure.error.data
            await _respond(send, encode(body), request_id, status, session_id, key=b"error")
        elif result is not None:
            await _respond(send, encode(result), request_id, 200, session_id)
        elif not modern and not disconnected:
            error = {"code": REQUEST_CANCELLED, "message": "Request cancelled"}
            await _respond(send, encode(error), request_id, 200, session_id, key=b"error")
        return True

    def _traced(
        self,
        method: str,
        params: Json,
        headers: Mapping[str, str],
        version: str,
        session_id: str | None,
        request_id: Any,
        view: View,
    ) -> AbstractContextManager[Any]:
        """The request's SERVER span, current while it is served (tracing on only)."""
        tracer = tracing.ACTIVE
        assert tracer is not None
        return tracer.request(
            method,
            params,
            headers,
            version=version,
            session_id=session_id,
            request_id=request_id,
            endpoint=view.endpoint,
            caller=view.name,
            path="shortcut",
        )

    def _binds_headers(self, entry: Entry) -> bool:
        """Whether the tool's input schema binds an argument to an `Mcp-Param-*` header (`x-mcp-header`); only
        then has a call's headers anything to be checked against (remembered per schema)."""
        schema = entry.input_schema
        known = self._header_bound.get(entry.public)
        if known is None or known[0] is not schema:
            known = (schema, schema is not None and b'"x-mcp-header"' in encode(schema))
            if len(self._header_bound) >= MAX_REMEMBERED * 64:
                self._header_bound.clear()  # tools come and go: the verdicts of gone ones are let go now and then
            self._header_bound[entry.public] = known
        return known[1]

    async def _cancel(self, message: Json, version: str | None, session_id: str | None, send: Send) -> bool:
        """A 2025-era `notifications/cancelled` for a call this lane is serving: cancel it, answer 202."""
        params = message.get("params")
        if session_id is None or not Era.of(version).handshake or not isinstance(params, dict):
            return False
        call_scope = self._legacy_calls.get((session_id, params.get("requestId")))
        sessions = self.frontend.sessions
        if sessions.dormant(session_id):
            if call_scope is not None:
                call_scope.cancel()  # without one, nothing of that id is in flight: nothing to do
        elif call_scope is None or sessions.transport(session_id) is None:
            return False
        else:
            call_scope.cancel()
        await _reply(send, 202, b"", session_id)
        return True


class DisconnectWatch:
    """Cancels a call when its caller goes away. Watching takes a task reading the request's `receive`, so it
    starts only once the call has run for `WATCH_AFTER` seconds: most calls are over sooner, and for them the
    task would cost more than the rest of the plumbing."""

    def __init__(self, receive: Receive, scope: anyio.CancelScope) -> None:
        self._receive, self._scope = receive, scope
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER, self._start)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(_disconnected(self._receive))
        self._task.add_done_callback(self._gone)

    def _gone(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            self._scope.cancel()

    def stop(self) -> bool:
        """Stop watching (the task ends at the loop's next turn); returns whether the caller went away."""
        self._timer.cancel()
        task = self._task
        if task is None:
            return False
        gone = task.done() and not task.cancelled()
        task.cancel()
        return gone


def _session_of(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"mcp-session-id":
            return str(value.decode("latin-1"))
    return None


async def _reply(send: Send, status: int, body: bytes, session_id: str | None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _headers(len(body), session_id)})
    await send({"type": "http.response.body", "body": body})


def _headers(length: int, session_id: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(length).encode())]
    if session_id is not None:
        headers.append((b"mcp-session-id", session_id.encode()))
    return headers


async def _respond(
    send: Send, payload: bytes, request_id: Any, status: int, session_id: str | None, key: bytes = b"result"
) -> None:
    """One JSON-RPC response whose result (or error) is already serialised."""
    head = b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"' + key + b'":'
    if len(payload) < SPLIT_BODY:
        body = head + payload + b"}"
        await send({"type": "http.response.start", "status": status, "headers": _headers(len(body), session_id)})
        await send({"type": "http.response.body", "body": body})
        return
    # a large payload is written as it is, not copied once more into one body
    length = len(head) + len(payload) + 1
    await send({"type": "http.response.start", "status": status, "headers": _headers(length, session_id)})
    await send({"type": "http.response.body", "body": head, "more_body": True})
    await send({"type": "http.response.body", "body": payload, "more_body": True})
    await send({"type": "http.response.body", "body": b"}"})
