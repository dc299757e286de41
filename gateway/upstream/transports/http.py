"""Streamable HTTP to one server: the SDK's client, with the lean HTTP/1.1 channel beside it, over a client pinned
to the address the egress rules checked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import httpx2
from mcp.client.streamable_http import streamable_http_client

from gateway.policy.egress import Checked, pinned_transport
from gateway.upstream.tokens import BearerAuth, TokenSource
from gateway.upstream.transports.http11 import MAX_ANSWER, HttpWire, uses_proxy
from gateway.upstream.transports.lenient import LenientTransport

# The caller's headers a server's `forward_headers` names, for the request being sent. A context variable because
# the SDK's HTTP client calls its request hook with the request alone.
FORWARDED: ContextVar[Mapping[str, str] | None] = ContextVar("manifold_forwarded_headers", default=None)


async def _add_forwarded(request: httpx2.Request) -> None:
    for name, value in (FORWARDED.get() or {}).items():
        request.headers[name] = value


@asynccontextmanager
async def streamable_http_transport(
    url: str,
    headers: dict[str, str],
    checked: Checked | None,
    bearer: TokenSource | None,
    *,
    timeout: float,
    forward_headers: bool,
    lean: bool,
    on_wire: Callable[[HttpWire | None], None],
) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP client; with `lean` (and no proxy in the way), a lean HTTP/1.1 channel to the same
    session, handed to `on_wire` for as long as the connection lasts."""
    limits = httpx2.Timeout(30, read=max(300.0, timeout + 5))
    transport = LenientTransport(pinned_transport(checked) if checked is not None else httpx2.AsyncHTTPTransport())
    session_id: list[str | None] = [None]

    async def note_session(response: httpx2.Response) -> None:
        if (value := response.headers.get("mcp-session-id")) is not None:
            session_id[0] = value

    hooks: dict[str, list[Any]] = {"response": [note_session]}
    if forward_headers:
        hooks["request"] = [_add_forwarded]
    wire = None
    if lean and not uses_proxy(url):
        address = checked.address if checked is not None else None
        wire = HttpWire(url, headers, lambda: session_id[0], address=address, forwarded=FORWARDED.get, auth=bearer)
    on_wire(wire)
    try:
        async with (
            httpx2.AsyncClient(
                headers=headers,
                timeout=limits,
                follow_redirects=checked is None,
                transport=transport,
                event_hooks=hooks,
                auth=BearerAuth(bearer) if bearer is not None else None,
            ) as http,
            # an answer as large as the lean channel takes (the SDK stops at 1 MiB per event)
            streamable_http_client(url, http_client=http, max_sse_event_size=MAX_ANSWER) as streams,
        ):
            yield streams
    finally:
        on_wire(None)
        if wire is not None:
            wire.close()
