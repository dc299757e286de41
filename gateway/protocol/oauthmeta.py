"""Where an OAuth authorization server publishes its metadata (pure)."""

from __future__ import annotations

from urllib.parse import urlsplit


def metadata_urls(issuer: str) -> list[str]:
    """The places to read `issuer`'s metadata from, in order: RFC 8414's, then OpenID Connect discovery's."""
    parts = urlsplit(issuer)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{issuer.rstrip('/')}/.well-known/openid-configuration",
    ]
