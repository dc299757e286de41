"""Which replica holds what a request names: held calls' `requestState` and tasks' ids carry their origin."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gateway.core.tasks import Tasks
from gateway.downstream.replicas import SessionStore, SharedSessions
from gateway.downstream.sessions import Sessions
from gateway.relay.held import HeldCalls


def shared(replica: str) -> SharedSessions:
    return SharedSessions(cast(SessionStore, object()), Sessions(), 60, replica)


def call(state: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "s__t", "requestState": state}}


def task(method: str, task_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"taskId": task_id}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_held_calls_retry_names_the_replica_holding_it() -> None:
    held = HeldCalls("aaaa1111")
    state = held.state(held.open({}, 5, owner="o", tool="s__t"))
    assert shared("bbbb2222").holder_of(call(state)) == "aaaa1111"
    assert shared("aaaa1111").holder_of(call(state)) is None, "held here: served here"
    assert shared("bbbb2222").holder_of(call("the-servers-own-state")) is None, "a server's state is passed on"
    assert shared("bbbb2222").holder_of(call(7)) is None


def test_a_request_about_a_task_names_the_replica_that_handed_it_out() -> None:
    tasks = Tasks("aaaa1111")
    public = tasks.publish({"task": {"taskId": "upstream-1"}}, "s", "owner")["task"]["taskId"]
    assert Tasks.origin_of(public) == "aaaa1111"
    for method in ("tasks/get", "tasks/result", "tasks/update", "tasks/cancel"):
        assert shared("bbbb2222").holder_of(task(method, public)) == "aaaa1111", method
        assert shared("aaaa1111").holder_of(task(method, public)) is None
    assert shared("bbbb2222").holder_of(task("tasks/list", public)) is None, "a listing is not about one task"
    assert shared("bbbb2222").holder_of(task("tasks/get", "somebody-else")) is None
    assert shared("bbbb2222").holder_of({"jsonrpc": "2.0", "id": 1, "method": "tasks/get"}) is None
    assert shared("bbbb2222").holder_of([call("x")]) is None
