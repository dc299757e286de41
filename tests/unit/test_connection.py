"""A server's owner task: a programming error on its connection is logged with its traceback and counted, not
taken for the server's failure alone."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from gateway.config.servers import ResolvedServer, ServerSpec
from gateway.observe.metrics import Metrics
from gateway.policy.backoff import Backoff
from gateway.protocol.errors import State
from gateway.upstream.connection import Upstream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Faulty(Upstream):
    """A server whose transport fails with `fault` when it connects (a bug in it, or the network)."""

    def __init__(self, fault: Exception, metrics: Metrics) -> None:
        async def changed(upstream: Upstream) -> None:
            pass

        super().__init__(ServerSpec.model_validate({"name": "faulty", "command": "true"}), changed, {}, metrics)
        self.fault = fault

    async def _transport(self, r: ResolvedServer) -> Any:
        raise self.fault


def internal_errors(metrics: Metrics, where: str) -> float:
    value = metrics.registry.get_sample_value("manifold_internal_errors_total", {"where": where})
    return value or 0.0


async def down_once(upstream: Upstream) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        with anyio.fail_after(10):
            await upstream.settled.wait()
        tg.cancel_scope.cancel()
    assert upstream.state is State.DOWN


async def test_a_programming_error_is_logged_with_its_traceback_and_counted() -> None:
    metrics = Metrics()
    upstream = Faulty(KeyError("Bearer sk-live-0123456789"), metrics)
    with capture_logs() as logs:
        await down_once(upstream)
    [bug] = [e for e in logs if e["event"].startswith("programming error")]
    assert bug["server"] == "faulty" and bug["error"] == "KeyError" and bug["log_level"] == "error"
    assert "Traceback (most recent call last)" in bug["traceback"] and "in _transport" in bug["traceback"]
    assert "sk-live-0123456789" not in bug["traceback"], "credentials in the exception are redacted"
    assert internal_errors(metrics, "upstream") == 1
    assert upstream.error is not None and "sk-live" not in upstream.error


async def test_a_failure_of_the_server_or_the_network_is_no_programming_error() -> None:
    metrics = Metrics()
    for fault in (ConnectionRefusedError("refused"), ValueError("not JSON"), ExceptionGroup("g", [OSError("x")])):
        with capture_logs() as logs:
            await down_once(Faulty(fault, metrics))
        assert not [e for e in logs if e["event"].startswith("programming error")], fault
    assert internal_errors(metrics, "upstream") == 0


async def test_a_programming_error_inside_an_exception_group_is_still_one() -> None:
    metrics = Metrics()
    with capture_logs() as logs:
        await down_once(Faulty(ExceptionGroup("tasks", [OSError("x"), AttributeError("no such thing")]), metrics))
    assert [e["error"] for e in logs if e["event"].startswith("programming error")] == ["ExceptionGroup"]
    assert internal_errors(metrics, "upstream") == 1


async def test_reconnect_ends_the_wait_between_tries() -> None:
    upstream = Faulty(ConnectionRefusedError("refused"), Metrics())
    upstream._backoff = Backoff(60.0, 60.0)  # the next try would be a minute away
    tries = 0
    fault = upstream.fault

    async def counted(r: ResolvedServer) -> Any:
        nonlocal tries
        tries += 1
        raise fault

    upstream._transport = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        with anyio.fail_after(10):
            await upstream.settled.wait()
        assert tries == 1 and upstream.state is State.DOWN
        upstream.reconnect()
        with anyio.fail_after(5):
            while tries < 2:
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)
        assert tries == 2, "one reconnect is one try; then the backoff holds again"
        tg.cancel_scope.cancel()


async def test_a_retry_waits_for_a_connection_newer_than_the_one_that_broke() -> None:
    async def changed(upstream: Upstream) -> None:
        pass

    upstream = Upstream(ServerSpec.model_validate({"name": "fx", "command": "true"}), changed, {})
    await upstream._set_state(State.UP, None)
    broken = upstream.connections
    # The call's connection broke, but the owner task has not seen it end yet: the server still reads as up.
    assert not await upstream.wait_up(0.2, broken), "the broken connection is not a new one"
    assert await upstream.wait_up(0.2), "without a connection to be newer than, being up is enough"

    async def reconnect() -> None:
        await anyio.sleep(0.1)
        await upstream._set_state(State.CONNECTING, "connection closed")
        await anyio.sleep(0.1)
        await upstream._set_state(State.UP, None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reconnect)
        with anyio.fail_after(2):
            assert await upstream.wait_up(2, broken)
    assert upstream.connections == broken + 1


async def test_the_2025_session_beside_a_connection_shares_its_call_slots() -> None:
    """The server's max_concurrent holds across its main connection and the session opened beside it."""

    async def changed(upstream: Upstream) -> None:
        pass

    spec = ServerSpec.model_validate({"name": "web", "url": "http://127.0.0.1:9/mcp", "max_concurrent": 1})
    main = Upstream(spec, changed, {})
    beside = main.sibling(spec)
    assert beside._invoker.slots is not main._invoker.slots, "a conversation's own connection keeps its own"
    beside.share_slots(main)
    await main._invoker.slots.free.acquire()  # the main connection's one call in flight
    with anyio.move_on_after(0.1) as waited:
        await beside._invoker.slots.free.acquire()
    assert waited.cancelled_caught, "the session beside it waits for the same slot"
    main._invoker.slots.free.release()
