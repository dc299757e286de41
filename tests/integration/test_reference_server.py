"""The official conformance suite through the gateway, in front of the suite's own reference server.

The reference server is the TypeScript server the suite's authors wrote to pass it
(`tests/thirdparty/reference-server`, unchanged), served as one HTTP upstream with an empty prefix so the
suite finds its tool names. Every scored scenario of the three requirement sets must pass through the gateway,
and every scenario the server passes when the suite talks to it directly, scored or not, must pass through
the gateway too: the gateway may not lose anything the server offers. `make test` runs this file a second
time with the fast path off, so both downstream paths are held to it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conformance import (
    SuiteResult,
    reference_server_available,
    requirement_set,
    run_suite,
    running_reference_server,
    suite_available,
)
from tests.integration.conftest import run_gateway

pytestmark = pytest.mark.skipif(
    not (suite_available() and reference_server_available()),
    reason="conformance suite, reference server or Node 22 not installed (make test installs them)",
)
REQUIREMENT_SETS = ("2025-11-25", "2026-07-28", "2025-06-18")


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 60
    while httpx2.get(f"{base}/readyz", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never became ready"
        time.sleep(0.1)


def passed(result: SuiteResult) -> set[str]:
    return {s.name for s in result.scenarios if s.passed}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The reference server, and what the suite concludes talking to it directly."""
    work = tmp_path_factory.mktemp("reference")
    with running_reference_server(log_path=work / "reference-server.log") as url:
        direct = {r: run_suite(url, r, work / f"direct-{r}", timeout=180) for r in REQUIREMENT_SETS}
        yield url, direct


def test_every_scenario_the_reference_server_passes_passes_through_the_gateway(
    tmp_path: Path, reference: tuple[str, dict[str, SuiteResult]]
) -> None:
    url, direct = reference
    server = {"url": url, "prefix": "", "trusted": True, "relay": {"roots": True}, "required": True}
    with run_gateway(tmp_path, {"servers": {"reference": server}}) as gw:
        wait_ready(gw.base)
        for requirements in REQUIREMENT_SETS:
            result = run_suite(gw.url, requirements, tmp_path / requirements, timeout=180)
            scored, _ = requirement_set(requirements)
            assert len(result.scored) == len(scored), result.table()
            assert result.ok, f"{result.table(verbose=True)}\n\ngateway log:\n{gw.log()[-4000:]}"
            lost = sorted(passed(direct[requirements]) - passed(result))
            assert lost == [], f"pass directly, fail through the gateway: {lost}\n{result.table(verbose=True)}"
