"""Raw MCP over streamable HTTP with the standard library: the handshakes of both eras, one request at a time.

This is the benchmark's control plane (handshakes, checks, listings, opening many sessions); the hot loop is
wrk (see loadgen.py). Requests are shaped like the SDK client's own (captured from `mcp.Client` 2.3):

- 2025-11-25: POST `initialize` (no session header), read `Mcp-Session-Id` from the answer, POST
  `notifications/initialized` (202), then every request carries `Mcp-Session-Id` and
  `MCP-Protocol-Version: 2025-11-25`; DELETE ends the session. A stateless server (`stateless_http=True`)
  issues no session id: its requests carry `MCP-Protocol-Version` alone.
- 2026-07-28: no handshake and no session. Every POST carries `MCP-Protocol-Version: 2026-07-28` and
  `Mcp-Method: <method>` (plus `Mcp-Name: <tool>` on `tools/call`), and its params carry the `_meta`
  envelope `io.modelcontextprotocol/protocolVersion`, `.../clientInfo` and `.../clientCapabilities`.
  The SDK client starts with `server/discover`; so does `open_session`.

Answers may be `application/json` or `text/event-stream`; both are parsed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ERAS = (LEGACY, MODERN)
ACCEPT = "application/json, text/event-stream"
CLIENT_INFO = {"name": "manifold-bench", "version": "0.1.0"}
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"

Json = dict[str, Any]


class McpError(Exception):
    """A failed exchange: HTTP status, JSON-RPC error, or a malformed answer."""


@dataclass(frozen=True)
class Endpoint:
    """An MCP endpoint URL split into its parts."""

    url: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"only http:// URLs are supported: {url}")
        return cls(url, parts.hostname, parts.port or 80, parts.path or "/")

    @property
    def host_header(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Reply:
    """One HTTP answer: status, lower-cased headers, raw body and the JSON-RPC messages in it."""

    status: int
    headers: dict[str, str]
    body: bytes
    messages: list[Json] = field(default_factory=list)

    def response(self, request_id: int | str) -> Json:
        """The JSON-RPC response to `request_id`; raises McpError on a JSON-RPC error or when absent."""
        for m in self.messages:
            if m.get("id") == request_id and ("result" in m or "error" in m):
                if "error" in m:
                    raise McpError(f"JSON-RPC error: {m['error']}")
                result: Json = m["result"]
                return result
        raise McpError(f"no response to id {request_id!r} in HTTP {self.status}: {self.body[:300]!r}")


def parse_messages(content_type: str, body: bytes) -> list[Json]:
    """The JSON-RPC messages of a JSON or SSE body."""
    if not body:
        return []
    if content_type.startswith("text/event-stream"):
        out: list[Json] = []
        data: list[str] = []
        for line in body.decode().splitlines():
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif not line and data:
                out.append(json.loads("\n".join(data)))
                data = []
        if data:
            out.append(json.loads("\n".join(data)))
        return out
    decoded = json.loads(body)
    return decoded if isinstance(decoded, list) else [decoded]


@dataclass
class Session:
    """What every request of one client carries: headers, and for 2026-07-28 the `_meta` envelope."""

    era: str
    headers: dict[str, str]
    meta: Json | None = None
    session_id: str | None = None

    def body(self, request_id: int | str | None, method: str, params: Json | None = None) -> Json:
        """A JSON-RPC request (or, with request_id None, a notification) in this session's era."""
        msg: Json = {"jsonrpc": "2.0"}
        if request_id is not None:
            msg["id"] = request_id
        msg["method"] = method
        if self.meta is not None:
            params = {**(params or {}), "_meta": {**(params or {}).get("_meta", {}), **self.meta}}
        if params is not None:
            msg["params"] = params
        return msg

    def request_headers(self, method: str, params: Json | None = None) -> dict[str, str]:
        """The HTTP headers of one request: the session's, plus the 2026 routing headers."""
        headers = {"Accept": ACCEPT, "Content-Type": "application/json", **self.headers}
        if self.era == MODERN:
            headers["Mcp-Method"] = method
            if method == "tools/call" and params is not None:
                headers["Mcp-Name"] = str(params["name"])
        return headers


class Connection:
    """One keep-alive HTTP/1.1 connection to an endpoint (reconnects after a failure)."""

    def __init__(self, endpoint: Endpoint, timeout: float = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._next_id = 0

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def exchange(self, method: str, headers: dict[str, str], body: bytes | None = None) -> Reply:
        """Send one HTTP request and read the whole answer."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=self.timeout)
            try:
                self._conn.request(method, self.endpoint.path, body=body, headers=headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            messages = parse_messages(hdrs.get("content-type", ""), data) if resp.status in (200, 400, 404) else []
            return Reply(resp.status, hdrs, data, messages)
        raise AssertionError("unreachable")

    def post(self, session: Session, msg: Json) -> Reply:
        method = str(msg["method"])
        headers = session.request_headers(method, msg.get("params"))
        return self.exchange("POST", headers, json.dumps(msg, separators=(",", ":")).encode())

    def request(self, session: Session, method: str, params: Json | None = None) -> Json:
        """Send a request and return its result; raises McpError on any failure."""
        request_id = self.next_id()
        reply = self.post(session, session.body(request_id, method, params))
        if reply.status != 200:
            raise McpError(f"{method}: HTTP {reply.status}: {reply.body[:300]!r}")
        return reply.response(request_id)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def open_session(conn: Connection, era: str, *, stateless: bool = False) -> Session:
    """Do the handshake of `era` and return what later requests must carry.

    A 2025-era answer without `Mcp-Session-Id` is an error unless the server is `stateless` (the SDK's
    `stateless_http=True`), whose clients go on with `MCP-Protocol-Version` alone, as the SDK's client does."""
    if era == LEGACY:
        bare = Session(era, {})
        params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": CLIENT_INFO}
        request_id = conn.next_id()
        reply = conn.post(bare, bare.body(request_id, "initialize", params))
        if reply.status != 200:
            raise McpError(f"initialize: HTTP {reply.status}: {reply.body[:300]!r}")
        result = reply.response(request_id)
        version = str(result.get("protocolVersion"))
        session_id = reply.headers.get("mcp-session-id")
        if session_id:
            session = Session(era, {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": version}, None, session_id)
        elif stateless:
            session = Session(era, {"MCP-Protocol-Version": version})
        else:
            raise McpError("initialize: no Mcp-Session-Id in the answer")
        ack = conn.post(session, session.body(None, "notifications/initialized"))
        if ack.status not in (200, 202):
            raise McpError(f"notifications/initialized: HTTP {ack.status}")
        return session
    if era == MODERN:
        meta = {META_VERSION: MODERN, META_CLIENT_INFO: CLIENT_INFO, META_CAPABILITIES: {}}
        session = Session(era, {"MCP-Protocol-Version": MODERN}, meta)
        result = conn.request(session, "server/discover")
        if MODERN not in result.get("supportedVersions", []):
            raise McpError(f"server/discover: {MODERN} not supported: {result}")
        return session
    raise ValueError(f"unknown era {era!r}")


def close_session(conn: Connection, session: Session) -> None:
    """End a 2025-era session (DELETE); nothing to do for 2026-07-28."""
    if session.session_id is None:
        return
    headers = {"Accept": ACCEPT, **session.headers}
    with contextlib.suppress(OSError, http.client.HTTPException):
        conn.exchange("DELETE", headers)


def list_tool_names(conn: Connection, session: Session) -> list[str]:
    """Every tool name, following cursors."""
    names: list[str] = []
    cursor: str | None = None
    while True:
        result = conn.request(session, "tools/list", {"cursor": cursor} if cursor else None)
        names.extend(str(t["name"]) for t in result.get("tools", []))
        cursor = result.get("nextCursor")
        if not cursor:
            return names


def call_tool(conn: Connection, session: Session, name: str, arguments: Json) -> Json:
    """Call a tool; raises McpError on a JSON-RPC error or an isError result."""
    result = conn.request(session, "tools/call", {"name": name, "arguments": arguments})
    if result.get("isError"):
        raise McpError(f"{name}: isError result: {str(result)[:300]}")
    return result
