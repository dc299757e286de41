"""Prompts and resources in the merged catalog: names, labels, routing of URIs by config order, clashes."""

from gateway.catalog.merged import Catalog, ToolSet, merge


def _set(server: str, rank: int, *, prompts=(), resources=(), templates=(), trusted=False) -> ToolSet:
    return ToolSet(
        server=server,
        prefix=server,
        trusted=trusted,
        gated=None,
        tools=(),
        prompts=tuple({"name": p} for p in prompts),
        resources=tuple({"uri": u, "name": u} for u in resources),
        templates=tuple({"uriTemplate": t, "name": t} for t in templates),
        rank=rank,
    )


def _everyone(server: str) -> bool:
    return True


def test_prompts_take_tool_naming_and_labels():
    entries, collisions = merge([_set("git", 0, prompts=["commit message"])], "prompts")
    assert collisions == []
    [(name, entry)] = entries.items()
    assert name == "git__commit_message"
    assert entry.original == "commit message"
    meta = entry.tool["_meta"]
    assert meta == {"manifold/server": "git", "manifold/prompt": "commit message", "manifold/trust": "outside"}


def test_a_uri_goes_to_the_first_server_in_config_order_and_the_clash_is_reported():
    catalog = Catalog()
    catalog.update(_set("zeta", 0, resources=["file:///shared.txt"]))
    catalog.update(_set("alpha", 1, resources=["file:///shared.txt", "file:///alpha.txt"]))
    assert catalog.route_uri("file:///shared.txt", _everyone) == "zeta"  # config order, not name order
    assert catalog.route_uri("file:///alpha.txt", _everyone) == "alpha"
    assert catalog.clashes == [
        "resource 'file:///shared.txt' of 'alpha' is also offered by 'zeta', which wins",
    ]
    assert catalog.route_uri("file:///shared.txt", lambda s: s == "alpha") == "alpha"  # a view without zeta


def test_exact_uris_win_over_templates_and_templates_route_by_config_order():
    catalog = Catalog()
    catalog.update(_set("docs", 0, templates=["docs://{section}/{page}"]))
    catalog.update(_set("any", 1, resources=["docs://intro/start"], templates=["docs://{+path}"]))
    assert catalog.route_uri("docs://intro/start", _everyone) == "any"  # listed exactly
    assert catalog.route_uri("docs://guide/install", _everyone) == "docs"  # the earlier template
    assert catalog.route_uri("docs://a/b/c", _everyone) == "any"  # only {+path} takes several segments
    assert catalog.route_uri("other://x", _everyone) is None
    assert any("overlaps" in clash and "'docs', which wins" in clash for clash in catalog.clashes)
    assert catalog.route_template("docs://{+path}", _everyone) == "any"


def test_a_template_that_cannot_parse_is_reported_and_never_routes():
    catalog = Catalog()
    catalog.update(_set("bad", 0, templates=["broken://{unclosed"]))
    assert catalog.route_uri("broken://x", _everyone) is None
    assert catalog.clashes and "cannot route reads" in catalog.clashes[0]


def test_resources_and_prompts_changes_bump_the_version():
    catalog = Catalog()
    assert catalog.update(_set("s", 0, prompts=["p"])) is True
    assert catalog.update(_set("s", 0, prompts=["p"])) is False
    assert catalog.update(_set("s", 0, prompts=["p"], resources=["r://1"])) is True
    assert catalog.update(_set("s", 0, prompts=["p"], resources=["r://1"], templates=["r://{id}"])) is True
    assert catalog.resources[0].item["_meta"] == {"manifold/server": "s", "manifold/trust": "outside"}


def test_an_override_renames_and_redescribes_and_calls_keep_the_original():
    tool = {"name": "get_current_time", "description": "Get the time", "annotations": {"readOnlyHint": False}}
    ts = ToolSet(
        "time",
        "time",
        False,
        None,
        (tool, {"name": "convert_time"}),
        overrides={
            "get_current_time": {"name": "now", "description": "The time now", "annotations": {"readOnlyHint": True}}
        },
    )
    entries, _ = merge([ts])
    assert list(entries) == ["time__convert_time", "time__now"]
    now = entries["time__now"]
    assert now.original == "get_current_time"
    assert now.tool["description"] == "The time now"
    assert now.tool["annotations"] == {"readOnlyHint": True}
    assert now.tool["_meta"]["manifold/tool"] == "get_current_time"
    assert now.tool["_meta"]["manifold/trust"] == "outside"  # an override never makes a server trusted
    assert "manifold/renamed" not in now.tool
    assert now.labels.read_only is True and now.labels.gated is False
