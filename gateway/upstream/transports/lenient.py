"""What the SDK's HTTP client is spared of servers' wire habits: the one place its responses are reshaped.

Some servers answer a POST with an `application/json` body that holds several messages, one per line (a
progress notice, then the answer). The SDK's client reads such a body as one JSON value and fails the
request. This transport turns such a body into the event stream it stands for, so the SDK reads each message
as it would from a server that streams; every other response passes through untouched. The gateway's lean
HTTP client reads the same bodies the same way (`gateway.protocol.jsonrpc.messages_in`).
"""

from __future__ import annotations

import httpx2
import orjson

from gateway.protocol.jsonrpc import messages_in


class LenientTransport(httpx2.AsyncBaseTransport):
    """Wraps a transport; a JSON body of several messages comes back as an event stream of them."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.method != "POST" or not response.headers.get("content-type", "").startswith("application/json"):
            return response
        body = await response.aread()
        several = messages_in(body)
        if several is None:
            return response  # read, and kept: the SDK's read takes the same bytes
        events = b"".join(b"event: message\ndata: " + orjson.dumps(m) + b"\n\n" for m in several)
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _REPLACED]
        headers += [("content-type", "text/event-stream"), ("content-length", str(len(events)))]
        return httpx2.Response(
            response.status_code, headers=headers, content=events, request=request, extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


_REPLACED = frozenset({"content-type", "content-length", "transfer-encoding", "content-encoding"})
