"""The legacy SSE transport (2024-11-05 servers): the SDK's client, pinned to the address the egress rules
checked."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.client.sse import sse_client

from gateway.policy.egress import Checked, pinned_client_factory
from gateway.upstream.tokens import BearerAuth, TokenSource


def sse_transport(
    url: str, headers: dict[str, str], checked: Checked | None, bearer: TokenSource | None, timeout: float
) -> AbstractAsyncContextManager[Any]:
    """The legacy SSE transport (2024-11-05 servers), to the checked address."""
    return sse_client(
        url,
        headers=headers,
        timeout=30,
        sse_read_timeout=max(300, timeout),
        # to the checked address, as the streamable HTTP client (by name, DNS could answer otherwise)
        httpx_client_factory=pinned_client_factory(checked),
        auth=BearerAuth(bearer) if bearer is not None else None,
    )
