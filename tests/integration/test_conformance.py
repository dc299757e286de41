"""The official MCP conformance suite, run through the gateway in front of the suite's server contract.

The upstream is `tests/fixtures/conformance_server.py` (every tool, prompt and resource the suite's
scenarios expect), served bare-named (`prefix: ""`) so the suite finds its names, over stdio and
over HTTP. Both requirement sets must pass in full: 2025-11-25 (30 scored scenarios, run on the
handshake wire) and 2026-07-28 (37, sessionless); and every scenario the suite applies to 2025-06-18
(27). `make test` runs this file a second time with the fast path off, so both downstream paths are held
to the suite.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conformance import requirement_set, run_suite, running_fixture, suite_available
from tests.integration.conftest import ROOT, connect, run_gateway

FIXTURE = ROOT / "tests" / "fixtures" / "conformance_server.py"
pytestmark = pytest.mark.skipif(not suite_available(), reason="conformance suite / Node 22 not installed")


@contextmanager
def upstream(transport: str) -> Iterator[dict[str, Any]]:
    """The fixture's server entry: a stdio process, or an HTTP server started here."""
    common: dict[str, Any] = {
        "prefix": "",
        "trusted": True,
        "startup_timeout": 30,
        "relay": {"roots": True},  # the suite's roots scenarios need it; see README on roots
        "required": True,  # /readyz waits for it
    }
    if transport == "stdio":
        yield {"command": sys.executable, "args": [str(FIXTURE), "--transport", "stdio"], **common}
        return
    with running_fixture() as url:
        yield {"url": url, **common}


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 30
    while httpx2.get(f"{base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never became ready"
        time.sleep(0.1)


# The upstream's transport is behind the downstream path: the SDK-path run takes the suite through one of them.
@pytest.mark.parametrize("transport", [pytest.param("stdio", marks=pytest.mark.path_independent), "http"])
def test_both_requirement_sets_pass_through_the_gateway(tmp_path: Path, transport: str) -> None:
    with upstream(transport) as server, run_gateway(tmp_path, {"servers": {"conformance": server}}) as gw:
        wait_ready(gw.base)
        for requirements in ("2025-11-25", "2026-07-28", "2025-06-18"):
            result = run_suite(gw.url, requirements, tmp_path / requirements, timeout=180)
            scored, _ = requirement_set(requirements)
            assert len(result.scored) == len(scored), result.table()
            assert result.ok, result.table(verbose=True)
            # The scenarios run but not scored (the tasks extension, pending ones) pass through it too.
            assert [o.name for o in result.scenarios if not o.passed] == [], result.table(verbose=True)


@pytest.mark.anyio
async def test_param_headers_reach_a_2026_http_upstream(tmp_path: Path) -> None:
    """An argument a tool mirrors into a header (`x-mcp-header`) travels as `Mcp-Param-*` to a 2026 HTTP server,
    which refuses a call without it."""
    with upstream("http") as server, run_gateway(tmp_path, {"servers": {"conformance": server}}) as gw:
        wait_ready(gw.base)
        async with connect(gw.url, "2026-07-28") as client:
            result = await client.call("test_custom_header", {"region": "eu-west", "query": "q"})
    assert result.is_error is not True, result
    assert result.content[0].text == "region=eu-west; query=q"  # type: ignore[union-attr]
