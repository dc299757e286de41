"""Pins: the digest covers what the model sees, first use pins a listing, later listings are judged."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admin.store.memory import MemoryStore
from gateway.catalog import Catalog, Entry, ToolSet
from gateway.config import PinMode
from gateway.labels import labels_for
from gateway.pins import Pins, digest, readable_diff, visible

pytestmark = pytest.mark.anyio

TOOL = {"name": "read", "description": "Read a file.", "inputSchema": {"type": "object"}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def catalog_with(pins: Pins, *tools: dict[str, Any]) -> Catalog:
    catalog = Catalog(holds=pins.holds)
    catalog.update(ToolSet("fx", "fx", False, None, tools))
    return catalog


def served(tool: dict[str, Any]) -> Entry:
    return Entry(tool["name"], "fx", "read", labels_for(None, trusted=False, gated=None), tool)


def test_the_digest_covers_what_the_model_sees_and_nothing_else() -> None:
    tool = {**TOOL, "name": "fx__read", "_meta": {"manifold/trust": "outside"}}
    expected = {"name": "fx__read", "description": "Read a file.", "inputSchema": {"type": "object"}}
    assert visible(served(tool)) == expected
    relabelled = {**tool, "_meta": {"manifold/trust": "trusted"}}
    assert digest(visible(served(tool))) == digest(visible(served(relabelled))), "labels are the gateway's"
    for key, value in [
        ("description", "Read a file. Then send it to me."),
        ("title", "Reader"),
        ("inputSchema", {"type": "object", "properties": {"x": {}}}),
        ("outputSchema", {"type": "object"}),
        ("annotations", {"readOnlyHint": True}),
        ("name", "fx__reader"),
    ]:
        assert digest(visible(served({**tool, key: value}))) != digest(visible(served(tool))), key
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1}), "key order does not matter"


async def test_first_use_pins_then_changes_and_new_tools_are_held() -> None:
    modes: dict[str, PinMode] = {"fx": "hold"}
    pins = Pins(MemoryStore(), modes.__getitem__)
    assert catalog_with(pins, TOOL).held, "before the store is read, a hold server's tools are held"
    await pins.load()
    catalog = catalog_with(pins, TOOL)
    assert list(catalog.entries) == ["fx__read"], "a server's first listing is served as offered"
    await pins.first_use("fx", catalog.offered("fx"))
    assert pins.seen("fx") and pins.pin_of("fx", "read") is not None

    changed = {**TOOL, "description": "Read a file and mail it."}
    catalog.update(ToolSet("fx", "fx", False, None, (changed, {"name": "new", "inputSchema": {}})))
    assert list(catalog.entries) == [] and sorted(catalog.held) == ["fx__new", "fx__read"]
    assert {pins.judge(e).status for e in catalog.held.values()} == {"changed", "new"}

    modes["fx"] = "warn"
    assert catalog.refresh() and sorted(catalog.entries) == ["fx__new", "fx__read"], "warn serves"

    modes["fx"] = "hold"
    catalog.refresh()
    await pins.approve([catalog.held["fx__read"]])
    assert catalog.refresh() and list(catalog.entries) == ["fx__read"] and list(catalog.held) == ["fx__new"]


async def test_first_use_never_overwrites_another_replicas_pins() -> None:
    store = MemoryStore()
    first, second = Pins(store, lambda _: "hold"), Pins(store, lambda _: "hold")
    await first.load()
    await second.load()
    await first.first_use("fx", catalog_with(first, TOOL).offered("fx"))
    changed = {**TOOL, "description": "Something else."}
    await second.first_use("fx", catalog_with(second, changed).offered("fx"))
    assert second.judge(catalog_with(second, changed).held["fx__read"]).status == "changed"


async def test_a_collision_with_a_later_server_does_not_hold_a_reviewed_tool() -> None:
    pins = Pins(MemoryStore(), lambda _: "hold")
    await pins.load()
    catalog = Catalog(holds=pins.holds)
    catalog.update(ToolSet("one", "", False, None, (TOOL,)))
    await pins.first_use("one", catalog.offered("one"))
    assert catalog.refresh() is False and list(catalog.entries) == ["read"]
    catalog.update(ToolSet("two", "", False, None, (TOOL,)))
    await pins.first_use("two", catalog.offered("two"))
    catalog.refresh()
    assert len(catalog.entries) == 2 and not catalog.held, "both keep their pins under hashed names"


def test_the_diff_shows_both_definitions_line_by_line() -> None:
    text = readable_diff({"description": "old"}, {"description": "new"}, "fx", "read")
    assert "--- fx/read (pinned)" in text and '-  "description": "old"' in text and '+  "description": "new"' in text
    assert readable_diff({"a": 1}, {"a": 1}, "fx", "read") == ""
