"""However a server answers `server/discover`, a server that takes `initialize` is spoken to in its revision;
the probe waits as long as the gateway says (a booting process answers late)."""

from __future__ import annotations

from typing import Any

import anyio
import mcp.client.session
import pytest
from mcp import ClientSession

from gateway.internals.sdk import negotiate
from tests.unit.test_offers import OldServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SilentOnDiscover(OldServer):
    """Never answers `server/discover` (as some 2024 servers never answer a method they do not know)."""

    async def serve(self) -> None:
        async for message in self.server_reads:
            wire = message.message.model_dump(by_alias=True, exclude_none=True)
            if wire.get("method") == "server/discover":
                self.asked.append("server/discover")
                continue
            await self.answer(wire)


@pytest.mark.parametrize(
    "discover",
    [
        {"code": -32601, "message": "Method not found"},
        {"code": -32602, "message": "Invalid request parameters"},
        {"supportedVersions": "every one", "capabilities": 7},
        None,
    ],
    ids=["method-not-found", "invalid-params", "garbage-result", "no-answer"],
)
async def test_a_server_that_fails_discover_gets_the_handshake_in_its_own_revision(
    discover: dict[str, Any] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the probe's bound is process-wide in the SDK: restored after the test
    monkeypatch.setattr(mcp.client.session, "DISCOVER_TIMEOUT_SECONDS", mcp.client.session.DISCOVER_TIMEOUT_SECONDS)
    server = SilentOnDiscover({}) if discover is None else OldServer({"server/discover": discover})
    async with (
        anyio.create_task_group() as tg,
        ClientSession(server.from_server, server.to_server) as session,
    ):
        tg.start_soon(server.serve)
        with anyio.fail_after(5):
            await negotiate(session, discover_timeout=0.3)
        assert session.protocol_version == "2024-11-05"
        assert server.asked[:2] == ["server/discover", "initialize"]
        tg.cancel_scope.cancel()


async def test_a_late_discover_answer_counts_when_the_gateway_waits_longer_than_the_sdks_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp.client.session, "DISCOVER_TIMEOUT_SECONDS", 0.2)  # shorter than the server's boot
    server = SlowModernServer(delay=0.6)
    async with (
        anyio.create_task_group() as tg,
        ClientSession(server.from_server, server.to_server) as session,
    ):
        tg.start_soon(server.serve)
        with anyio.fail_after(5):
            await negotiate(session, discover_timeout=2)
        assert session.protocol_version == "2026-07-28"
        assert server.asked == ["server/discover"]
        tg.cancel_scope.cancel()


class SlowModernServer(OldServer):
    """A 2026-07-28 server whose first answer comes `delay` seconds late (a process still booting)."""

    def __init__(self, delay: float) -> None:
        super().__init__({"server/discover": {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}})
        self.delay = delay

    async def serve(self) -> None:
        await anyio.sleep(self.delay)
        await super().serve()
