"""Whose a server's request of the user is: the one caller session with calls in flight, else nobody's."""

from __future__ import annotations

from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import MCPError

from gateway.config.servers import ServerSpec
from gateway.relay.asks import Callers, Mute

pytestmark = pytest.mark.anyio
SAMPLE = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeCaller:
    """A caller that answers (or hangs) and records what it was asked."""

    wants_logs = False

    def __init__(self, session: str, capabilities: dict[str, Any], *, hang: bool = False) -> None:
        self.session, self.capabilities, self.hang = session, capabilities, hang
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.logs: list[dict[str, Any]] = []

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append((method, params))
        if self.hang:
            await anyio.sleep_forever()
        return {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}

    async def log(self, params: dict[str, Any]) -> None:
        self.logs.append(params)


def callers(**options: Any) -> Callers:
    return Callers(ServerSpec(name="srv", command="x", **options))


async def test_the_one_caller_in_flight_is_asked_with_the_server_named() -> None:
    relay, caller = callers(), FakeCaller("a", {"sampling": {}})
    with relay.serving(caller), relay.serving(caller):  # two calls of one session
        answer = await relay.ask("sampling/createMessage", SAMPLE)
    assert answer["model"] == "m"
    [(method, params)] = caller.asked
    assert method == "sampling/createMessage"
    assert params["_meta"] == {"manifold/server": "srv", "manifold/trust": "outside"}


async def test_no_call_in_flight_or_several_sessions_is_refused_and_nobody_is_asked() -> None:
    relay = callers()
    with pytest.raises(MCPError, match="no call of this server is in flight"):
        await relay.ask("sampling/createMessage", SAMPLE)
    a, b = FakeCaller("a", {"sampling": {}}), FakeCaller("b", {"sampling": {}})
    with relay.serving(a), relay.serving(b), pytest.raises(MCPError, match="several clients"):
        await relay.ask("sampling/createMessage", SAMPLE)
    with relay.serving(a), relay.serving(Mute()), pytest.raises(MCPError, match="several clients"):
        await relay.ask("sampling/createMessage", SAMPLE)  # a plain call is someone else's too
    assert a.asked == [] and b.asked == []


async def test_a_capability_the_caller_lacks_or_the_server_may_not_use_is_refused() -> None:
    relay, caller = callers(), FakeCaller("a", {"elicitation": {}})
    with relay.serving(caller):
        with pytest.raises(MCPError, match="did not declare the sampling capability"):
            await relay.ask("sampling/createMessage", SAMPLE)
        with pytest.raises(MCPError, match="does not relay roots/list") as err:
            await relay.ask("roots/list", {})  # roots are off unless the server opts in
    assert err.value.code == types.METHOD_NOT_FOUND
    assert caller.asked == []
    opted = callers(relay={"roots": True})
    rooted = FakeCaller("a", {"roots": {}})
    with opted.serving(rooted):
        await opted.ask_of(rooted, "roots/list", {})
    assert [m for m, _ in rooted.asked] == ["roots/list"]


async def test_a_caller_that_never_answers_is_cut_off_at_the_servers_timeout() -> None:
    relay, caller = callers(timeout=0.2), FakeCaller("a", {"sampling": {}}, hang=True)
    params = types.CreateMessageRequestParams.model_validate(SAMPLE)
    with relay.serving(caller), anyio.fail_after(5):
        answer = await relay.callbacks()["sampling_callback"](None, params)
    assert isinstance(answer, types.ErrorData) and answer.code == types.REQUEST_TIMEOUT


async def test_log_lines_name_the_server_and_go_to_the_caller_in_flight_only() -> None:
    relay, caller = callers(), FakeCaller("a", {})
    await relay.log({"level": "info", "data": "dropped"})  # nobody in flight
    with relay.serving(caller):
        await relay.log({"level": "info", "data": "x", "logger": "db"})
        await relay.log({"level": "info", "data": "y"})
    assert [(line["logger"], line["data"]) for line in caller.logs] == [("srv/db", "x"), ("srv", "y")]
