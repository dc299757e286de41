"""The merged catalog: every upstream's tools and prompts under public names, its resources and templates under
their own URIs, with labels, in a stable order.

Tool and prompt names follow the same rules (prefix, sanitising, 64 characters, collisions told apart by a
hash; a name that would pass for one of the gateway's own, `manifold__*`, is not offered). Resource URIs are
never rewritten: a URI is routed to the first server, in config order, that lists it, then to the first whose
templates match it; a URI or template offered by several servers is logged once as a clash (`clashes`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from gateway.catalog.labels import META_PREFIX, Labels, labels_for
from gateway.protocol.naming import in_reserved_namespace, public_name, with_hash
from gateway.protocol.uritemplate import UriTemplate, overlaps

Json = dict[str, Any]
View = TypeVar("View")
TOUCHED_KEPT = 256  # changes remembered for `changed_since`; a reader further behind reads everything again
RENAMED = "manifold/renamed"  # where an override's new name waits for the naming rules (never published)


@dataclass(frozen=True)
class ToolSet:
    """One server's offer after its filters, as wire dicts, with the options that shape it.

    `rank` is the server's place in the config (servers added at runtime come after): it decides
    which server a URI offered by several goes to.
    """

    server: str
    prefix: str
    trusted: bool
    gated: bool | None
    tools: tuple[Json, ...]
    prompts: tuple[Json, ...] = ()
    resources: tuple[Json, ...] = ()
    templates: tuple[Json, ...] = ()
    rank: int = 0
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Entry:
    """One catalog tool: where it comes from, its labels and its published wire form."""

    public: str
    server: str
    original: str
    labels: Labels
    tool: Json
    base: str = ""  # the public name before a collision added its hash ("" when the same as `public`)

    @property
    def input_schema(self) -> Json | None:
        """The tool's input schema, as the upstream gave it."""
        schema = self.tool.get("inputSchema")
        return schema if isinstance(schema, dict) else None


@dataclass(frozen=True)
class Collision:
    """Tools of different origin whose public names met; each now carries a hash suffix. `reserved`: the one
    origin's name would pass for one of the gateway's own (`manifold__*`), so it is not offered at all."""

    name: str
    origins: tuple[tuple[str, str], ...]
    reserved: bool = False


@dataclass(frozen=True, slots=True)
class Located:
    """A resource or resource template of one server, as served downstream (URI unchanged, labelled)."""

    server: str
    rank: int
    item: Json
    template: UriTemplate | None = None


def publish(tool: Json, public: str, server: str, labels: Labels, kind: str = "tools") -> Json:
    """The tool (or prompt) as served downstream: renamed, with `manifold/*` keys added to its `_meta`."""
    meta = tool.get("_meta")
    published = {k: v for k, v in tool.items() if k != RENAMED}
    published["name"] = public
    labelled = {
        **(meta if isinstance(meta, dict) else {}),
        f"{META_PREFIX}server": server,
        f"{META_PREFIX}{kind[:-1]}": tool["name"],
        f"{META_PREFIX}trust": labels.trust,
    }
    if kind == "tools":
        labelled[f"{META_PREFIX}gated"] = labels.gated
    published["_meta"] = labelled
    return published


def overridden(tool: Json, override: Mapping[str, Any] | None) -> Json:
    """A tool as the operator re-described it; the public name is built from `name`, calls keep the original."""
    if not override:
        return tool
    changed = {**tool}
    for key in ("title", "description"):
        if override.get(key) is not None:
            changed[key] = override[key]
    if override.get("annotations") is not None:
        base = tool.get("annotations")
        changed["annotations"] = {**(base if isinstance(base, dict) else {}), **override["annotations"]}
    if override.get("name"):
        changed[RENAMED] = override["name"]
    return changed


def label(item: Json, server: str, trusted: bool) -> Json:
    """A resource or template with the `manifold/*` server and trust keys in its `_meta`."""
    meta = item.get("_meta")
    return {
        **item,
        "_meta": {
            **(meta if isinstance(meta, dict) else {}),
            f"{META_PREFIX}server": server,
            f"{META_PREFIX}trust": "trusted" if trusted else "outside",
        },
    }


Named = tuple[str, ToolSet, Json]  # a public name (before any second hash), the server's set, its tool


def claims(ts: ToolSet, kind: str) -> list[tuple[str, Json]]:
    """The public names a server's tools (or prompts) claim before collisions are told apart, with each tool as
    served (after the operator's override)."""
    claimed = []
    for offered in getattr(ts, kind):
        tool = overridden(offered, ts.overrides.get(offered["name"])) if kind == "tools" else offered
        claimed.append((public_name(ts.prefix, ts.server, str(tool.get(RENAMED, tool["name"]))), tool))
    return claimed


def name_group(base: str, owners: list[tuple[ToolSet, Json]]) -> tuple[list[Named], list[Collision]]:
    """The names the tools claiming one public name get: the name itself for a single claim, a hash suffix each
    when several servers' tools meet, none at all in the gateway's own namespace."""
    owners = sorted(owners, key=lambda o: (o[0].server, o[1]["name"]))
    if in_reserved_namespace(base):
        return [], [Collision(base, ((ts.server, t["name"]),), reserved=True) for ts, t in owners]
    if len(owners) == 1:
        return [(base, *owners[0])], []
    collision = Collision(base, tuple((ts.server, t["name"]) for ts, t in owners))
    return [(with_hash(base, ts.server, t["name"]), ts, t) for ts, t in owners], [collision]


def entry_for(name: str, claimed: str, ts: ToolSet, tool: Json, kind: str) -> Entry:
    """A catalog entry: the tool (or prompt) that claimed the public name `claimed`, labelled and published
    under its final name."""
    if kind == "tools":
        labels = labels_for(_annotations(tool), trusted=ts.trusted, gated=ts.gated)
    else:
        labels = labels_for({"readOnlyHint": True}, trusted=ts.trusted, gated=False)
    return Entry(
        name,
        ts.server,
        tool["name"],
        labels,
        publish(tool, name, ts.server, labels, kind),
        "" if claimed == name else claimed,
    )


class Names:
    """One kind's merged names (tools or prompts), kept up to date one server at a time.

    The names are always what merging every server's offer at once gives (`rebuild`). `replace` recomputes only
    the public names the changed server claims or claimed; when one of those names meets a name outside them
    (a hash suffix equal to another tool's name: rare), it falls back to the whole merge.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.entries: dict[str, Entry] = {}  # final name -> entry, unordered
        self._claims: dict[str, list[tuple[ToolSet, Json]]] = {}  # claimed name -> its claims
        self._claimed: dict[str, set[str]] = {}  # server -> the names it claims
        self._finals: dict[str, list[str]] = {}  # claimed name -> the final names given to its claims
        self._collisions: dict[str, list[Collision]] = {}  # claimed name -> its collisions
        self._second: list[Collision] = []  # hashed names that met another name and were hashed again
        self.by_server: dict[str, set[str]] = defaultdict(set)  # server -> its final names

    @property
    def collisions(self) -> list[Collision]:
        """Every collision, sorted by name."""
        found = [c for group in self._collisions.values() for c in group] + self._second
        return sorted(found, key=lambda c: c.name)

    def replace(self, sets: Mapping[str, ToolSet], server: str) -> tuple[dict[str, Entry], dict[str, Entry]]:
        """Take in `server`'s current set in `sets` (or its absence); the entries that went and came, by name."""
        if self._second:
            return self.rebuild(sets)
        new = sets.get(server)
        claimed = claims(new, self.kind) if new is not None else []
        affected = self._claimed.pop(server, set()) | {name for name, _ in claimed}
        for name in affected:
            owners = [o for o in self._claims.get(name, ()) if o[0].server != server]
            if owners:
                self._claims[name] = owners
            else:
                self._claims.pop(name, None)
        if new is not None and claimed:
            for name, tool in claimed:
                self._claims.setdefault(name, []).append((new, tool))
            self._claimed[server] = {name for name, _ in claimed}
        gone = {final: self.entries[final] for name in affected for final in self._finals.pop(name, ())}
        named: list[tuple[str, str, ToolSet, Json]] = []
        for name in affected:
            self._collisions.pop(name, None)
            if name not in self._claims:
                continue
            group, met = name_group(name, self._claims[name])
            named += [(final, name, ts, tool) for final, ts, tool in group]
            if met:
                self._collisions[name] = met
        finals = [final for final, _, _, _ in named]
        if len(set(finals)) != len(finals) or any(f in self.entries and f not in gone for f in finals):
            return self.rebuild(sets)
        for final, entry in gone.items():
            del self.entries[final]
            self.by_server[entry.server].discard(final)
        came = {final: self._add(final, name, ts, tool) for final, name, ts, tool in named}
        return gone, came

    def rebuild(self, sets: Mapping[str, ToolSet]) -> tuple[dict[str, Entry], dict[str, Entry]]:
        """Merge every server's set from scratch; the entries that went and came, by name (all of them)."""
        gone = self.entries
        self.entries, self._claims, self._claimed, self._finals = {}, {}, {}, {}
        self._collisions, self._second, self.by_server = {}, [], defaultdict(set)
        for server in sorted(sets):
            claimed = claims(sets[server], self.kind)
            for name, tool in claimed:
                self._claims.setdefault(name, []).append((sets[server], tool))
            if claimed:
                self._claimed[server] = {name for name, _ in claimed}
        named: list[tuple[str, str, ToolSet, Json]] = []
        for name, owners in self._claims.items():
            group, met = name_group(name, owners)
            named += [(final, name, ts, tool) for final, ts, tool in group]
            if met:
                self._collisions[name] = met
        # Names as claimed first, so a tool literally named like another's hashed name keeps its own.
        named.sort(key=lambda n: (n[0] not in self._claims, n[0], n[2].server, n[3]["name"]))
        for final, name, ts, tool in named:
            given, n = final, 0
            while given in self.entries:
                n += 1
                given = with_hash(final, ts.server, f"{tool['name']}#{n}")
            if given != final:
                first = self.entries[final]
                self._second.append(Collision(final, ((first.server, first.original), (ts.server, tool["name"]))))
            self._add(given, name, ts, tool)
        return gone, self.entries

    def _add(self, final: str, name: str, ts: ToolSet, tool: Json) -> Entry:
        entry = entry_for(final, name, ts, tool, self.kind)
        self.entries[final] = entry
        self.by_server[ts.server].add(final)
        self._finals.setdefault(name, []).append(final)
        return entry


def merge(toolsets: Iterable[ToolSet], kind: str = "tools") -> tuple[dict[str, Entry], list[Collision]]:
    """Merge the tools (or, with `kind="prompts"`, the prompts) of several servers into entries keyed by public
    name (sorted), reporting collisions."""
    names = Names(kind)
    names.rebuild({ts.server: ts for ts in toolsets})
    return dict(sorted(names.entries.items())), names.collisions


def _annotations(tool: Json) -> Mapping[str, Any] | None:
    value = tool.get("annotations")
    return value if isinstance(value, dict) else None


class Catalog:
    """The live merged view. `update`/`remove` take in one server's change and say whether the listing changed.

    A change costs what the changed server offers, not what the whole catalog holds: only the names it claims or
    claimed are merged again (see `Names`), and only those tools are judged by `holds` (the pins), which keeps
    the tools it holds back in `held`, out of `entries` and the listing. The sorted views are built when read.
    """

    def __init__(self, holds: Callable[[Entry], bool] | None = None) -> None:
        self.holds = holds
        self.version = 0
        self.resources: list[Located] = []
        self.templates: list[Located] = []
        self.clashes: list[str] = []
        self._sets: dict[str, ToolSet] = {}
        self._tools = Names("tools")
        self._prompts = Names("prompts")
        self._held: set[str] = set()
        self._views: dict[str, Any] = {}  # the sorted views, until the next change
        self._touched: deque[tuple[int, frozenset[str]]] = deque(maxlen=TOUCHED_KEPT)  # version -> names it moved

    @property
    def entries(self) -> dict[str, Entry]:
        """The served tools by public name, sorted."""
        return self._view(
            "entries", lambda: {n: e for n, e in sorted(self._tools.entries.items()) if n not in self._held}
        )

    @property
    def listing(self) -> list[Json]:
        """The served tools as published, sorted by name."""
        return self._view("listing", lambda: [e.tool for e in self.entries.values()])

    @property
    def held(self) -> dict[str, Entry]:
        """The tools the pins hold back, by public name, sorted."""
        return self._view("held", lambda: {n: self._tools.entries[n] for n in sorted(self._held)})

    @property
    def prompts(self) -> dict[str, Entry]:
        """The served prompts by public name, sorted."""
        return self._view("prompts", lambda: dict(sorted(self._prompts.entries.items())))

    @property
    def collisions(self) -> list[Collision]:
        """Every collision of tool or prompt names, sorted by name."""
        return self._view(
            "collisions", lambda: sorted(self._tools.collisions + self._prompts.collisions, key=lambda c: c.name)
        )

    @property
    def served(self) -> int:
        """How many tools are served (not held)."""
        return len(self._tools.entries) - len(self._held)

    def changed_since(self, version: int) -> frozenset[str] | None:
        """The public names whose tool came, went, changed or was held or released after `version`; None when
        that is no longer known (too many changes since): then anything may have."""
        if version == self.version:
            return frozenset()
        if not self._touched or self._touched[0][0] > version + 1:
            return None
        return frozenset().union(*(names for v, names in self._touched if v > version))

    def update(self, toolset: ToolSet) -> bool:
        """Set one server's tools; True when the merged listing changed."""
        before = self._sets.get(toolset.server)
        self._sets[toolset.server] = toolset
        return self._take(toolset.server, before, toolset)

    def remove(self, server: str) -> bool:
        """Drop one server's tools; True when the merged listing changed."""
        before = self._sets.pop(server, None)
        if before is None:
            return False
        return self._take(server, before, None)

    def refresh(self, servers: Iterable[str] | None = None) -> bool:
        """Judge the tools of `servers` (default: every tool) again, after the pins changed; True when the
        merged listing changed."""
        if servers is None:
            names: Iterable[str] = list(self._tools.entries)
        else:
            names = [n for s in servers for n in self._tools.by_server.get(s, ())]
        moved = frozenset(name for name in names if self._judge(self._tools.entries[name]))
        if moved:
            self._changed(moved)
        return bool(moved)

    def offered(self, server: str) -> list[Entry]:
        """Every tool a server offers, held or not, sorted by public name."""
        return [self._tools.entries[n] for n in sorted(self._tools.by_server.get(server, ()))]

    def tools_of(self, server: str) -> list[Entry]:
        """The served tools of one server, sorted by public name."""
        return [e for e in self.offered(server) if e.public not in self._held]

    def held_of(self, server: str) -> int:
        """How many of a server's tools are held back."""
        return sum(1 for n in self._tools.by_server.get(server, ()) if n in self._held)

    def resolve(self, name: str) -> Entry | None:
        """The served entry for a public name, or None."""
        return None if name in self._held else self._tools.entries.get(name)

    def resolve_prompt(self, name: str) -> Entry | None:
        """The prompt entry for a public name, or None."""
        return self._prompts.entries.get(name)

    def route_uri(self, uri: str, sees: Callable[[str], bool]) -> str | None:
        """The server a URI is read from, among the servers `sees` allows: the first (config order) that lists
        it, else the first whose templates match it; None when none does."""
        for located in self.resources:
            if located.item["uri"] == uri and sees(located.server):
                return located.server
        for located in self.templates:
            if located.template is not None and sees(located.server) and located.template.match(uri) is not None:
                return located.server
        return None

    def route_template(self, template: str, sees: Callable[[str], bool]) -> str | None:
        """The server that offers a resource template (by its text), for completions."""
        for located in self.templates:
            if located.item["uriTemplate"] == template and sees(located.server):
                return located.server
        return None

    def _take(self, server: str, before: ToolSet | None, after: ToolSet | None) -> bool:
        gone, came = self._tools.replace(self._sets, server)
        served_before = {n: e.tool for n, e in gone.items() if n not in self._held}
        self._held.difference_update(gone)
        for entry in came.values():
            self._judge(entry)
        served_after = {n: e.tool for n, e in came.items() if n not in self._held}
        changed = served_before != served_after
        prompts_gone, prompts_came = self._prompts.replace(self._sets, server)
        changed |= {n: e.tool for n, e in prompts_gone.items()} != {n: e.tool for n, e in prompts_came.items()}
        if any(ts is not None and (ts.resources or ts.templates) for ts in (before, after)):
            resources, templates, self.clashes = _locate(self._sets.values())
            changed |= (resources, templates) != (self.resources, self.templates)
            self.resources, self.templates = resources, templates
        if changed:
            self._changed(frozenset(gone) | frozenset(came))
        else:
            self._views.clear()  # names, holds or collisions may have moved even when the listing did not
        return changed

    def _judge(self, entry: Entry) -> bool:
        """Hold or serve one tool as the pins say; True when that changed."""
        held = self.holds is not None and self.holds(entry)
        if held == (entry.public in self._held):
            return False
        if held:
            self._held.add(entry.public)
        else:
            self._held.discard(entry.public)
        return True

    def _changed(self, touched: frozenset[str]) -> None:
        self._views.clear()
        self.version += 1
        self._touched.append((self.version, touched))

    def _view(self, key: str, build: Callable[[], View]) -> View:
        if key not in self._views:
            self._views[key] = build()
        return cast(View, self._views[key])


def _locate(sets: Iterable[ToolSet]) -> tuple[list[Located], list[Located], list[str]]:
    """Every server's resources and templates in routing order (config rank, then as listed), and the clashes."""
    ranked = sorted(sets, key=lambda ts: (ts.rank, ts.server))
    resources: list[Located] = []
    templates: list[Located] = []
    owner: dict[str, str] = {}
    clashes: list[str] = []
    for ts in ranked:
        for item in ts.resources:
            uri = item["uri"]
            if owner.setdefault(uri, ts.server) != ts.server:
                clashes.append(f"resource {uri!r} of '{ts.server}' is also offered by '{owner[uri]}', which wins")
            resources.append(Located(ts.server, ts.rank, label(item, ts.server, ts.trusted)))
        for item in ts.templates:
            try:
                parsed = UriTemplate.parse(item["uriTemplate"])
            except ValueError as e:
                clashes.append(f"template {item['uriTemplate']!r} of '{ts.server}' cannot route reads: {e}")
                parsed = None
            text = item["uriTemplate"]
            for other in templates:
                known = other.template
                if other.server != ts.server and known is not None and parsed is not None and overlaps(known, parsed):
                    clashes.append(
                        f"template {text!r} of '{ts.server}' overlaps {other.item['uriTemplate']!r} of "
                        f"'{other.server}', which wins"
                    )
                    break
            templates.append(Located(ts.server, ts.rank, label(item, ts.server, ts.trusted), parsed))
    return resources, templates, clashes
