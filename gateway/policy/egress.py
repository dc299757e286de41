"""Egress checks for servers the gateway did not read from its config file (runtime, handed over): where the
gateway may be told to connect.

A URL passes when its scheme is http or https, it carries no credentials, and EVERY address its host
resolves to is public (not loopback, private, link-local, CGNAT, multicast, unspecified, reserved, or
their IPv6 forms), unless the host or the address is on the allow list (names or CIDRs). The connection
then goes to the address that passed (`pinned_transport`), so a second DNS answer cannot swap it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import httpx2
from httpcore2 import AsyncNetworkStream

from gateway.internals.httpcore import AutoBackend, set_network_backend
from gateway.protocol.errors import EgressDenied

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]

_CGNAT = ipaddress.ip_network("100.64.0.0/10")


@dataclass(frozen=True)
class Checked:
    """A URL that passed: its host and the address the connection must use."""

    host: str
    address: str


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (the system resolver, in a worker thread)."""
    infos = await anyio.to_thread.run_sync(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class EgressPolicy:
    """The allow list: host names (exact, case-insensitive) and networks; and how host names are resolved."""

    hosts: frozenset[str]
    networks: tuple[Network, ...]
    resolve: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def from_allow(cls, allow: Iterable[str], resolve: Resolver = system_resolver) -> EgressPolicy:
        """Split allow entries into networks (anything `ip_network` accepts) and host names."""
        hosts, networks = set(), []
        for entry in allow:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks), resolve)

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


def forbidden_reason(address: IPAddress) -> str | None:
    """Why an address is off limits, or None for a public one."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return forbidden_reason(mapped)
    checks = (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local (cloud metadata)", address.is_link_local),
        ("multicast", address.is_multicast),
        ("carrier-grade NAT", isinstance(address, ipaddress.IPv4Address) and address in _CGNAT),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    )
    for name, hit in checks:
        if hit:
            return name
    return None


async def check_url(url: str, policy: EgressPolicy, resolve: Resolver | None = None) -> Checked:
    """Check a server's URL (resolving with `resolve`, by default the policy's resolver); `EgressDenied` names
    the problem. Returns the address to connect to."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise EgressDenied(f"not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise EgressDenied(f"scheme {parts.scheme or '(none)'!r} is not allowed (use http or https)")
    if parts.username is not None or parts.password is not None:
        raise EgressDenied("credentials in the URL are not allowed (use a named credential)")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise EgressDenied("the URL has no host")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = await (resolve or policy.resolve)(host, port)
    except OSError as e:
        raise EgressDenied(f"host {host!r} does not resolve ({e.strerror or e})") from None
    if not addresses:
        raise EgressDenied(f"host {host!r} does not resolve")
    host_allowed = host in policy.hosts
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if host_allowed or policy.allows_address(address):
            continue
        if (why := forbidden_reason(address)) is not None:
            raise EgressDenied(
                f"host {host!r} resolves to {address}, a {why} address; allow it in runtime.egress.allow"
            )
    return Checked(host=host, address=addresses[0])


class PinnedBackend(AutoBackend):
    """A network backend that connects to the checked address whenever the checked host is asked for."""

    def __init__(self, checked: Checked) -> None:
        self._checked = checked

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        if host.rstrip(".").lower() != self._checked.host:
            raise EgressDenied(f"connection to {host!r} refused: only {self._checked.host!r} was checked")
        return await super().connect_tcp(
            self._checked.address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )


def pinned_transport(checked: Checked) -> httpx2.AsyncHTTPTransport:
    """An HTTP transport whose connections go only to the address that passed the check (TLS keeps the name)."""
    transport = httpx2.AsyncHTTPTransport()
    set_network_backend(transport, PinnedBackend(checked))
    return transport


def pinned_client_factory(checked: Checked | None) -> Callable[..., httpx2.AsyncClient]:
    """An HTTP client factory (the MCP SDK's `httpx_client_factory` shape) whose clients connect only to the
    checked address (with None: where the name resolves, for a server of the config file); no redirects."""

    def factory(
        headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None, auth: httpx2.Auth | None = None
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            headers=headers,
            timeout=timeout if timeout is not None else httpx2.Timeout(30, read=300),
            auth=auth,
            transport=pinned_transport(checked) if checked is not None else None,
            follow_redirects=False,
        )

    return factory
