"""A call's deadline through the SDK's session: whatever ends the call, the server is told it was cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.message import SessionMessage

from gateway.internals.sdk import send_unchecked
from gateway.upstream.invoke import Deadline, ScopeDeadline

pytestmark = pytest.mark.anyio
CALL = {"name": "slow", "arguments": {}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class QuietServer:
    """The far end of a session: takes a request, answers nothing, then stops reading for a while (a busy pipe),
    so a `notifications/cancelled` written in that while has to wait."""

    def __init__(self, busy: float) -> None:
        self.busy = busy
        self.to_server, self.server_reads = anyio.create_memory_object_stream[SessionMessage](0)
        self.server_writes, self.from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.requested = anyio.Event()
        self.cancelled: list[dict[str, Any]] = []

    async def serve(self) -> None:
        async for message in self.server_reads:
            wire = message.message.model_dump(by_alias=True, exclude_none=True)
            if wire.get("method") == "tools/call":
                self.requested.set()
                await anyio.sleep(self.busy)
            elif wire.get("method") == "notifications/cancelled":
                self.cancelled.append(wire["params"])

    async def wait_for_cancel(self) -> None:
        """Until a `notifications/cancelled` arrives (at most 2 s)."""
        with anyio.fail_after(2):
            while not self.cancelled:
                await anyio.sleep(0.01)


@asynccontextmanager
async def session_with(server: QuietServer) -> AsyncIterator[ClientSession]:
    """A real SDK client session whose far end is `server`."""
    async with (
        anyio.create_task_group() as tg,
        ClientSession(server.from_server, server.to_server) as session,
    ):
        tg.start_soon(server.serve)
        yield session
        tg.cancel_scope.cancel()


async def test_a_call_cancelled_from_outside_whose_deadline_runs_out_meanwhile_still_cancels_upstream() -> None:
    # The outer scope (a held call's end, a caller gone) cancels first; the call's own deadline runs out 10 ms
    # later, while the SDK's courtesy cancel waits for the busy pipe.
    server = QuietServer(busy=0.2)
    async with session_with(server) as session:
        now = anyio.current_time()
        with anyio.CancelScope(deadline=now + 0.1) as outer:
            deadline: Deadline = ScopeDeadline(now + 0.11)
            async with deadline:
                await send_unchecked(session, "tools/call", CALL)
        assert outer.cancelled_caught and server.requested.is_set()
        await server.wait_for_cancel()
        assert [c["reason"] for c in server.cancelled] == ["caller cancelled"]


async def test_the_deadline_ends_a_silent_call_with_timeout_error_and_cancels_it_upstream() -> None:
    server = QuietServer(busy=0)
    async with session_with(server) as session:
        deadline = ScopeDeadline(anyio.current_time() + 0.05)
        with pytest.raises(TimeoutError):
            async with deadline:
                await send_unchecked(session, "tools/call", CALL)
        assert deadline.expired()
        await server.wait_for_cancel()


async def test_a_rescheduled_deadline_lets_the_block_run_on() -> None:
    loop = asyncio.get_running_loop()
    deadline = ScopeDeadline(loop.time() + 0.05)
    async with deadline:
        deadline.reschedule(loop.time() + 5)
        await anyio.sleep(0.1)
    assert not deadline.expired()
    deadline = ScopeDeadline(loop.time() + 0.05)
    async with deadline:
        deadline.reschedule(None)
        await anyio.sleep(0.1)
    assert not deadline.expired()


async def test_an_error_inside_passes_through_unchanged() -> None:
    deadline = ScopeDeadline(anyio.current_time() + 5)
    with pytest.raises(TimeoutError, match="the block's own"):
        async with deadline:
            raise TimeoutError("the block's own")
    assert not deadline.expired()
