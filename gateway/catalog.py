"""The merged catalog: every upstream's tools under public names, with labels, in a stable order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.labels import META_PREFIX, Labels, labels_for
from gateway.naming import public_name, with_hash

Json = dict[str, Any]


@dataclass(frozen=True)
class ToolSet:
    """One server's tools after its filters, as wire dicts, with the options that shape them."""

    server: str
    prefix: str
    trusted: bool
    gated: bool | None
    tools: tuple[Json, ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """One catalog tool: where it comes from, its labels and its published wire form."""

    public: str
    server: str
    original: str
    labels: Labels
    tool: Json

    @property
    def input_schema(self) -> Json | None:
        """The tool's input schema, as the upstream gave it."""
        schema = self.tool.get("inputSchema")
        return schema if isinstance(schema, dict) else None


@dataclass(frozen=True)
class Collision:
    """Tools of different origin whose public names met; each now carries a hash suffix."""

    name: str
    origins: tuple[tuple[str, str], ...]


def publish(tool: Json, public: str, server: str, labels: Labels) -> Json:
    """The tool as served downstream: renamed, with `manifold/*` keys added to its `_meta`."""
    meta = tool.get("_meta")
    published = {**tool, "name": public}
    published["_meta"] = {
        **(meta if isinstance(meta, dict) else {}),
        f"{META_PREFIX}server": server,
        f"{META_PREFIX}tool": tool["name"],
        f"{META_PREFIX}trust": labels.trust,
        f"{META_PREFIX}gated": labels.gated,
    }
    return published


def merge(toolsets: Iterable[ToolSet]) -> tuple[dict[str, Entry], list[Collision]]:
    """Merge tool sets into entries keyed by public name (sorted), reporting collisions."""
    claims: dict[str, list[tuple[ToolSet, Json]]] = defaultdict(list)
    for ts in toolsets:
        for tool in ts.tools:
            claims[public_name(ts.prefix, ts.server, tool["name"])].append((ts, tool))
    named: list[tuple[str, ToolSet, Json]] = []
    collisions: list[Collision] = []
    for base, owners in claims.items():
        if len(owners) == 1:
            named.append((base, *owners[0]))
            continue
        owners.sort(key=lambda o: (o[0].server, o[1]["name"]))
        collisions.append(Collision(base, tuple((ts.server, t["name"]) for ts, t in owners)))
        named += [(with_hash(base, ts.server, t["name"]), ts, t) for ts, t in owners]
    entries: dict[str, Entry] = {}
    # Natural names first, so a tool literally named like another's hashed name keeps its own.
    for name, ts, tool in sorted(named, key=lambda n: (n[0] not in claims, n[0], n[1].server, n[2]["name"])):
        final, n = name, 0
        while final in entries:
            n += 1
            final = with_hash(name, ts.server, f"{tool['name']}#{n}")
        if final != name:
            first = entries[name]
            collisions.append(Collision(name, ((first.server, first.original), (ts.server, tool["name"]))))
        labels = labels_for(_annotations(tool), trusted=ts.trusted, gated=ts.gated)
        entries[final] = Entry(final, ts.server, tool["name"], labels, publish(tool, final, ts.server, labels))
    return dict(sorted(entries.items())), sorted(collisions, key=lambda c: c.name)


def _annotations(tool: Json) -> Mapping[str, Any] | None:
    value = tool.get("annotations")
    return value if isinstance(value, dict) else None


@dataclass
class Catalog:
    """The live merged view. `update`/`remove` rebuild it and say whether the listing changed."""

    version: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    listing: list[Json] = field(default_factory=list)
    collisions: list[Collision] = field(default_factory=list)
    _sets: dict[str, ToolSet] = field(default_factory=dict)

    def update(self, toolset: ToolSet) -> bool:
        """Set one server's tools; True when the merged listing changed."""
        self._sets[toolset.server] = toolset
        return self._rebuild()

    def remove(self, server: str) -> bool:
        """Drop one server's tools; True when the merged listing changed."""
        if self._sets.pop(server, None) is None:
            return False
        return self._rebuild()

    def resolve(self, name: str) -> Entry | None:
        """The entry for a public name, or None."""
        return self.entries.get(name)

    def tools_of(self, server: str) -> list[Entry]:
        """The entries that come from one server."""
        return [e for e in self.entries.values() if e.server == server]

    def _rebuild(self) -> bool:
        entries, collisions = merge(self._sets[s] for s in sorted(self._sets))
        listing = [e.tool for e in entries.values()]
        self.collisions = collisions
        if listing == self.listing:
            return False
        self.entries, self.listing = entries, listing
        self.version += 1
        return True
