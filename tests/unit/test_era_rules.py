"""The era rules: what each protocol revision has, asked of `gateway.protocol.era` and nowhere else."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, get_args

import mcp.types.version as sdk_versions
import pytest
from mcp import MCPError
from mcp.server.caching import CacheHint

from gateway.downstream.tools import own_result
from gateway.protocol import era as era_module
from gateway.protocol.era import SERVER_INFO_KEY, Era, Protocol, handshake_version

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
ERA_MODULE = GATEWAY / "protocol" / "era.py"
MODERN, LEGACY, OLDEST = "2026-07-28", "2025-11-25", "2024-11-05"
STAMP = {"name": "manifold", "version": "test"}

# What stands for a protocol version in code: the SDK's version names, a revision's date as a string, the era
# module's own revision names, and the variables that hold one (`caller_version`, `ctx.protocol_version`, ...)
# where they are compared. A bare `version` may be a catalog's: comparing it to a revision needs one of the others.
SDK_TYPES = ("mcp.types", "mcp_types")
SDK_VERSION_MODULES = ("mcp.types.version", "mcp_types.version")
SDK_VERSION_NAMES = frozenset(sdk_versions.__all__)
REVISION = re.compile(r"\d{4}-\d{2}-\d{2}")
PROTOCOL_VERSION = re.compile(r"(?i)protocol_version")
VERSION_VARIABLE = re.compile(r"^\w+_version$")
ERA_REVISIONS = frozenset(k for k, v in vars(era_module).items() if v in sdk_versions.KNOWN_PROTOCOL_VERSIONS)


def _identifier(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _holds_a_version(node: ast.AST) -> str | None:
    """The name of a variable (`caller_version`), attribute (`ctx.protocol_version`) or constant
    (`LATEST_HANDSHAKE`) that holds a protocol version."""
    name = _identifier(node)
    if name is None:
        return None
    if PROTOCOL_VERSION.search(name) or name in ERA_REVISIONS:
        return name
    return name if isinstance(node, ast.Name) and VERSION_VARIABLE.match(name) else None


def era_rule_breaches(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place in `source` that asks a protocol version something itself."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module in SDK_VERSION_MODULES:
            found.add((line, f"imports {node.module}"))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module in SDK_TYPES
            and any(a.name == "version" for a in node.names)
        ):
            found.add((line, f"imports {node.module}.version"))
        elif isinstance(node, ast.Import) and any(a.name in SDK_VERSION_MODULES for a in node.names):
            found.add((line, "imports the SDK's version module"))
        elif (name := _identifier(node)) in SDK_VERSION_NAMES:
            found.add((line, f"uses {name}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and REVISION.fullmatch(node.value):
            found.add((line, f"names the revision {node.value!r}"))
        elif isinstance(node, ast.Compare):
            compared = [name for operand in (node.left, *node.comparators) if (name := _holds_a_version(operand))]
            if compared:
                found.add((line, f"compares {compared[0]}"))
    return sorted(found)


def test_no_module_but_the_era_module_asks_a_protocol_version_anything() -> None:
    offenders = [
        f"{path.relative_to(GATEWAY.parent)}:{line}: {what}"
        for path in sorted(GATEWAY.rglob("*.py"))
        if path != ERA_MODULE
        for line, what in era_rule_breaches(path.read_text())
    ]
    assert offenders == [], "ask gateway.protocol.era (Era.of(version)) instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "modern = version in MODERN_PROTOCOL_VERSIONS",
        "from mcp.types.version import LATEST_HANDSHAKE_VERSION",
        "from mcp.types import version",
        "from mcp_types.version import KNOWN_PROTOCOL_VERSIONS as known",
        "import mcp.types.version",
        "if ctx.protocol_version != other: pass",
        "old = caller_version == latest",
        "newest = version == LATEST_HANDSHAKE",
        "fallback = upstream.protocol_version or '2025-11-25'",
        "Choice = Literal['auto', '2026-07-28']",
        "ok = is_version_at_least(v, minimum)",
    ],
)
def test_the_scan_sees_each_way_of_asking(source: str) -> None:
    assert era_rule_breaches(source), source


@pytest.mark.parametrize(
    "source",
    [
        "modern = Era.of(ctx.protocol_version).modern",
        "stale = self._version != self.catalog.version",
        "unchanged = version == self.version",
        "message = f'cannot be sent to a 2026-07-28 client'",
        "negotiates = spec.protocol == 'auto'",
        "from importlib.metadata import version",
    ],
)
def test_the_scan_lets_the_era_module_be_asked(source: str) -> None:
    assert era_rule_breaches(source) == []


@pytest.mark.parametrize("version", sdk_versions.KNOWN_PROTOCOL_VERSIONS)
def test_each_known_revision_is_of_one_era(version: str) -> None:
    era = Era.of(version)
    assert era.version == version
    assert era.modern == (version in sdk_versions.MODERN_PROTOCOL_VERSIONS)
    assert era.handshake == (version in sdk_versions.HANDSHAKE_PROTOCOL_VERSIONS)
    assert era.modern != era.handshake


@pytest.mark.parametrize("version", [None, "", "1999-01-01", "draft"])
def test_an_unknown_version_is_neither_era(version: str | None) -> None:
    era = Era.of(version)
    assert not era.modern and not era.handshake
    assert era.version == (version or "")


def test_the_protocol_setting_names_each_eras_newest_revision() -> None:
    assert get_args(Protocol) == ("auto", sdk_versions.LATEST_HANDSHAKE_VERSION, sdk_versions.LATEST_MODERN_VERSION)


def test_an_initialize_settles_on_a_handshake_revision() -> None:
    assert handshake_version(OLDEST) == OLDEST
    assert handshake_version(MODERN) == sdk_versions.LATEST_HANDSHAKE_VERSION
    assert handshake_version("draft") == sdk_versions.LATEST_HANDSHAKE_VERSION


@pytest.mark.parametrize(
    ("method", "modern", "legacy"),
    [
        ("tasks/update", True, False),
        ("tasks/result", False, True),
        ("tasks/list", False, True),
        ("tasks/get", True, True),
    ],
)
def test_methods_only_one_era_has(method: str, modern: bool, legacy: bool) -> None:
    assert (Era.of(MODERN).has(method), Era.of(LEGACY).has(method)) == (modern, legacy)


def test_a_missing_resource_is_named_in_each_eras_code() -> None:
    assert (Era.of(MODERN).resource_not_found, Era.of(LEGACY).resource_not_found) == (-32602, -32002)


@pytest.mark.parametrize("method", ["tools/call", "prompts/get", "resources/read", "tools/list", "tasks/get"])
def test_what_the_modern_era_added_is_unknown_to_every_earlier_revision(method: str) -> None:
    assert {"resultType", "ttlMs", "cacheScope"} <= Era.of(LEGACY).unknown_fields(method)
    assert Era.of(LEGACY).later_fields(method) <= Era.of(LEGACY).unknown_fields(method)
    assert Era.of(MODERN).unknown_fields(method) == frozenset()


def test_cache_hints_do_not_reach_an_earlier_revisions_caller() -> None:
    raw = {"content": [], "ttlMs": 5000, "cacheScope": "public", "resultType": "complete"}
    shaped = Era.of(LEGACY).shape(raw, "tools/call", STAMP, labels={"manifold/server": "fx"})
    assert shaped == {"content": [], "_meta": {"manifold/server": "fx"}}


@pytest.mark.parametrize(
    ("given", "sent"), [({}, "complete"), ({"resultType": None}, "complete"), ({"resultType": "task"}, "task")]
)
def test_a_modern_result_type_is_the_results_own_else_complete(given: dict[str, Any], sent: str) -> None:
    assert Era.of(MODERN).shape({"content": [], **given}, "tools/call", STAMP)["resultType"] == sent


def test_the_gateways_own_results_follow_the_same_result_type_rule() -> None:
    assert own_result({"content": [], "resultType": "task"}, MODERN)["resultType"] == "task"
    assert own_result({"content": []}, MODERN)["resultType"] == "complete"
    assert own_result({"content": []}, LEGACY) == {"content": []}


def test_a_result_that_is_not_complete_is_refused_to_an_earlier_revisions_caller() -> None:
    with pytest.raises(MCPError) as refused:
        Era.of(LEGACY).shape({"resultType": "task"}, "tools/call", STAMP, server="fx", subject="fx__slow")
    assert refused.value.error.message == (
        "server 'fx' answered fx__slow with a 'task' result, which a 2025-11-25 client cannot take"
    )


def test_the_identity_stamp_is_the_gateways_in_the_modern_era_and_gone_before() -> None:
    raw = {"content": [], "_meta": {SERVER_INFO_KEY: {"name": "upstream"}, "vendor/x": 1}}
    assert Era.of(MODERN).shape(raw, "tools/call", STAMP)["_meta"] == {"vendor/x": 1, SERVER_INFO_KEY: STAMP}
    assert Era.of(LEGACY).shape(raw, "tools/call", STAMP)["_meta"] == {"vendor/x": 1}


def test_a_result_with_nothing_left_in_meta_has_none() -> None:
    raw = {"tools": [], "_meta": {SERVER_INFO_KEY: {"name": "upstream"}}}
    assert Era.of(LEGACY).shape(raw, "tools/list", STAMP) == {"tools": []}


def test_cache_hints_fill_only_what_a_modern_result_lacks() -> None:
    hint = CacheHint(ttl_ms=0, scope="private")
    shaped = Era.of(MODERN).shape({"tools": [], "ttlMs": 60_000}, "tools/list", STAMP, cache=hint)
    assert (shaped["ttlMs"], shaped["cacheScope"], shaped["resultType"]) == (60_000, "private", "complete")
    assert "ttlMs" not in Era.of(LEGACY).shape({"tools": []}, "tools/list", STAMP, cache=hint)
