"""A server not read from the config file connects to the address its URL was checked at, on every transport.

The host name `rebind.invalid` resolves nowhere (RFC 6761); the egress rules' resolver answers it with
127.0.0.2, where a real fixture server listens. A transport that connected by name after the check (and so
could be sent elsewhere by a second DNS answer) would not reach it.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from gateway.config.servers import ServerSpec
from gateway.policy.egress import EgressPolicy
from gateway.protocol.errors import State
from gateway.upstream.connection import Upstream
from tests.fixtures.servers import run_http_fixture

pytestmark = pytest.mark.anyio
ADDRESS = "127.0.0.2"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def resolver(host: str, port: int) -> list[str]:
    return [ADDRESS] if host == "rebind.invalid" else []


async def unchanged(_: Upstream) -> None:
    return None


@pytest.mark.parametrize("fast", [True, False], ids=["lean", "sdk"])
@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_runtime_server_is_reached_at_the_checked_address(transport: str, fast: bool) -> None:
    with run_http_fixture(transport=transport, host=ADDRESS) as fixture:
        url = fixture.url.replace(ADDRESS, "rebind.invalid")
        spec = ServerSpec.model_validate({"name": "web", "url": url, "transport": transport, "startup_timeout": 5})
        policy = EgressPolicy.from_allow(["127.0.0.0/8"], resolve=resolver)
        upstream = Upstream(spec, unchanged, {}, egress=policy, source="runtime", fast=fast)
        async with anyio.create_task_group() as tg:
            tg.start_soon(upstream.run)
            with anyio.fail_after(10):
                await upstream.settled.wait()
            assert upstream.state is State.UP, upstream.error
            result: dict[str, Any] = await upstream.request(
                "tools/call", {"name": "echo", "arguments": {"text": "pinned"}}, lean=True
            )
            assert result["content"][0]["text"] == "pinned"
            tg.cancel_scope.cancel()


async def test_a_server_not_from_the_config_file_never_connects_without_egress_rules() -> None:
    with run_http_fixture() as fixture:
        spec = ServerSpec.model_validate({"name": "web", "url": fixture.url, "startup_timeout": 5})
        upstream = Upstream(spec, unchanged, {}, egress=None, source="conversation")
        async with anyio.create_task_group() as tg:
            tg.start_soon(upstream.run)
            with anyio.fail_after(10):
                await upstream.settled.wait()
            assert upstream.state is State.DOWN
            assert upstream.error is not None and "egress" in upstream.error, upstream.error
            tg.cancel_scope.cancel()
