"""A server that misbehaves around requests of the user, through the gateway: it keeps serving, nobody is misled.

`tests/fixtures/scripted_upstream.py` is a hand-written 2025-11-25 stdio server: it asks for sampling with
no call in flight, answers one call twice, asks for elicitation and waits (or withdraws the question), and
writes junk and responses to ids nobody used. One gateway (the server's `timeout` is 3 s) serves the whole
module; the tests run one after another, so no call of another test is in flight on the server.

Clients that declare a capability the server may ask through take another road through the gateway than
plain clients (the SDK's session rather than the lean stdio channel, and for a 2026 client a held call),
so the tests that should hold on every road run over each (`capable`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError, types

from tests.integration.conftest import ERAS, EraClient, Gateway, connect, run_gateway, upstream_pids, wait_until

pytestmark = pytest.mark.anyio

SCRIPTED = Path(__file__).resolve().parents[1] / "fixtures" / "scripted_upstream.py"
TIMEOUT = 3  # the server's `timeout`: bounds each relayed request and each held call
MARGIN = 2.5  # what the gateway may take beyond TIMEOUT to end a call
LEGACY, MODERN = "2025-11-25", "2026-07-28"
ADA: dict[str, str | int | float | bool | list[str] | None] = {"name": "Ada"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("hostile-relays")
    config = {"servers": {"scripted": {"command": sys.executable, "args": [str(SCRIPTED)], "timeout": TIMEOUT}}}
    with run_gateway(tmp, config) as gw:
        _wait_for_tools(gw)
        yield gw


def _wait_for_tools(gw: Gateway) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/list",
    }
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if "scripted__ask_and_wait" in httpx2.post(gw.url, json=body, headers=headers, timeout=10).text:
            return
        time.sleep(0.1)
    raise AssertionError(f"the gateway never listed the scripted server's tools:\n{gw.log()}")


def text_of(result: Any) -> str:
    assert isinstance(result, types.CallToolResult), result
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def answer_ada(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content=ADA)


async def never_answer(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def capabilities(capable: bool) -> dict[str, Any]:
    """Client options: an elicitation callback that answers (the client declares elicitation), or none."""
    return {"elicitation_callback": answer_ada} if capable else {}


def refusals(gw: Gateway, method: str) -> list[dict[str, Any]]:
    return [e for e in gw.log_events() if e.get("event") == "server request refused" and e.get("method") == method]


async def cancels(c: EraClient) -> list[dict[str, Any]]:
    """The cancellations the scripted server received so far."""
    received: list[dict[str, Any]] = json.loads(text_of(await c.call("scripted__cancels")))
    return received


async def assert_serving(gw: Gateway, era: str, text: str = "still serving") -> None:
    async with connect(gw.url, era) as c:
        with anyio.fail_after(10):
            assert text_of(await c.call("scripted__echo", {"text": text})) == text


# --- 1. a request of the user with no call in flight ------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_a_request_with_no_call_in_flight_gets_a_clean_error(gateway: Gateway, era: str) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="I should not be asked"), model="m"
        )

    seen = len(refusals(gateway, "sampling/createMessage"))
    async with connect(gateway.url, era, sampling_callback=sample) as c:
        with anyio.fail_after(10):
            assert text_of(await c.call("scripted__ask_unprompted")) == "I will ask later"
        # The server asks ~0.3 s after its call ended; no call of this client is in flight until it was refused.
        await wait_until(lambda: len(refusals(gateway, "sampling/createMessage")) > seen, 10, "the refusal")
        with anyio.fail_after(10):
            while (answer := text_of(await c.call("scripted__last_answer"))) == "pending":
                await anyio.sleep(0.05)
        assert asked == [], f"a client was asked a question no call of its caused: {asked}"
        # Still serving, this client included.
        assert text_of(await c.call("scripted__echo", {"text": "later"})) == "later"
    error = json.loads(answer)["error"]
    assert error["code"] == types.INVALID_REQUEST, error
    assert error["message"] == "sampling/createMessage cannot be relayed: no call of this server is in flight", error
    [refused] = refusals(gateway, "sampling/createMessage")[seen:]
    assert refused["server"] == "scripted" and refused["reason"] == "no call of this server is in flight"
    assert asked == []


def answered(gw: Gateway, times: int) -> Callable[[], bool]:
    """Whether the scripted server has its answers to the `times` requests `ask_unprompted` made (its stderr)."""
    return lambda: f"unprompted sampling answered ({times})" in gw.log()


async def test_a_server_asking_in_a_loop_is_refused_each_time_and_logged_at_a_bounded_rate(tmp_path: Path) -> None:
    """3000 requests of the user with no call in flight, at once: each gets its clean error, the log gets a few
    lines (the refusals of one server are logged as its stderr lines are, rate-limited), and what was held back
    is counted in the next line let through. A gateway of its own, so no other test spent the budget."""
    config = {"servers": {"scripted": {"command": sys.executable, "args": [str(SCRIPTED)], "timeout": TIMEOUT}}}
    with run_gateway(tmp_path, config) as gw:
        _wait_for_tools(gw)
        started = time.monotonic()
        async with connect(gw.url, MODERN) as c:
            for times in (3000, 1):  # the one asked later reports the count the loop left held back
                with anyio.fail_after(10):
                    assert text_of(await c.call("scripted__ask_unprompted", {"times": times})) == "I will ask later"
                # No call while the server asks: one in flight would make its requests that call's.
                await wait_until(answered(gw, times), 60, "the answers")
                error = json.loads(text_of(await c.call("scripted__last_answer")))["error"]
                assert (
                    error["message"] == "sampling/createMessage cannot be relayed: no call of this server is in flight"
                )
                await anyio.sleep(1.2)  # a token of the budget comes back
        elapsed = time.monotonic() - started
        logged = refusals(gw, "sampling/createMessage")
        held = [e["count"] for e in gw.log_events() if e.get("event") == "server request refusals suppressed"]
    assert 10 <= len(logged) <= 10 + elapsed + 1, f"{len(logged)} refusals logged in {elapsed:.1f} s"
    assert len(logged) + sum(held) == 3001, "every refusal is logged or counted"


# --- 2. one call answered twice ---------------------------------------------------------------------------------


@pytest.mark.parametrize("capable", [False, True], ids=["plain", "capable"])
@pytest.mark.parametrize("era", ERAS)
async def test_a_doubled_answer_reaches_the_caller_once(gateway: Gateway, era: str, capable: bool) -> None:
    pids = upstream_pids(gateway, "scripted")
    async with connect(gateway.url, era, **capabilities(capable)) as c:
        with anyio.fail_after(15):
            # The second answer right behind the first, then one that comes while the next call is in flight.
            assert text_of(await c.call("scripted__answer_twice")) == "first answer"
            assert text_of(await c.call("scripted__echo", {"text": "right after"})) == "right after"
            assert text_of(await c.call("scripted__answer_twice", {"delay": 0.2})) == "first answer"
            slow = await c.call("scripted__echo", {"text": "the next call", "sleep": 0.5})
            assert text_of(slow) == "the next call"
            assert slow.is_error is not True
            assert text_of(await c.call("scripted__echo", {"text": "and the one after"})) == "and the one after"
    assert upstream_pids(gateway, "scripted") == pids, "a doubled answer must not cost the connection"
    await assert_serving(gateway, LEGACY if era == MODERN else MODERN)


# --- 3. a 2025 client that never answers --------------------------------------------------------------------------


async def test_a_2025_client_that_never_answers_is_bounded_by_the_timeout(gateway: Gateway) -> None:
    asked: list[str] = []

    async def silent(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return await never_answer(ctx, params)

    async with connect(gateway.url, LEGACY, elicitation_callback=silent) as c:
        started = time.monotonic()
        outcome: str
        with anyio.fail_after(TIMEOUT + 10):
            try:
                result = await c.call("scripted__ask_and_wait")
                outcome = f"result(is_error={result.is_error}): {text_of(result)}"
            except MCPError as e:
                outcome = f"error {e.code}: {e.error.message}"
        took = time.monotonic() - started
        assert asked == ["Who goes there?"], "the question reached the caller"
        assert TIMEOUT - 0.5 <= took <= TIMEOUT + MARGIN, f"ended after {took:.1f} s: {outcome}"
        assert "did not answer" in outcome and f"{TIMEOUT} s" in outcome, outcome
        # The same session goes on with plain calls.
        assert text_of(await c.call("scripted__echo", {"text": "after the silence"})) == "after the silence"
    # And the server's next question reaches the next caller: nothing of the silent one is left in flight.
    async with connect(gateway.url, LEGACY, elicitation_callback=answer_ada) as c:
        with anyio.fail_after(TIMEOUT + 5):
            assert text_of(await c.call("scripted__ask_and_wait")) == 'accept: {"name": "Ada"}'


class Withdrawable:
    """A 2025 client's elicitation callback that never answers and notes when the SDK cancels it (which it does
    when `notifications/cancelled` for the question arrives)."""

    def __init__(self) -> None:
        self.asked = anyio.Event()
        self.withdrawn = anyio.Event()

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.set()
        try:
            return await never_answer(ctx, params)
        finally:
            self.withdrawn.set()


async def test_a_question_the_server_withdraws_during_its_call_is_withdrawn_from_the_client(gateway: Gateway) -> None:
    question = Withdrawable()
    async with connect(gateway.url, LEGACY, elicitation_callback=question) as c, anyio.create_task_group() as tg:
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await c.call("scripted__ask_then_withdraw", {"withdraw": 0.3, "answer": 1.0}))

        tg.start_soon(call)
        with anyio.fail_after(5):
            await question.asked.wait()
            await question.withdrawn.wait()
        assert results == [], "the question was withdrawn while its call was in flight"
    assert text_of(results[0]) == "gave up"


@pytest.mark.xfail(
    strict=True,
    reason="gateway bug: a relayed question abandoned after its call's answer went out (the server withdrew it, "
    "or the relay timed out) is never withdrawn from the 2025 client (no notifications/cancelled reaches it; "
    "apparently sent on the call's SSE stream, closed by then)",
)
async def test_a_question_withdrawn_after_its_call_ended_is_withdrawn_from_the_client(gateway: Gateway) -> None:
    """The server answers its call (giving up on its question), then withdraws the question. The gateway
    stops waiting for it (no answer to the withdrawn request ever reaches the server), but the client is not
    told: the SDK routes its courtesy `notifications/cancelled` to the call's own SSE stream (related request
    id), closed by then, so the client keeps a question nobody will read the answer to.
    The same happens, by a race of a few ms, when a call times out while its question is out (both the call and
    the relay are bounded by the server's `timeout`, the relay starting a little later): the call's error
    answer goes out first and the question's withdrawal is lost (default fast path: lost in every run tried)."""
    question = Withdrawable()
    async with connect(gateway.url, LEGACY, elicitation_callback=question) as c:
        with anyio.fail_after(5):
            result = await c.call("scripted__ask_then_withdraw", {"withdraw": 0.6, "answer": 0.2})
        assert question.asked.is_set() and text_of(result) == "gave up"
        with anyio.move_on_after(2):
            await question.withdrawn.wait()
        assert question.withdrawn.is_set(), "2 s after the server withdrew it, the client still holds the question"


# --- 4. a held call nobody comes back for -----------------------------------------------------------------------


async def test_a_held_call_nobody_retries_is_cancelled_upstream_after_the_timeout(gateway: Gateway) -> None:
    async with connect(gateway.url, MODERN) as watcher:
        seen = len(await cancels(watcher))
        async with connect(gateway.url, MODERN, elicitation_callback=never_answer) as first:
            started = time.monotonic()
            with anyio.fail_after(TIMEOUT + 5):
                held = await first.session.call_tool("scripted__ask_and_wait", {}, allow_input_required=True)
            assert isinstance(held, types.InputRequiredResult), held
            assert time.monotonic() - started < TIMEOUT / 2, "the question came back at once"
            assert held.input_requests is not None and held.request_state is not None
            [(key, request)] = held.input_requests.items()
            asked = request.model_dump(by_alias=True, mode="json", exclude_none=True)
            assert asked["method"] == "elicitation/create", asked
            assert asked["params"]["message"] == "Who goes there?"

            # Nobody retries: the call is cancelled upstream after the server's timeout.
            new: list[dict[str, Any]] = []
            with anyio.move_on_after(TIMEOUT + MARGIN + 5):
                while not (new := (await cancels(watcher))[seen:]):
                    await anyio.sleep(0.1)
            assert new, f"the server was never told the held call was cancelled:\n{gateway.log()[-4000:]}"
            took = time.monotonic() - started
            assert [c["tool"] for c in new] == ["ask_and_wait"], new
            assert TIMEOUT - 0.5 <= took <= TIMEOUT + MARGIN, f"cancelled after {took:.1f} s"

            # A retry that comes too late finds nothing to resume.
            late = types.ElicitResult(action="accept", content=ADA)
            with pytest.raises(MCPError) as err:
                await first.session.call_tool(
                    "scripted__ask_and_wait",
                    {},
                    input_responses={key: late},
                    request_state=held.request_state,
                    allow_input_required=True,
                )
            assert err.value.code == types.INVALID_PARAMS, err.value
            assert "requestState is unknown, expired or was altered" in err.value.error.message

        # Another client's question now reaches it, and its answer the server (the held rounds, driven by the SDK).
        async with connect(gateway.url, MODERN, elicitation_callback=answer_ada) as second:
            with anyio.fail_after(TIMEOUT + 5):
                assert text_of(await second.call("scripted__ask_and_wait")) == 'accept: {"name": "Ada"}'
        assert (await cancels(watcher))[seen:] == new, "only the abandoned call was cancelled"


async def test_a_held_question_names_its_server(gateway: Gateway) -> None:
    """README: each call result carries `manifold/server` and `manifold/trust`, and a server's request of the
    user carries them so the client can show where it comes from. 2026-07-28 input requests have no `_meta`
    (the SDK's sieve drops the marks), so the result's `_meta` is the one place left, and shape_result puts
    them there for input_required results passed through from 2026 servers, and for held calls' rounds."""
    async with connect(gateway.url, MODERN, elicitation_callback=never_answer) as c:
        with anyio.fail_after(TIMEOUT + 5):
            held = await c.session.call_tool("scripted__ask_and_wait", {}, allow_input_required=True)
        assert isinstance(held, types.InputRequiredResult) and held.input_requests is not None, held
        [key] = held.input_requests
        with anyio.fail_after(TIMEOUT + 5):  # answer it, so the call is not left in flight for the next tests
            done = await c.session.call_tool(
                "scripted__ask_and_wait",
                {},
                input_responses={key: types.ElicitResult(action="decline")},
                request_state=held.request_state,
                allow_input_required=True,
            )
        assert text_of(done) == "decline"
        assert done.meta is not None and done.meta["manifold/server"] == "scripted", done.meta
    meta = held.model_dump(by_alias=True, mode="json", exclude_none=True).get("_meta", {})
    assert meta.get("manifold/server") == "scripted" and meta.get("manifold/trust") == "outside", meta


# --- 5. junk on the server's stdout -----------------------------------------------------------------------------


@pytest.mark.parametrize("capable", [False, True], ids=["plain", "capable"])
@pytest.mark.parametrize("era", ERAS)
async def test_garbage_and_stray_responses_do_not_break_the_connection(
    gateway: Gateway, era: str, capable: bool
) -> None:
    pids = upstream_pids(gateway, "scripted")
    async with connect(gateway.url, era, **capabilities(capable)) as c:
        with anyio.fail_after(15):
            result = await c.call("scripted__garbage_then_answer")
            assert result.is_error is not True
            assert text_of(result) == "the real answer"
            assert text_of(await c.call("scripted__echo", {"text": "next"})) == "next"
            assert text_of(await c.call("scripted__garbage_then_answer")) == "the real answer"
    assert upstream_pids(gateway, "scripted") == pids, "junk must not cost the connection"
    log = gateway.log()
    assert "a stray answer nobody asked for" not in log and "a stray error nobody asked for" not in log
