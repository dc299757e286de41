"""The gate in front of `/mcp`: bearer tokens, rate limits, body and nesting limits, JSON-RPC decoding.

`AuthGate` is plain ASGI middleware: it authenticates (API tokens, and OAuth access tokens through
`downstream.oauth`), rate-limits, bounds the body and its nesting, parses the body once, binds 2025-era
sessions to the caller that opened them, and hands the caller's `View`, its owner key and the parsed
message to what follows through the request scope.

The owner key names who may use a session or a task: an API token's view name, or for an OAuth access
token the rule's view name and the token's subject, so two subjects under one rule never share them.
"""

from __future__ import annotations

import base64
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate
from typing import Any, cast

import anyio.to_thread
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.access import EndpointSpec, TokenSpec
from gateway.core.conversations import conversation_key
from gateway.downstream.oauth import Refusal, ResourceServer
from gateway.downstream.replicas import LOST, UNREACHED, SharedSessions
from gateway.downstream.sessions import Sessions, asks_capabilities
from gateway.observe.logs import get_logger
from gateway.policy.access import OPEN_VIEW, TokenTable, View, views_for
from gateway.policy.bucket import TokenBucket
from gateway.protocol.era import Era, handshake_version
from gateway.protocol.jsonrpc import decode, encode, error_body

log = get_logger("gate")
SCOPE_KEY = "manifold_view"
OWNER_KEY = "manifold_owner"
SUBJECT_BUCKETS = 10_000  # rate buckets of OAuth subjects kept at most (the oldest go first)
SESSION_HEADER = b"mcp-session-id"
MESSAGE_KEY = "manifold_message"
HANDED_KEY = "manifold_handed"  # a request another replica handed to this one
TASKS_ELSEWHERE_KEY = "manifold_tasks_elsewhere"  # `tasks/list`: fetches the caller's tasks on the other replicas
SCAN_LIMIT = 64 * 1024
OFF_LOOP_BODY = 256 * 1024  # bodies this large are decoded in a worker thread, off the event loop
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
UNSHARED = frozenset({b"authorization", b"cookie", b"proxy-authorization"})  # never handed to another replica
HOLDER_GONE = (
    "the gateway replica that held this {what} is gone (it stopped or restarted), so it cannot be resumed; "
    "the call may have run"
)


def transport_security(allowed_hosts: list[str], allowed_origins: list[str]) -> TransportSecuritySettings:
    """Host/Origin checks against DNS rebinding: loopback names plus the configured extras.

    `allowed_hosts: ["*"]` turns the checks off (for a proxy in front that owns `Host`).
    """
    if "*" in allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [h for local in LOCAL_HOSTS for h in (local, f"{local}:*")]
    origins = [o for local in LOCAL_HOSTS for o in (f"http://{local}", f"http://{local}:*")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *allowed_hosts],
        allowed_origins=[*origins, *allowed_origins],
    )


def nesting_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether JSON text nests arrays/objects deeper than `limit` (strings are skipped)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # too few brackets to nest that deep
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value nests arrays/objects deeper than `limit`; stops at the first too-deep one."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def bracket_depth(body: bytes) -> int:
    """The deepest nesting of brackets in `body`, counting those inside strings too (so never less than the
    JSON's own nesting)."""
    brackets = body.translate(None, _NOT_BRACKETS).translate(_BRACKET_STEPS)
    return max(accumulate(memoryview(brackets).cast("b")), default=0)


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEPS = bytes.maketrans(b"[]{}", bytes([1, 255, 1, 255]))  # +1 and -1 as signed bytes


def decode_message(body: bytes, max_depth: int) -> tuple[Any, tuple[int, str] | None]:
    """The decoded body, and a JSON-RPC error (code, message) when it is not one acceptable JSON-RPC message.

    The body is parsed once. Its nesting is bounded by a count of its brackets; only a body whose
    brackets nest too deep (strings included) has its parsed value measured. Text that does not parse
    is scanned (its first `SCAN_LIMIT` bytes) only to tell a too-deep body from a malformed one.
    """
    too_deep = (-32600, f"JSON nested deeper than {max_depth} levels")
    try:
        if len(body) >= OFF_LOOP_BODY:
            with _collector_paused():
                message = decode(body)
        else:
            message = decode(body)
    except (ValueError, RecursionError):
        if nesting_depth_exceeds(body[:SCAN_LIMIT], max_depth):
            return None, too_deep
        return None, (-32700, "Parse error: the body is not valid UTF-8 JSON")
    deep = body.count(b"[") + body.count(b"{") > max_depth and bracket_depth(body) > max_depth
    if deep and depth_exceeds(message, max_depth):
        return None, too_deep
    return message, shape_problem(message)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large body becomes objects: its passes over the growing
    heap would otherwise cost more than the parse itself."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def shape_problem(message: Any) -> tuple[int, str] | None:
    """A JSON-RPC error (code, message) for a decoded body that is not one JSON-RPC message, or None."""
    if isinstance(message, list):
        return -32600, "Invalid Request: batches are not supported; send one JSON-RPC message per request"
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return -32600, 'Invalid Request: expected a JSON-RPC 2.0 object ("jsonrpc": "2.0")'
    if "method" in message and not isinstance(message["method"], str):
        return -32600, "Invalid Request: `method` must be a string"
    if "id" in message and not (message["id"] is None or isinstance(message["id"], str | int)):
        return -32600, "Invalid Request: `id` must be a string or an integer"
    return None


@dataclass
class Limits:
    """Request limits applied before the MCP layer."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_json_depth: int = 64
    max_token_bytes: int = 16 * 1024  # a longer bearer token is refused before it is looked at


@dataclass
class AuthGate:
    """ASGI middleware guarding the MCP endpoint."""

    app: ASGIApp
    tokens: Iterable[TokenSpec]
    sessions: Sessions
    limits: Limits = field(default_factory=Limits)
    endpoints: Mapping[str, EndpointSpec] = field(default_factory=dict)
    oauth: ResourceServer | None = None
    shared: SharedSessions | None = None  # 2025-era sessions kept in a store every replica reads
    shortcut: bool = True  # the shortcut serves dormant sessions (and wakes them); without it, they wake here
    conversational: Callable[[Any, View], bool] | None = None  # reaches a conversation's own instances (replicas)

    def __post_init__(self) -> None:
        tokens = list(self.tokens)
        self._tokens = TokenTable(tokens)
        rules = self.oauth.config.rules if self.oauth is not None else []
        guarded = bool(self._tokens) or self.oauth is not None
        self._views = {view.name: view for view in views_for(tokens, rules=rules)} if guarded else {}
        bases = list(self._views.values()) or [OPEN_VIEW]
        self._at = {(v.name, name): v.at(name, spec) for name, spec in self.endpoints.items() for v in bases}
        self._buckets = {t.name: TokenBucket(t.rate, t.burst or max(1, int(t.rate * 2))) for t in tokens if t.rate}
        self._rates = {r.name: (r.rate, r.burst or max(1, int(r.rate * 2))) for r in rules if r.rate}
        self._subject_buckets: dict[tuple[str, str], TokenBucket] = {}
        self._guarded = guarded

    async def _authenticate(
        self, header: bytes | None, endpoint: str | None, send: Send
    ) -> tuple[View, str | None] | None:
        """The caller's view and (for an OAuth token) subject; None when a refusal was sent."""
        presented = header[7:].strip() if header and header[:7].lower() == b"bearer " else None
        if presented is not None and len(presented) > self.limits.max_token_bytes:
            too_long = f"the token is longer than {self.limits.max_token_bytes} bytes"
            refusal = Refusal(401, "invalid_token", too_long, outcome="too_long")
            if self.oauth is not None:
                self.oauth.on_outcome(refusal.outcome)
            await self._refuse(send, endpoint, refusal)
            return None
        token = self._tokens.identify(header) if presented and self._tokens else None
        if token is not None:
            if not await self._within_rate(self._buckets.get(token.name), "token", send):
                return None
            return self._views[token.name], None
        if presented and self.oauth is not None:
            try:
                principal = await self.oauth.authenticate(presented, endpoint)
            except Refusal as refusal:
                await self._refuse(send, endpoint, refusal)
                return None
            if not await self._within_rate(
                self._subject_bucket(principal.rule.name, principal.subject), "subject", send
            ):
                return None
            return self._views[principal.rule.name], principal.subject
        await self._refuse(send, endpoint, None)
        return None

    def _subject_bucket(self, rule: str, subject: str) -> TokenBucket | None:
        rate = self._rates.get(rule)
        if rate is None:
            return None
        bucket = self._subject_buckets.get((rule, subject))
        if bucket is None:
            if len(self._subject_buckets) >= SUBJECT_BUCKETS:
                del self._subject_buckets[next(iter(self._subject_buckets))]
            bucket = self._subject_buckets[(rule, subject)] = TokenBucket(*rate)
        return bucket

    async def _within_rate(self, bucket: TokenBucket | None, who: str, send: Send) -> bool:
        if bucket is None or (wait := bucket.take()) <= 0:
            return True
        retry = str(max(1, round(wait + 0.5))).encode()
        await _reject(send, 429, -32000, f"Too many requests for this {who}", {b"retry-after": retry})
        return False

    async def _refuse(self, send: Send, endpoint: str | None, refusal: Refusal | None) -> None:
        """401 (no or a bad token), 403 (a valid token without the scope or rule it needs), or 503 (the
        authorization server's keys cannot be had), with a `WWW-Authenticate` challenge."""
        if self.oauth is None:
            challenge = b'Bearer realm="manifold"'
        else:
            challenge = self.oauth.challenge(endpoint if endpoint in self.endpoints else None, refusal)
        if refusal is None:
            await _reject(
                send, 401, -32001, "Unauthorized: a valid bearer token is required", {b"www-authenticate": challenge}
            )
        elif refusal.status == 403:
            await _reject(send, 403, -32001, f"Forbidden: {refusal.reason}", {b"www-authenticate": challenge})
        elif refusal.status == 401:
            await _reject(send, 401, -32001, f"Unauthorized: {refusal.reason}", {b"www-authenticate": challenge})
        else:
            await _reject(send, refusal.status, -32000, f"Unavailable: {refusal.reason}", {b"retry-after": b"5"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        endpoint = scope["path"][len("/mcp/") :] if scope["path"].startswith("/mcp/") else None
        view, subject = OPEN_VIEW, None
        if self._guarded:
            caller = await self._authenticate(headers.get(b"authorization"), endpoint, send)
            if caller is None:
                return
            view, subject = caller
        await self._serve(scope, receive, send, view, subject, endpoint)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, base: View, subject: str | None, endpoint: str | None
    ) -> None:
        """Serve an authenticated caller's request (`base`: its view before the endpoint narrows it)."""
        view = base
        if endpoint is not None:
            narrowed = self._at.get((view.name, endpoint))
            if narrowed is None:
                await _reject(send, 404, -32600, f"No endpoint named {endpoint[:64]!r}")
                return
            view = narrowed
            scope = {**scope, "path": "/mcp", "raw_path": b"/mcp"}
        owner = view.name if subject is None else f"{view.name}|sub={subject}"
        raw_session = dict(scope["headers"]).get(SESSION_HEADER)
        session = raw_session.decode("latin-1") if raw_session is not None else None
        if session is not None:
            known = self.sessions.owner(session)
            if self.shared is not None:
                found = await self.shared.resolve(session, owner)
                if found in ("foreign", "unknown"):
                    known = ""  # deleted, expired, or another caller's: as unknown here as one never opened
                elif found == "taken" and not self.shortcut:
                    await self.sessions.wake(session, scope)
            if known not in (None, owner):
                await _reject(send, 404, -32600, "Session not found")
                return
        if scope["method"] == "POST":
            try:
                body = await _read_body(receive, self.limits.max_body_bytes)
            except Gone:
                return  # the client left (or was cut off) before its body was whole: none of it is acted on
            if body is None:
                await _reject(send, 413, -32600, f"Request body over {self.limits.max_body_bytes} bytes")
                return
            depth = self.limits.max_json_depth
            if len(body) >= OFF_LOOP_BODY:
                message, problem = await anyio.to_thread.run_sync(decode_message, body, depth)
            else:
                message, problem = decode_message(body, depth)
            if problem is not None:
                await _reject(send, 400, problem[0], problem[1])
                return
            if (
                session is not None
                and self.shared is not None
                and _is_answer(message)
                and await self.shared.route_answer(session, body)
            ):
                await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
                await send({"type": "http.response.body", "body": b""})
                return  # another replica asked the question this answers: passed there
            if self.shared is not None:
                handed = {"view": base.name, "subject": subject, "endpoint": endpoint}
                if isinstance(message, dict) and message.get("method") == "tasks/list":
                    state = scope.setdefault("state", {})
                    if not state.get(HANDED_KEY):  # this replica's list is asked for whole, the others' added
                        state[TASKS_ELSEWHERE_KEY] = partial(self._tasks_elsewhere, handed, scope["headers"], message)
                if (holder := self.shared.holder_of(message)) is not None:
                    await self._hand_over(holder, handed, scope, body, message, send)
                    return
                if self.conversational is not None and self.conversational(message, view):
                    params = message.get("params") or {}
                    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else None
                    conversation = conversation_key(session, owner, meta)
                    holder = await self.shared.conversation_owner(conversation)
                    if holder != self.shared.replica:
                        if await self._hand_over(holder, handed, scope, body, message, send, unreached_ok=True):
                            return
                        # its owner was gone before it took this request: the conversation is this replica's now
                        await self.shared.conversation_owner(conversation, replacing=holder)
            receive = _replay(body, receive)
            scope.setdefault("state", {})[MESSAGE_KEY] = message
        state = scope.setdefault("state", {})
        state[SCOPE_KEY], state[OWNER_KEY] = view, owner

        if session is not None:  # nothing to watch for: the session is known
            if scope["method"] != "DELETE":
                await self.app(scope, receive, send)
                return
            if self.shared is not None:
                await self.shared.ending(session)  # before the answer: the client's next request may reach a peer
            try:
                await self.app(scope, receive, send)
            finally:
                self.sessions.ended(session)
                if self.shared is not None:
                    self.shared.ended(session)
            return
        opening = scope["state"].get(MESSAGE_KEY)
        talks = asks_capabilities(opening)

        async def send_watching(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.lower() == SESSION_HEADER:
                        opened = value.decode("latin-1")
                        self.sessions.opened(opened, view.name, owner, talks=talks)
                        if self.shared is not None and isinstance(opening, dict):
                            await self._share(opened, view.name, owner, opening)
            await send(message)

        await self.app(scope, receive, send_watching)

    async def inject(self, session: str, version: str, body: bytes) -> None:
        """Hand this replica's SDK a client's answer that reached another replica (its question was asked here):
        a POST of it, as from the client, through the rest of the stack."""
        owner = self.sessions.owner(session)
        view = self._views.get(owner.split("|sub=")[0], OPEN_VIEW) if owner is not None else OPEN_VIEW
        message, problem = decode_message(body, self.limits.max_json_depth)
        if problem is not None or not _is_answer(message):
            return
        headers = [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"),
            (SESSION_HEADER, session.encode("latin-1")),
            (b"mcp-protocol-version", version.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        scope = _post_scope(headers)
        scope["state"] = {MESSAGE_KEY: message, SCOPE_KEY: view, OWNER_KEY: owner or view.name}

        async def nowhere(_: Message) -> None:
            return None

        await self.app(scope, _replay(body, _closed), nowhere)

    async def _hand_over(
        self,
        holder: str,
        caller: dict[str, Any],
        scope: Scope,
        body: bytes,
        message: Any,
        send: Send,
        *,
        unreached_ok: bool = False,
    ) -> bool:
        """Have the replica `holder` serve a request about what it holds (a held call, a task, a conversation's
        instances), and pass its answer on; False (nothing sent) when `unreached_ok` and the holder was not there
        to take it. The caller's credentials stay here: the holder is told who the caller is."""
        assert self.shared is not None
        answer = await self.shared.hand_over(holder, _handed_request(caller, scope["headers"], body))
        if answer is UNREACHED and unreached_ok:
            return False
        if answer is UNREACHED or answer is LOST:
            version = dict(scope["headers"]).get(b"mcp-protocol-version", b"").decode("latin-1")
            await _answer_json(send, _holder_gone(message, version))
            return True
        raw = base64.b64decode(answer["body"])
        start = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer["headers"]]
        await send({"type": "http.response.start", "status": answer["status"], "headers": start})
        await send({"type": "http.response.body", "body": raw})
        return True

    async def serve_handed(self, request: dict[str, Any]) -> dict[str, Any]:
        """Serve a request another replica handed over (it names a call or task held here) as if it had come here,
        for the caller that replica authenticated; its whole HTTP answer."""
        status, headers, chunks = 500, cast(list[list[str]], []), cast(list[bytes], [])
        base = self._views.get(request["view"]) if self._guarded else OPEN_VIEW
        scope = _post_scope([(k.encode("latin-1"), v.encode("latin-1")) for k, v in request["headers"]])

        async def keep(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers.extend([k.decode("latin-1"), v.decode("latin-1")] for k, v in message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        if base is None:
            return {"status": 404, "headers": [], "body": ""}  # a view this replica's config does not have
        body = base64.b64decode(request["body"])
        scope["state"] = {HANDED_KEY: True}
        await self._serve(scope, _replay(body, _waiting), keep, base, request["subject"], request["endpoint"])
        return {"status": status, "headers": headers, "body": base64.b64encode(b"".join(chunks)).decode()}

    async def _tasks_elsewhere(
        self, caller: dict[str, Any], headers: list[tuple[bytes, bytes]], message: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The caller's tasks held by the other replicas: its `tasks/list` (without a cursor) handed to each."""
        assert self.shared is not None
        params = message.get("params")
        kept = {k: v for k, v in params.items() if k != "cursor"} if isinstance(params, dict) else {}
        request = _handed_request(caller, headers, encode({**message, "params": kept}))
        return [task for answer in await self.shared.hand_to_peers(request) for task in _listed_tasks(answer)]

    async def _share(self, session: str, view: str, owner: str, opening: dict[str, Any]) -> None:
        """Keep a session just opened with the `initialize` request `opening` where every replica finds it."""
        assert self.shared is not None
        params = opening.get("params")
        requested = params.get("protocolVersion") if isinstance(params, dict) else None
        version = handshake_version(requested if isinstance(requested, str) else "")
        await self.shared.opened(session, view, owner, bytes(memoryview(encode(opening))), version)


def _is_answer(message: Any) -> bool:
    """Whether a message is a JSON-RPC response (a client's answer to a question of the server's)."""
    return (
        isinstance(message, dict)
        and "method" not in message
        and "id" in message
        and ("result" in message or "error" in message)
    )


def _post_scope(headers: list[tuple[bytes, bytes]]) -> Scope:
    """The scope of a POST to `/mcp` made inside the gateway (a request or answer another replica passed here)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "headers": headers,
    }


async def _closed() -> Message:
    return {"type": "http.disconnect"}


async def _waiting() -> Message:
    """A client that stays until the answer is whole (a handed-over request's: its own client waits elsewhere)."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def _handed_request(caller: dict[str, Any], headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    """A request as it is handed to another replica: who the caller is, its headers but its credentials, its body."""
    kept = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k not in UNSHARED]
    return {**caller, "headers": kept, "body": base64.b64encode(body).decode()}


def _listed_tasks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks in another replica's HTTP answer to `tasks/list` (JSON, or one server-sent event)."""
    try:
        raw = base64.b64decode(answer["body"])
        if raw.lstrip().startswith(b"{"):
            reply = decode(raw)
        else:
            data = [line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:")]
            reply = decode(next(d for d in data if d))
        tasks = reply["result"]["tasks"]
    except (KeyError, TypeError, ValueError, StopIteration):
        return []
    return [t for t in tasks if isinstance(t, dict)] if isinstance(tasks, list) else []


def _holder_gone(message: Any, version: str) -> dict[str, Any]:
    """The answer to a request about a call or task whose replica is gone: the call may have run."""
    params = message.get("params") if isinstance(message, dict) else None
    if message.get("method") == "tools/call":
        name = params.get("name") if isinstance(params, dict) else None
        text = f"{str(name)[:128]}: {HOLDER_GONE.format(what='call')}"
        result = Era.of(version).with_result_type({"content": [{"type": "text", "text": text}], "isError": True})
        return {"jsonrpc": "2.0", "id": message.get("id"), "result": result}
    task = str(params.get("taskId"))[:128] if isinstance(params, dict) else ""
    return error_body(-32602, f"Task {task}: {HOLDER_GONE.format(what='task')}", message.get("id"))


async def _answer_json(send: Send, answer: dict[str, Any]) -> None:
    body = encode(answer)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Gone(Exception):
    """The client left before its request body was whole."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None when it is over `limit`; raises `Gone` when the client left before its end."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, downstream: Receive) -> Receive:
    """Hand the app the body already read, then the client's own messages (its disconnect is a cancel)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await downstream()

    return receive


async def _reject(send: Send, status: int, code: int, message: str, extra: dict[bytes, bytes] | None = None) -> None:
    body = encode(error_body(code, message))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += list((extra or {}).items())
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def view_of(state: Any) -> View:
    """The caller's view from a request's state (the open view when none was set)."""
    value = getattr(state, SCOPE_KEY, None) if not isinstance(state, dict) else state.get(SCOPE_KEY)
    return value if isinstance(value, View) else OPEN_VIEW


def owner_of(state: Any) -> str:
    """Who the caller is, from a request's state: the key its sessions, tasks and conversations are bound to
    (an API token's view name; an OAuth rule's view name and the token's subject)."""
    value = getattr(state, OWNER_KEY, None) if not isinstance(state, dict) else state.get(OWNER_KEY)
    return value if isinstance(value, str) else view_of(state).name


def subject_of(owner: str) -> str | None:
    """An OAuth caller's subject, from its owner key (`owner_of`); None for any other caller."""
    _, found, subject = owner.partition("|sub=")
    return subject if found else None
