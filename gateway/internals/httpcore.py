"""httpcore2's (and httpx2's hold on it) private names."""

from __future__ import annotations

from typing import Any

import httpx2
from httpcore2._backends.auto import AutoBackend


def set_network_backend(transport: httpx2.AsyncHTTPTransport, backend: Any) -> None:
    """Make every connection of `transport` go through `backend` (httpx2 offers no public way)."""
    transport._pool._network_backend = backend


__all__ = ["AutoBackend", "set_network_backend"]
SYMBOLS = {
    "httpcore2._backends.auto.AutoBackend": lambda: AutoBackend,
    "httpx2.AsyncHTTPTransport._pool._network_backend": lambda: httpx2.AsyncHTTPTransport()._pool._network_backend,
}
