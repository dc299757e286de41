"""What each protocol revision has: its era, its methods, the result fields it knows, and its envelope.

The handshake era (2024-11-05 to 2025-11-25) opens a session with `initialize`; the modern era (2026-07-28)
has neither handshake nor session, and carries its envelope in every message's `_meta`. Every question the
gateway asks of a protocol version is answered here, and nowhere else (`tests/unit/test_era_rules.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import mcp.types as types
from mcp import MCPError
from mcp.server.caching import CacheHint
from mcp.types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    KNOWN_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)

from gateway.internals.sdk import later_revision_fields

Json = dict[str, Any]

Protocol = Literal["auto", "2025-11-25", "2026-07-28"]
"""What a server's `protocol` setting may say: negotiate, or the newest revision of one era."""

LATEST_HANDSHAKE = LATEST_HANDSHAKE_VERSION

# The modern envelope: the reserved `_meta` keys, by the SDK's names for them.
RESERVED_META = "io.modelcontextprotocol/"
PROTOCOL_VERSION_KEY = types.PROTOCOL_VERSION_META_KEY
CLIENT_INFO_KEY = types.CLIENT_INFO_META_KEY
CLIENT_CAPABILITIES_KEY = types.CLIENT_CAPABILITIES_META_KEY
LOG_LEVEL_KEY = types.LOG_LEVEL_META_KEY
SERVER_INFO_KEY = types.SERVER_INFO_META_KEY

# Result fields the modern era added: `resultType` to every result (SEP-2322), cache hints to the cacheable
# ones (SEP-2549). No earlier revision has them, on any result.
MODERN_RESULT_FIELDS = frozenset({"resultType", "ttlMs", "cacheScope"})
RESOURCE_NOT_FOUND = -32002  # the handshake era's code; the modern era answers -32602 (SEP-2164)
_MODERN_ONLY_METHODS = frozenset({"tasks/update"})
_HANDSHAKE_ONLY_METHODS = frozenset({"tasks/result", "tasks/list"})


@dataclass(frozen=True, slots=True)
class Era:
    """A protocol revision, by what the gateway asks of it. `Era.of(version)` gives it."""

    version: str
    """The revision ("" when not known)."""
    modern: bool
    """The sessionless era: no handshake, the `_meta` envelope, `subscriptions/listen`, `input_required` rounds."""
    handshake: bool
    """A revision of the handshake era that the SDK negotiates with `initialize`."""

    @staticmethod
    def of(version: str | None) -> Era:
        """The era of `version`. A version the SDK does not know (or None: not known yet) is neither modern nor a
        handshake revision, and is treated as the handshake era wherever the two differ."""
        return _KNOWN.get(version) or Era(version or "", modern=False, handshake=False)

    def has(self, method: str) -> bool:
        """Whether this revision has `method` (of the methods only one era has)."""
        return method not in (_HANDSHAKE_ONLY_METHODS if self.modern else _MODERN_ONLY_METHODS)

    @property
    def resource_not_found(self) -> int:
        """The error code for a resource URI that nothing offers."""
        return types.INVALID_PARAMS if self.modern else RESOURCE_NOT_FOUND

    def later_fields(self, method: str) -> frozenset[str]:
        """The fields of a `method` result that only later revisions define (the SDK's client drops them)."""
        return later_revision_fields(method, self.version) if self.version else frozenset()

    def unknown_fields(self, method: str) -> frozenset[str]:
        """The fields of a `method` result this revision does not know: none in the modern era; before it, those
        later revisions define and those the modern era added to every result."""
        return frozenset() if self.modern else _unknown_fields(method, self.version)

    def with_result_type(self, result: Json) -> Json:
        """`result` with the `resultType` this revision sends: in the modern era "complete" unless the result
        says otherwise; before it, none."""
        if not self.modern or result.get("resultType") is not None:
            return result
        return {**result, "resultType": "complete"}

    def shape(
        self,
        result: Json,
        method: str,
        stamp: Json,
        *,
        labels: Mapping[str, Any] | None = None,
        cache: CacheHint | None = None,
        server: str = "",
        subject: str = "",
    ) -> Json:
        """`result` (a server's answer to `method`, or the gateway's own) as a caller of this revision takes it.

        Its `_meta` gets `labels` and loses any server's identity stamp, which in the modern era `stamp` replaces;
        there it also gets a `resultType` ("complete" unless the result says otherwise) and the `cache` hints it
        lacks. Before the modern era, the fields this revision does not know are dropped, and a result that is
        not complete (it asks for input, or is a task) is refused with an `MCPError` naming `server` and
        `subject` (what it answered; `method` unless given).
        """
        meta = result.get("_meta")
        kept = {k: v for k, v in meta.items() if k != SERVER_INFO_KEY} if isinstance(meta, dict) else {}
        if labels:
            kept.update(labels)
        if self.modern:
            shaped = {**self.with_result_type(result)}
            if cache is not None:
                shaped.setdefault("cacheScope", cache.scope)
                shaped.setdefault("ttlMs", cache.ttl_ms)
            kept[SERVER_INFO_KEY] = stamp
            shaped["_meta"] = kept
            return shaped
        kind = result.get("resultType")
        if kind is not None and kind != "complete":
            raise MCPError(
                types.INTERNAL_ERROR,
                f"server '{server}' answered {subject or method} with a {kind!r} result, which a {self.version} "
                "client cannot take",
            )
        foreign = self.unknown_fields(method)
        shaped = {k: v for k, v in result.items() if k not in foreign}
        if kept:
            shaped["_meta"] = kept
        else:
            shaped.pop("_meta", None)
        return shaped


def handshake_version(requested: str) -> str:
    """The revision an `initialize` asking for `requested` settles on: that one if it is a handshake revision,
    else the newest handshake revision."""
    return requested if Era.of(requested).handshake else LATEST_HANDSHAKE


@cache
def _unknown_fields(method: str, version: str) -> frozenset[str]:
    return later_revision_fields(method, version) | MODERN_RESULT_FIELDS


_KNOWN: dict[str | None, Era] = {
    version: Era(version, modern=version in MODERN_PROTOCOL_VERSIONS, handshake=version in HANDSHAKE_PROTOCOL_VERSIONS)
    for version in KNOWN_PROTOCOL_VERSIONS
}
