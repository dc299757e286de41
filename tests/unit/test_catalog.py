"""The merged catalog: public names, collisions kept apart, sorted order, change detection."""

import hashlib

from gateway.catalog import Catalog, Collision, Entry, ToolSet, merge


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
