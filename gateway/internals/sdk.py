"""The MCP SDK's private names, and what the gateway builds on them. Nowhere else touches them.

- `negotiate`: the SDK client's modern-first connect policy (`negotiate_auto`: `server/discover`, then
  `initialize`), with the probe's timeout (`mcp.client.session.DISCOVER_TIMEOUT_SECONDS`) set per server.
- `ClientSession._stamp`: how a session stamps a request (session id, protocol version, the 2026
  envelope and `Mcp-*` headers); the lean channels stamp their requests the same way, and a request sent
  for a caller declares that caller's capabilities in its 2026 envelope.
- `_later_revision_fields`: the result fields an older protocol revision does not know.
- The SDK client transport's stand-in errors for HTTP failures, which carry no type or data of their
  own: `channel_error` turns them into the gateway's failure types, the one place text is compared.
- `send_unchecked`: a request sent through a session's dispatcher (`ClientSession._dispatcher`), stamped as
  the session stamps it, whose result is not checked against the SDK's tables (2025-11-25 task results,
  which the SDK 2.x no longer models, would fail that check).
- `absorb_tools`: a listing read page by page outside `ClientSession.list_tools` handed to the session
  (`ClientSession._absorb_tool_listing`), so it mirrors `x-mcp-header` arguments into `Mcp-Param-*`
  headers on the 2026 wire and drops tools whose annotations are invalid, as the spec requires.
- A 2025-era session's transport (`StreamableHTTPSessionManager._server_instances`) and its in-flight
  counter (`_requests_in_flight`, `_idle_timeout`), so a request served beside the SDK holds the session
  open as the SDK's own requests do.
- `number_requests_apart`: the numbering of the requests an SDK server session sends its client (the
  dispatcher's `_next_id`, reached through `ServerSession._request_outbound._dispatcher`) started at a random
  point, so two replicas asking one client at once do not number their questions alike.
- `adopt_session`: a session the gateway opened itself handed to the SDK under its id, by registering a
  transport in `_server_instances` and serving the session's replayed opening request through
  `StreamableHTTPSessionManager._serve_opening_request` (which starts the session's server task).
"""

from __future__ import annotations

import inspect
import math
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

import anyio
import mcp.client.session as sdk_session
import mcp.types as types
from mcp import ClientSession, MCPError
from mcp.client._probe import negotiate_auto
from mcp.client.session import _later_revision_fields
from mcp.server.session import ServerSession
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_NAME_HEADER, encode_header_value
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher, _JSONRPCDispatchContext
from starlette.types import Message, Receive, Scope

from gateway.protocol.errors import AnswerLost, ChannelError, HttpStatus, SessionExpired

Json = dict[str, Any]
# What the SDK's streamable HTTP client puts in place of an HTTP 404 on a session and other error statuses.
SESSION_TERMINATED = "Session terminated"
ERROR_STATUS = "Server returned an error response"


async def negotiate(session: ClientSession, discover_timeout: float) -> None:
    """Connect modern-first: `server/discover`, answered within `discover_timeout` seconds, else `initialize`.

    A process that is still booting answers its first request late; the probe's bound is the SDK's module
    constant, read when the probe is sent (before its first await), so it is set here for this server.
    """
    sdk_session.DISCOVER_TIMEOUT_SECONDS = discover_timeout
    await negotiate_auto(session)


def channel_error(e: MCPError) -> ChannelError | None:
    """The failure an SDK session's error stands for, or None when it is the server's own answer."""
    if e.code == types.CONNECTION_CLOSED:
        return AnswerLost(e.error.message)
    if e.code == types.INVALID_REQUEST and e.error.message == SESSION_TERMINATED:
        return SessionExpired(e.error.message)
    if e.code == types.INTERNAL_ERROR and e.error.message == ERROR_STATUS:
        return HttpStatus(0)
    return None


@cache
def later_revision_fields(method: str, version: str) -> frozenset[str]:
    """Result keys that revisions newer than `version` define for `method` (to drop for a `version` peer)."""
    return _later_revision_fields(method, version)


def stamp(session: ClientSession, message: Json, capabilities: Json | None = None) -> dict[str, str]:
    """Stamp `message` as `session` would stamp it before sending; returns the HTTP headers to send with it.

    `capabilities` (a 2026-era session's envelope only) replaces the client capabilities the session declares
    with those of the caller the request is sent for, so the server learns what that caller can answer.
    """
    headers: dict[str, str] = _stamped(session, message, capabilities).get("headers", {})
    return headers


def _stamped(session: ClientSession, message: Json, capabilities: Json | None) -> Any:
    """The SDK's call options for `message`, stamped by `session` (see `stamp`)."""
    options: Any = {}
    session._stamp(message, options)
    meta = message.get("params", {}).get("_meta") if capabilities is not None else None
    if isinstance(meta, dict) and types.CLIENT_CAPABILITIES_META_KEY in meta:
        meta[types.CLIENT_CAPABILITIES_META_KEY] = capabilities
    return options


async def send_unchecked(
    session: ClientSession,
    method: str,
    params: Json,
    *,
    timeout: float | None = None,
    progress: Any = None,
    name: str | None = None,
    capabilities: Json | None = None,
) -> Json:
    """Send a request through `session` and return its result as the wire dict, unvalidated; `name` is its
    `Mcp-Name` header where the SDK's stamp sets none (a task id), `capabilities` those it declares (`stamp`).
    Raises `MCPError`."""
    message: Json = {"method": method, "params": dict(params)}
    options = _stamped(session, message, capabilities)
    if name is not None:
        options.setdefault("headers", {}).setdefault(MCP_NAME_HEADER, encode_header_value(name))
    if timeout is not None:
        options["timeout"] = timeout
    if progress is not None:
        options["on_progress"] = progress
    result: Json = await session._dispatcher.send_raw_request(method, message.get("params"), options)
    return result


def absorb_tools(session: ClientSession, tools: list[Json]) -> set[str]:
    """Hand a complete tool listing to `session`; the names it keeps (2026: those with valid `x-mcp-header`s)."""
    listing = types.ListToolsResult.model_validate({"tools": tools}, by_name=False)
    kept = session._absorb_tool_listing(listing, complete=True)
    return {tool.name for tool in kept.tools}


def session_transports(manager: StreamableHTTPSessionManager) -> Mapping[str, StreamableHTTPServerTransport]:
    """The open 2025-era sessions' transports by session id."""
    return manager._server_instances


def serving_transport(manager: StreamableHTTPSessionManager, session_id: str) -> StreamableHTTPServerTransport | None:
    """The transport of a live 2025-era session that can take a request, or None."""
    transport = manager._server_instances.get(session_id)
    if transport is None or transport.is_terminated:
        return None
    idle = transport.idle_scope
    return None if idle is not None and idle.cancel_called else transport


REPLAYED = "manifold-replayed"  # a header on the requests `adopt_session` replays


async def adopt_session(
    manager: StreamableHTTPSessionManager, session_id: str, template: Scope, opening: bytes, version: str
) -> bool:
    """Open an SDK session under `session_id` by replaying its `initialize` request (`opening`) and the
    `notifications/initialized` that followed it; `template` is a request of the session's client (its Host
    and Origin pass the same checks). The answers are dropped. Returns whether the SDK took the session."""
    transport = StreamableHTTPServerTransport(
        mcp_session_id=session_id,
        is_json_response_enabled=manager.json_response,
        event_store=manager.event_store,
        security_settings=manager.security_settings,
        retry_interval=manager.retry_interval,
        idle_timeout=manager.session_idle_timeout,
    )
    manager._server_instances[session_id] = transport
    keep = (b"host", b"origin", b"user-agent")
    headers = [(k, v) for k, v in template["headers"] if k.lower() in keep]
    headers += [(b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream")]
    headers.append((REPLAYED.encode(), b"1"))
    scope = {**template, "method": "POST", "headers": headers, "query_string": b""}
    named = {**scope, "headers": [*headers, (b"mcp-session-id", session_id.encode())]}  # whose handshake it is
    await manager._serve_opening_request(transport, named, _body(opening), _drop)
    if manager._server_instances.get(session_id) is not transport:
        return False
    initialized = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    session_headers = [(b"mcp-session-id", session_id.encode()), (b"mcp-protocol-version", version.encode())]
    await transport.handle_request({**scope, "headers": headers + session_headers}, _body(initialized), _drop)
    return not transport.is_terminated


def number_requests_apart(session: Any) -> None:
    """Start the ids of the requests `session` (an SDK `ServerSession`) sends its client at a random point below
    2**48 (unless it sent some already): replicas that ask one client at once then never number two questions
    alike, and each takes only the answers to its own (the SDK drops an answer to an id it did not send)."""
    dispatcher = session._request_outbound._dispatcher
    if dispatcher._next_id == 0:
        dispatcher._next_id = secrets.randbelow(2**48)


def _body(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await anyio.sleep_forever()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _drop(message: Message) -> None:
    return None


@contextmanager
def holding(transport: StreamableHTTPServerTransport) -> Iterator[None]:
    """Count a request as in flight on a session, as its own transport does, so it does not idle out."""
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


__all__ = [
    "REPLAYED",
    "absorb_tools",
    "adopt_session",
    "channel_error",
    "holding",
    "later_revision_fields",
    "negotiate",
    "send_unchecked",
    "serving_transport",
    "session_transports",
    "stamp",
]

# What `tests/unit/test_internals.py` checks: each private name, and how to reach it.
SYMBOLS = {
    "mcp.client._probe.negotiate_auto": lambda: negotiate_auto,
    "mcp.client.session.DISCOVER_TIMEOUT_SECONDS": lambda: sdk_session.DISCOVER_TIMEOUT_SECONDS,
    "mcp.client.session._later_revision_fields": lambda: _later_revision_fields,
    "mcp.client.session.ClientSession._stamp": lambda: _session_attr("_stamp"),
    "mcp.client.session.ClientSession._absorb_tool_listing": lambda: _session_attr("_absorb_tool_listing"),
    "mcp.client.session.ClientSession._dispatcher.send_raw_request": lambda: (
        _session_attr("_dispatcher").send_raw_request
    ),
    "mcp.server.streamable_http_manager.StreamableHTTPSessionManager._server_instances": lambda: (
        StreamableHTTPSessionManager(app=None)._server_instances  # type: ignore[arg-type]
    ),
    "mcp.server.streamable_http_manager.StreamableHTTPSessionManager._serve_opening_request": lambda: (
        StreamableHTTPSessionManager._serve_opening_request
    ),
    "mcp.server.streamable_http.StreamableHTTPServerTransport._requests_in_flight": lambda: _transport_attr(
        "_requests_in_flight"
    ),
    "mcp.server.streamable_http.StreamableHTTPServerTransport._idle_timeout": lambda: _transport_attr("_idle_timeout"),
    "mcp.server.streamable_http.StreamableHTTPServerTransport.idle_scope": lambda: _transport_attr("idle_scope"),
    "mcp.server.session.ServerSession._request_outbound": lambda: _assigned(
        ServerSession.__init__, "_request_outbound"
    ),
    "mcp.shared.jsonrpc_dispatcher._JSONRPCDispatchContext._dispatcher": lambda: (
        _JSONRPCDispatchContext.__dataclass_fields__["_dispatcher"]
    ),
    "mcp.shared.jsonrpc_dispatcher.JSONRPCDispatcher._next_id": lambda: _assigned(
        JSONRPCDispatcher.__init__, "_next_id"
    ),
}


def _assigned(function: Any, name: str) -> None:
    """Fail unless `function` (an `__init__`) assigns the attribute `name`."""
    if f"self.{name} = " not in inspect.getsource(function):
        raise AttributeError(name)


def _session_attr(name: str) -> Any:
    write, read = anyio.create_memory_object_stream[Any](0)
    return getattr(ClientSession(read, write), name)


def _transport_attr(name: str) -> Any:
    return getattr(StreamableHTTPServerTransport(mcp_session_id="probe", idle_timeout=1.0), name)
