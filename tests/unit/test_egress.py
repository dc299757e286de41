"""Egress rules for runtime servers: what may and may not be reached."""

from __future__ import annotations

import pytest

from gateway.policy.egress import EgressPolicy, check_url, system_resolver
from gateway.protocol.errors import EgressDenied

pytestmark = pytest.mark.anyio
NONE = EgressPolicy.from_allow([])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


REFUSED = [
    ("http://127.0.0.1/mcp", "loopback"),
    ("http://127.1/mcp", "loopback"),
    ("http://2130706433/mcp", "loopback"),
    ("http://0x7f000001/mcp", "loopback"),
    ("http://0177.0.0.1/mcp", "loopback"),
    ("http://[::1]/mcp", "loopback"),
    ("http://[::ffff:127.0.0.1]/mcp", "loopback"),
    ("http://localhost/mcp", "loopback"),
    ("http://localhost./mcp", "loopback"),
    ("http://LOCALHOST:8080/mcp", "loopback"),
    ("http://10.1.2.3/mcp", "private"),
    ("http://172.16.0.1/mcp", "private"),
    ("http://192.168.1.1/mcp", "private"),
    ("http://[fd00::1]/mcp", "private"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://[fe80::1]/mcp", "link-local"),
    ("http://100.64.0.1/mcp", "carrier-grade NAT"),
    ("http://224.0.0.1/mcp", "multicast"),
    ("http://0.0.0.0/mcp", "unspecified"),
    ("http://[::]/mcp", "unspecified"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("gopher://example.com/", "scheme 'gopher'"),
    ("ftp://example.com/", "scheme 'ftp'"),
    ("http://user:pass@example.com/mcp", "credentials in the URL"),
    ("http://token@example.com/mcp", "credentials in the URL"),
    ("http:///mcp", "no host"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED)
async def test_refused(url: str, why: str) -> None:
    with pytest.raises(EgressDenied) as err:
        await check_url(url, NONE)
    assert why in str(err.value)


async def _resolves_private(host: str, port: int) -> list[str]:
    return {"internal.example": ["10.0.0.7"], "mixed.example": ["93.184.215.14", "192.168.0.9"]}.get(
        host, ["93.184.215.14"]
    )


async def test_a_name_that_resolves_to_a_private_address_is_refused() -> None:
    with pytest.raises(EgressDenied) as err:
        await check_url("https://internal.example/mcp", NONE, _resolves_private)
    assert "10.0.0.7" in str(err.value) and "private" in str(err.value)
    with pytest.raises(EgressDenied):
        await check_url("https://mixed.example/mcp", NONE, _resolves_private)


async def test_public_names_pass_and_the_checked_address_is_pinned() -> None:
    checked = await check_url("https://mcp.example.com:8443/mcp", NONE, _resolves_private)
    assert (checked.host, checked.address) == ("mcp.example.com", "93.184.215.14")


async def test_allow_list_by_cidr_and_by_name() -> None:
    by_cidr = EgressPolicy.from_allow(["127.0.0.0/8"])
    assert (await check_url("http://127.0.0.1:9000/mcp", by_cidr)).address == "127.0.0.1"
    by_name = EgressPolicy.from_allow(["internal.example"])
    assert (await check_url("http://internal.example/mcp", by_name, _resolves_private)).address == "10.0.0.7"
    with pytest.raises(EgressDenied):
        await check_url("http://10.0.0.8/mcp", by_name)


async def test_system_resolver_reads_numeric_spellings() -> None:
    assert await system_resolver("2130706433", 80) == ["127.0.0.1"]
