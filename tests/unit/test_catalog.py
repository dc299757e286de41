"""The merged catalog: public names, collisions kept apart, sorted order, change detection."""

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.catalog.merged import Catalog, Collision, Entry, ToolSet, merge


def _h(server: str, tool: str) -> str:
    return hashlib.sha256(f"{server}/{tool}".encode()).hexdigest()[:8]


def _tool(name: str, **extra) -> dict:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


def _set(server: str, *names: str, prefix: str | None = None, trusted=False, gated=None) -> ToolSet:
    return ToolSet(
        server=server,
        prefix=server if prefix is None else prefix,
        trusted=trusted,
        gated=gated,
        tools=tuple(_tool(n) for n in names),
    )


def test_merge_prefixes_and_sorts():
    entries, collisions = merge([_set("zeta", "b", "a"), _set("alpha", "z")])
    assert list(entries) == ["alpha__z", "zeta__a", "zeta__b"]
    assert collisions == []
    entry = entries["zeta__a"]
    assert (entry.public, entry.server, entry.original) == ("zeta__a", "zeta", "a")
    assert entry.tool["name"] == "zeta__a"
    assert entry.tool["_meta"]["manifold/tool"] == "a"


def test_same_tool_under_two_servers_is_no_collision():
    entries, collisions = merge([_set("one", "echo"), _set("two", "echo")])
    assert list(entries) == ["one__echo", "two__echo"]
    assert collisions == []


def test_tools_that_sanitise_alike_are_both_kept_with_hash_suffixes():
    entries, collisions = merge([_set("s", "a.b", "a_b")])
    dot, under = f"s__a_b_{_h('s', 'a.b')}", f"s__a_b_{_h('s', 'a_b')}"
    assert list(entries) == sorted([dot, under])
    assert entries[dot].original == "a.b"
    assert entries[under].original == "a_b"
    assert entries[dot].tool["name"] == dot
    assert collisions == [Collision("s__a_b", (("s", "a.b"), ("s", "a_b")))]


def test_bare_prefix_servers_with_the_same_tool_are_both_kept():
    entries, collisions = merge([_set("x", "echo", prefix=""), _set("y", "echo", prefix="")])
    assert set(entries) == {f"echo_{_h('x', 'echo')}", f"echo_{_h('y', 'echo')}"}
    assert {e.server for e in entries.values()} == {"x", "y"}
    assert collisions == [Collision("echo", (("x", "echo"), ("y", "echo")))]


def test_bare_tool_colliding_with_a_prefixed_one():
    entries, collisions = merge([_set("a", "t"), _set("bare", "a__t", prefix="")])
    assert set(entries) == {f"a__t_{_h('a', 't')}", f"a__t_{_h('bare', 'a__t')}"}
    assert collisions == [Collision("a__t", (("a", "t"), ("bare", "a__t")))]


def test_a_bare_tool_named_like_the_gateways_own_is_not_offered():
    posing = ("manifold__call_tool", "Manifold__search_tools", "manifold.__x")
    entries, collisions = merge([_set("bare", *posing, "keep", prefix=""), _set("manifold_ok", "t")])
    assert list(entries) == ["keep", "manifold_ok__t"]
    assert sorted(c.name for c in collisions) == ["Manifold__search_tools", "manifold___x", "manifold__call_tool"]
    assert all(c.reserved and c.origins[0][0] == "bare" for c in collisions)
    renamed = ToolSet("bare", "", False, None, (_tool("t"),), overrides={"t": {"name": "manifold__t"}})
    assert merge([renamed]) == ({}, [Collision("manifold__t", (("bare", "t"),), reserved=True)])


def test_long_names_that_sanitise_alike_are_told_apart_by_their_own_hash():
    dot, under = "a.b" + "c" * 70, "a_b" + "c" * 70
    entries, collisions = merge([_set("s", dot, under)])
    base = ("s__a_b" + "c" * 70)[:55]
    assert set(entries) == {f"{base}_{_h('s', dot)}", f"{base}_{_h('s', under)}"}
    assert all(len(name) == 64 for name in entries)
    assert collisions == []  # each long name already carries its own hash


def test_merge_order_independent_of_input_order():
    sets = [_set("b", "y", "x"), _set("a", "q.r", "q_r"), _set("c", "echo", prefix=""), _set("d", "echo", prefix="")]
    forward = merge(sets)
    backward = merge(list(reversed([ToolSet(s.server, s.prefix, s.trusted, s.gated, s.tools[::-1]) for s in sets])))
    assert list(forward[0]) == list(backward[0])
    assert list(forward[0]) == sorted(forward[0])
    assert [e.tool for e in forward[0].values()] == [e.tool for e in backward[0].values()]
    assert forward[1] == backward[1]
    assert [c.name for c in forward[1]] == sorted(c.name for c in forward[1])


def test_entry_labels_follow_server_options():
    ts = ToolSet(
        server="s",
        prefix="s",
        trusted=True,
        gated=None,
        tools=(_tool("read", annotations={"readOnlyHint": True}), _tool("write")),
    )
    entries, _ = merge([ts])
    assert entries["s__read"].labels.gated is False
    assert entries["s__read"].labels.trust == "trusted"
    assert entries["s__write"].labels.gated is True
    assert entries["s__write"].tool["_meta"]["manifold/gated"] is True


def test_entry_input_schema():
    entries, _ = merge([_set("s", "t")])
    assert entries["s__t"].input_schema == {"type": "object"}
    ts = ToolSet("s", "s", False, None, ({"name": "u"},))
    assert merge([ts])[0]["s__u"].input_schema is None


def test_update_reports_change_only_when_listing_changes():
    catalog = Catalog()
    assert catalog.version == 0
    assert catalog.update(_set("s", "a", "b")) is True
    assert catalog.version == 1
    assert [t["name"] for t in catalog.listing] == ["s__a", "s__b"]
    assert catalog.update(_set("s", "b", "a")) is False
    assert catalog.update(_set("s", "a", "b")) is False
    assert catalog.version == 1
    assert catalog.update(_set("s", "a", "b", "c")) is True
    assert catalog.version == 2


def test_update_with_changed_trust_is_a_change():
    catalog = Catalog()
    catalog.update(_set("s", "a"))
    assert catalog.update(_set("s", "a", trusted=True)) is True
    assert catalog.listing[0]["_meta"]["manifold/trust"] == "trusted"


def test_update_of_a_server_with_no_tools_changes_nothing():
    catalog = Catalog()
    assert catalog.update(_set("empty")) is False
    assert catalog.version == 0


def test_remove():
    catalog = Catalog()
    catalog.update(_set("a", "x"))
    catalog.update(_set("b", "y"))
    assert catalog.version == 2
    assert catalog.remove("nope") is False
    assert catalog.version == 2
    assert catalog.remove("a") is True
    assert catalog.version == 3
    assert [t["name"] for t in catalog.listing] == ["b__y"]
    assert catalog.resolve("a__x") is None
    assert catalog.remove("a") is False


def test_resolve_and_tools_of():
    catalog = Catalog()
    catalog.update(_set("time", "get_current_time", "convert.time"))
    catalog.update(_set("mem", "read_graph"))
    entry = catalog.resolve("time__convert_time")
    assert isinstance(entry, Entry)
    assert (entry.server, entry.original, entry.public) == ("time", "convert.time", "time__convert_time")
    assert catalog.resolve("convert.time") is None
    assert catalog.resolve("time__nope") is None
    assert [e.public for e in catalog.tools_of("time")] == ["time__convert_time", "time__get_current_time"]
    assert [e.public for e in catalog.tools_of("mem")] == ["mem__read_graph"]
    assert catalog.tools_of("other") == []


def test_listing_is_sorted_across_servers_and_collisions_tracked():
    catalog = Catalog()
    catalog.update(_set("x", "echo", prefix=""))
    assert catalog.collisions == []
    assert catalog.update(_set("y", "echo", prefix="")) is True
    names = [t["name"] for t in catalog.listing]
    assert names == sorted([f"echo_{_h('x', 'echo')}", f"echo_{_h('y', 'echo')}"])
    assert [c.name for c in catalog.collisions] == ["echo"]
    assert catalog.remove("y") is True
    assert [t["name"] for t in catalog.listing] == ["echo"]
    assert catalog.collisions == []


def test_suffixed_name_never_replaces_another_tool():
    third = f"a_b_{_h('s', 'a.b')}"
    entries, _ = merge([_set("s", "a.b", "a_b", third)])
    assert sorted(e.original for e in entries.values()) == ["a.b", "a_b", third]


# A change merges again only the names it touches; after any sequence of changes the catalog must be exactly what
# merging every server at once gives, and `update`/`remove` must say True exactly when the listing changed.
_POOL = ["a.b", "a_b", "echo", "x", f"a_b_{_h('s1', 'a.b')}", f"a_b_{_h('s2', 'a_b')}", "manifold__x", "p__echo"]
_HELD = {"x", "a_b"}


def _holds(entry: Entry) -> bool:
    return entry.server == "s3" and entry.original in _HELD


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2", "s3"]),
            st.sampled_from(["", "p", None]),
            st.lists(st.sampled_from(_POOL), unique=True, max_size=5),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_changes_one_server_at_a_time_give_what_a_whole_merge_gives(steps):
    catalog = Catalog(holds=_holds)
    sets: dict[str, ToolSet] = {}
    for server, prefix, names, remove in steps:
        before = (list(catalog.listing), dict(catalog.prompts))
        version, served_before = catalog.version, {t["name"]: t for t in catalog.listing}
        if remove:
            changed = catalog.remove(server)
            sets.pop(server, None)
        else:
            ts = ToolSet(
                server,
                server if prefix is None else prefix,
                False,
                None,
                tuple(_tool(n) for n in names),
                prompts=tuple({"name": n} for n in names[:2]),
            )
            changed = catalog.update(ts)
            sets[server] = ts
        entries, collisions = merge(sets.values())
        prompts, prompt_collisions = merge(sets.values(), "prompts")
        served = {n: e for n, e in entries.items() if not _holds(e)}
        assert catalog.entries == served
        assert list(catalog.entries) == list(served)
        assert catalog.held == {n: e for n, e in entries.items() if _holds(e)}
        assert catalog.listing == [e.tool for e in served.values()]
        assert catalog.prompts == prompts
        assert catalog.collisions == sorted(collisions + prompt_collisions, key=lambda c: c.name)
        assert catalog.served == len(served)
        assert changed == (before != (catalog.listing, catalog.prompts))
        served_now = {t["name"]: t for t in catalog.listing}
        moved = {n for n in served_before.keys() | served_now.keys() if served_before.get(n) != served_now.get(n)}
        assert moved <= (catalog.changed_since(version) or set()), "a reader in step misses no moved name"
        for server_name in ("s1", "s2", "s3"):
            assert catalog.offered(server_name) == sorted(
                (e for e in entries.values() if e.server == server_name), key=lambda e: e.public
            )


def test_a_change_costs_what_the_changed_server_offers_not_the_whole_catalog():
    # 100 servers of 20 tools arriving one by one: each tool is named, published and judged by the pins once,
    # not once per later arrival (which made 100 workers of 20 tools cost tens of seconds of CPU).
    judged: list[str] = []

    def holds(entry: Entry) -> bool:
        judged.append(entry.public)
        return False

    catalog = Catalog(holds=holds)
    for n in range(100):
        assert catalog.update(_set(f"w{n}", *(f"t{i}" for i in range(20)))) is True
    assert len(judged) == 2000 and len(set(judged)) == 2000
    assert catalog.served == 2000
    judged.clear()
    assert catalog.remove("w50") is True
    assert catalog.update(_set("w7", *(f"t{i}" for i in range(21)))) is True
    assert len(judged) == 21, "only the changed server's tools are judged again"
    assert catalog.refresh(["w8"]) is False
    assert len(judged) == 41, "a refresh for one server's pins judges that server's tools"
    assert len(catalog.listing) == 1981 and catalog.resolve("w50__t0") is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.lists(st.sampled_from(_POOL), unique=True, max_size=5)),
        max_size=10,
    ),
    st.integers(min_value=1, max_value=3),
)
def test_readers_that_follow_changes_see_what_a_full_read_sees(steps, every):
    # The listings behind change notices and the search index read only the names each change moved.
    import anyio

    from gateway.catalog.exposure import Finder
    from gateway.downstream.listing import Listings
    from gateway.policy.access import OPEN_VIEW, View

    catalog = Catalog(holds=_holds)
    views = [OPEN_VIEW, View("narrow", servers=("s1", "s3"), tools=("*echo*", "a_b*"))]
    listings, finder = Listings(catalog), Finder(catalog)
    for n, (server, names) in enumerate(steps):
        if names:
            catalog.update(ToolSet(server, server if n % 2 else "", False, None, tuple(_tool(t) for t in names)))
        else:
            catalog.remove(server)
        if n % every:
            continue  # readers may fall several changes behind
        for view in views:
            assert listings.names(view) == frozenset(t["name"] for t in listings.visible(view))
        anyio.run(finder.sync)
        assert set(finder._indexed) == set(catalog.entries)
        assert all(finder._indexed[name] == e.tool for name, e in catalog.entries.items())
