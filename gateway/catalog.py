"""The merged catalog: every upstream's tools and prompts under public names, its resources and templates under
their own URIs, with labels, in a stable order.

Tool and prompt names follow the same rules (prefix, sanitising, 64 characters, collisions told apart by a
hash; a name that would pass for one of the gateway's own, `manifold__*`, is not offered). Resource URIs are
never rewritten: a URI is routed to the first server, in config order, that lists it, then to the first whose
templates match it; a URI or template offered by several servers is logged once as a clash (`clashes`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.labels import META_PREFIX, Labels, labels_for
from gateway.naming import in_reserved_namespace, public_name, with_hash
from gateway.uritemplate import UriTemplate, overlaps

Json = dict[str, Any]
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


def merge(toolsets: Iterable[ToolSet], kind: str = "tools") -> tuple[dict[str, Entry], list[Collision]]:
    """Merge the tools (or, with `kind="prompts"`, the prompts) of several servers into entries keyed by public
    name (sorted), reporting collisions."""
    claims: dict[str, list[tuple[ToolSet, Json]]] = defaultdict(list)
    for ts in toolsets:
        for offered in getattr(ts, kind):
            tool = overridden(offered, ts.overrides.get(offered["name"])) if kind == "tools" else offered
            claims[public_name(ts.prefix, ts.server, str(tool.get(RENAMED, tool["name"])))].append((ts, tool))
    named: list[tuple[str, ToolSet, Json]] = []
    collisions: list[Collision] = []
    for base, owners in claims.items():
        if in_reserved_namespace(base):
            collisions += [Collision(base, ((ts.server, t["name"]),), reserved=True) for ts, t in owners]
            continue
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
        if kind == "tools":
            labels = labels_for(_annotations(tool), trusted=ts.trusted, gated=ts.gated)
        else:
            labels = labels_for({"readOnlyHint": True}, trusted=ts.trusted, gated=False)
        base = public_name(ts.prefix, ts.server, str(tool.get(RENAMED, tool["name"])))
        published = publish(tool, final, ts.server, labels, kind)
        entries[final] = Entry(final, ts.server, tool["name"], labels, published, "" if base == final else base)
    return dict(sorted(entries.items())), sorted(collisions, key=lambda c: c.name)


def _annotations(tool: Json) -> Mapping[str, Any] | None:
    value = tool.get("annotations")
    return value if isinstance(value, dict) else None


@dataclass
class Catalog:
    """The live merged view. `update`/`remove` rebuild it and say whether the listing changed.

    Tools that `holds` (the pins) holds back are kept in `held`, out of `entries` and the listing.
    """

    version: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    listing: list[Json] = field(default_factory=list)
    collisions: list[Collision] = field(default_factory=list)
    prompts: dict[str, Entry] = field(default_factory=dict)
    resources: list[Located] = field(default_factory=list)
    templates: list[Located] = field(default_factory=list)
    clashes: list[str] = field(default_factory=list)
    held: dict[str, Entry] = field(default_factory=dict)
    holds: Callable[[Entry], bool] | None = None
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

    def refresh(self) -> bool:
        """Judge every tool again (after the pins changed); True when the merged listing changed."""
        return self._rebuild()

    def offered(self, server: str) -> list[Entry]:
        """Every tool a server offers, held or not."""
        return [e for e in (*self.entries.values(), *self.held.values()) if e.server == server]

    def resolve(self, name: str) -> Entry | None:
        """The entry for a public name, or None."""
        return self.entries.get(name)

    def resolve_prompt(self, name: str) -> Entry | None:
        """The prompt entry for a public name, or None."""
        return self.prompts.get(name)

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

    def tools_of(self, server: str) -> list[Entry]:
        """The entries that come from one server."""
        return [e for e in self.entries.values() if e.server == server]

    def _rebuild(self) -> bool:
        sets = [self._sets[s] for s in sorted(self._sets)]
        entries, collisions = merge(sets)
        held = {name: e for name, e in entries.items() if self.holds is not None and self.holds(e)}
        for name in held:
            del entries[name]
        self.held = held
        prompts, prompt_collisions = merge(sets, "prompts")
        listing = [e.tool for e in entries.values()]
        self.collisions = sorted(collisions + prompt_collisions, key=lambda c: c.name)
        resources, templates, clashes = _locate(sets)
        if (
            listing == self.listing
            and prompts == self.prompts
            and (resources, templates)
            == (
                self.resources,
                self.templates,
            )
        ):
            return False
        self.entries, self.listing, self.prompts = entries, listing, prompts
        self.resources, self.templates, self.clashes = resources, templates, clashes
        self.version += 1
        return True


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
