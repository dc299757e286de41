"""The call policy's pure parts: admission, era shaping, and what each kind of channel failure means."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import MCPError

from gateway import SERVER_INFO
from gateway.config.servers import ServerSpec, parse_server
from gateway.core.calls import Draining, admit
from gateway.core.forward import shape_result
from gateway.core.registry import Registry
from gateway.internals.sdk import channel_error
from gateway.policy.access import View
from gateway.protocol.era import SERVER_INFO_KEY
from gateway.protocol.errors import AnswerLost, BadAnswer, CallFailed, HttpStatus, NotSent, SessionExpired
from gateway.upstream.invoke import Invoker

MODERN, LEGACY = "2026-07-28", "2025-11-25"
TOOLS = (
    {"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    {"name": "write", "inputSchema": {"type": "object"}},
)


def _registry() -> Registry:
    problems: list[str] = []
    spec = parse_server("fx", {"command": "fx", "pin": "off"}, "servers.fx", problems)
    assert spec is not None and not problems
    registry = Registry([spec])
    from gateway.catalog.merged import ToolSet

    registry.catalog.update(ToolSet("fx", "fx", False, None, TOOLS))
    return registry


def test_admit_resolves_a_visible_tool() -> None:
    entry = admit(_registry(), View("all"), "fx__read", 1, draining=False)
    assert (entry.server, entry.original) == ("fx", "read")


@pytest.mark.parametrize(
    ("view", "name"),
    [
        (View("all"), "fx__nope"),
        (View("readers", tools=("fx__read",)), "fx__write"),
        (View("safe", gated="deny"), "fx__write"),
    ],
)
def test_unknown_and_hidden_tools_get_the_same_answer(view: View, name: str) -> None:
    with pytest.raises(MCPError) as refused:
        admit(_registry(), view, name, 1, draining=False)
    assert (refused.value.code, refused.value.error.message) == (-32602, f"Unknown tool: {name}")


def test_a_draining_gateway_admits_nothing() -> None:
    with pytest.raises(Draining):
        admit(_registry(), View("all"), "fx__read", 1, draining=True)


def _entry() -> Any:
    return _registry().catalog.resolve("fx__read")


def test_a_modern_result_carries_labels_result_type_and_manifolds_identity() -> None:
    raw = {"content": [], "_meta": {SERVER_INFO_KEY: {"name": "upstream"}, "vendor/x": 1}}
    shaped = shape_result(raw, _entry(), MODERN)
    assert shaped["resultType"] == "complete"
    assert shaped["_meta"] == {
        "vendor/x": 1,
        "manifold/server": "fx",
        "manifold/trust": "outside",
        SERVER_INFO_KEY: SERVER_INFO,
    }


def test_a_legacy_result_loses_what_later_revisions_define() -> None:
    raw = {"content": [], "resultType": "complete", "requestState": "s", "_meta": {SERVER_INFO_KEY: {"name": "up"}}}
    shaped = shape_result(raw, _entry(), LEGACY)
    assert "resultType" not in shaped and "requestState" not in shaped
    assert shaped["_meta"] == {"manifold/server": "fx", "manifold/trust": "outside"}


def test_a_legacy_result_loses_the_cache_hints_only_the_modern_era_defines() -> None:
    shaped = shape_result({"content": [], "ttlMs": 5000, "cacheScope": "public"}, _entry(), LEGACY)
    assert "ttlMs" not in shaped and "cacheScope" not in shaped


def test_input_required_cannot_reach_a_legacy_caller() -> None:
    with pytest.raises(MCPError) as refused:
        shape_result({"resultType": "input_required", "inputRequests": {}}, _entry(), LEGACY)
    assert "input_required" in refused.value.error.message and "fx" in refused.value.error.message
    assert shape_result({"resultType": "input_required"}, _entry(), MODERN)["resultType"] == "input_required"


class _Recorder:
    """The connection's side of a failed call: records what the invoker told it."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def lost(self) -> None:
        self.events.append("lost")

    def reconnect(self) -> None:
        self.events.append("reconnect")


def _spec() -> ServerSpec:
    problems: list[str] = []
    spec = parse_server("fx", {"url": "http://127.0.0.1:9/mcp"}, "servers.fx", problems)
    assert spec is not None
    return spec


@pytest.mark.parametrize(
    ("failure", "version", "transient", "repeatable", "events", "text"),
    [
        (NotSent("x"), MODERN, True, True, ["lost"], "closed before the request was sent"),
        (
            AnswerLost("x"),
            MODERN,
            True,
            False,
            [],
            "the connection closed before the answer; the call may have run",
        ),
        (SessionExpired("x"), LEGACY, True, True, ["reconnect"], "ended the session"),
        (HttpStatus(500), LEGACY, True, False, ["reconnect"], "HTTP error status"),
        (HttpStatus(500), MODERN, True, False, [], "HTTP error status"),
    ],
)
def test_channel_failures_are_classified_by_type(
    failure: Exception, version: str, transient: bool, repeatable: bool, events: list[str], text: str
) -> None:
    connection = _Recorder()
    outcome = Invoker(_spec(), connection).classify(failure, version)  # type: ignore[arg-type]
    assert isinstance(outcome, CallFailed)
    assert (outcome.transient, outcome.repeatable) == (transient, repeatable)
    assert "server 'fx'" in str(outcome) and text in str(outcome)
    assert connection.events == events


def test_a_bad_answer_is_passed_on_as_its_error() -> None:
    outcome = Invoker(_spec(), _Recorder()).classify(BadAnswer(-32700, "Failed to parse JSON response"), MODERN)
    assert isinstance(outcome, MCPError) and outcome.code == -32700


def test_the_sdk_stand_ins_map_to_the_same_types() -> None:
    assert isinstance(channel_error(MCPError(-32000, "Connection closed")), AnswerLost)
    assert isinstance(channel_error(MCPError(-32600, "Session terminated")), SessionExpired)
    assert isinstance(channel_error(MCPError(-32603, "Server returned an error response")), HttpStatus)
    assert channel_error(MCPError(-32602, "bad arguments")) is None
