"""`tools/list` results: shaped once per (catalog version, protocol version, caller's view), and served from there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.caching import CacheHint

from gateway import SERVER_INFO
from gateway.catalog.exposure import CALL_DEFINITION, SEARCH_DEFINITION
from gateway.catalog.merged import Catalog, Entry
from gateway.policy.access import OPEN_VIEW, View
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import encode

Json = dict[str, Any]
# Per-token views (and live changes) make a listing private and immediately stale.
LISTING_CACHE = CacheHint(ttl_ms=0, scope="private")


class Listings:
    """The listing each view sees, as a result for the SDK's server and as bytes for the shortcut."""

    def __init__(
        self,
        catalog: Catalog,
        deferred: Callable[[View], bool] = lambda _: False,
        always: Callable[[Entry], bool] = lambda _: False,
    ) -> None:
        self.catalog = catalog
        self.deferred = deferred
        self.always = always
        self._version = catalog.version
        self._results: dict[tuple[str, str], Json] = {}
        self._bodies: dict[tuple[str, str], bytes] = {}
        self._names: dict[str, tuple[bool, int, frozenset[str]]] = {}  # view -> (deferred, catalog version, names)

    def visible(self, view: View) -> list[Json]:
        """The published tools this view lists: all it may call, or with deferred exposure the search and call
        tools and the tools marked `always`."""
        if self.deferred(view):
            always = [e.tool for e in self.catalog.entries.values() if self.always(e) and view.allows(e)]
            return [SEARCH_DEFINITION, CALL_DEFINITION, *always]
        if view is OPEN_VIEW:
            return self.catalog.listing
        return [e.tool for e in self.catalog.entries.values() if view.allows(e)]

    def names(self, view: View) -> frozenset[str]:
        """The names this view lists, kept in step with the catalog from the names each change moved (what a
        change notice compares: only the changed server's tools are looked at again)."""
        deferred, version = self.deferred(view), self.catalog.version
        known = self._names.get(view.name)
        touched = self.catalog.changed_since(known[1]) if known is not None and known[0] == deferred else None
        if known is not None and touched is not None:
            lists = (lambda e: self.always(e) and view.allows(e)) if deferred else view.allows
            kept = known[2] - touched
            names = kept | {n for n in touched if (e := self.catalog.resolve(n)) is not None and lists(e)}
        else:
            names = frozenset(t["name"] for t in self.visible(view))
        self._names[view.name] = (deferred, version, names)
        return names

    def result(self, view: View, version: str) -> Json:
        """The handler's result (the SDK adds the 2026 cache hints and identity stamp to it)."""
        key = self._key(view, version)
        result = self._results.get(key)
        if result is None:
            result = self._results[key] = Era.of(version).with_result_type({"tools": self.visible(view)})
        return result

    def body(self, view: View, version: str) -> bytes:
        """The whole result as it goes on the wire, envelope included, serialised once."""
        key = self._key(view, version)
        body = self._bodies.get(key)
        if body is None:
            result = Era.of(version).shape(self.result(view, version), "tools/list", SERVER_INFO, cache=LISTING_CACHE)
            body = self._bodies[key] = encode(result)
        return body

    def _key(self, view: View, version: str) -> tuple[str, str]:
        if self._version != self.catalog.version:  # the catalog changed: every cached listing is stale
            self._version = self.catalog.version
            self._results, self._bodies = {}, {}
        return (version, view.name)


def visible_prompts(catalog: Catalog, view: View) -> list[Json]:
    """The prompts a view sees."""
    return [e.tool for e in catalog.prompts.values() if view.sees(e.server)]


def visible_resources(catalog: Catalog, view: View, kind: str) -> list[Json]:
    """Resources (`kind` "resources") or templates the view sees, one per URI (the one reads go to), in routing
    order."""
    located = catalog.resources if kind == "resources" else catalog.templates
    key = "uri" if kind == "resources" else "uriTemplate"
    seen: set[str] = set()
    items = []
    for entry in located:
        if view.sees(entry.server) and entry.item[key] not in seen:
            seen.add(entry.item[key])
            items.append(entry.item)
    return items
