"""Held calls: a 2025-era server's questions put to a 2026 caller as input_required rounds."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import MCPError

from gateway.relay.held import HeldCalls

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_question_becomes_a_round_and_the_answer_reaches_the_server() -> None:
    held_calls = HeldCalls("a1b2c3", b"k" * 32)
    held = held_calls.open({"elicitation": {}}, timeout=5, owner="token:alice", tool="s__ask")

    async def call() -> dict[str, Any]:
        answer = await held.ask("elicitation/create", {"message": "name?"})
        return {"content": [{"type": "text", "text": f"hello {answer['content']['name']}"}]}

    async with anyio.create_task_group() as tg:
        tg.start_soon(held_calls.run, held, call)
        pending = await held_calls.next_answer(held)
        assert pending["resultType"] == "input_required"
        [(key, request)] = pending["inputRequests"].items()
        assert request == {"method": "elicitation/create", "params": {"message": "name?"}}
        state = pending["requestState"]
        assert held_calls.find(state, "token:alice", "s__ask") is held
        altered = state[:-1] + ("0" if state[-1] != "0" else "1")
        assert held_calls.find(altered, "token:alice", "s__ask") is None
        assert held_calls.find(state, "token:bob", "s__ask") is None, "another caller's"
        assert held_calls.find(state, "token:alice", "s__other") is None, "another tool's"
        assert held_calls.find("someone-elses-state", "token:alice", "s__ask") is None
        assert not HeldCalls.ours("someone-elses-state")
        assert HeldCalls.origin_of(state) == "a1b2c3", "the state names the process holding the call"
        assert HeldCalls.origin_of("someone-elses-state") is None
        held.answer({key: {"action": "accept", "content": {"name": "Ada"}}})
        result = await held_calls.next_answer(held)
    assert result["content"][0]["text"] == "hello Ada"
    assert held_calls.find(state, "token:alice", "s__ask") is None  # done: forgotten


async def test_a_missing_answer_fails_the_servers_question_and_an_abandoned_call_is_cancelled() -> None:
    held_calls = HeldCalls("a1b2c3")
    held = held_calls.open({"sampling": {}}, timeout=0.3, owner="token:alice", tool="s__ask")
    outcome: list[str] = []

    async def call() -> dict[str, Any]:
        try:
            await held.ask("sampling/createMessage", {})
        except MCPError as e:
            outcome.append(str(e))
        await held.ask("sampling/createMessage", {})  # asked again, never answered
        return {}

    async with anyio.create_task_group() as tg:
        tg.start_soon(held_calls.run, held, call)
        await held_calls.next_answer(held)
        held.answer({})  # the retry carried no answer
        with anyio.fail_after(5), pytest.raises(MCPError, match="never came"):
            while True:
                await held_calls.next_answer(held)
    assert outcome and "gave no answer" in outcome[0]
