"""Labels from annotations and server options; the published tool's `_meta`."""

import copy
from typing import Any

import pytest

from gateway.catalog.labels import META_PREFIX, Labels, labels_for
from gateway.catalog.merged import publish


def test_no_annotations_leaves_every_hint_unset():
    labels = labels_for(None, trusted=False, gated=None)
    assert labels.read_only is None
    assert labels.idempotent is None
    assert labels.destructive is None
    assert labels.open_world is None


def test_empty_annotations_leave_every_hint_unset():
    labels = labels_for({}, trusted=False, gated=None)
    assert (labels.read_only, labels.idempotent, labels.destructive, labels.open_world) == (
        None,
        None,
        None,
        None,
    )


def test_hints_pass_through_as_given():
    labels = labels_for(
        {"readOnlyHint": False, "idempotentHint": False, "destructiveHint": True, "openWorldHint": False},
        trusted=False,
        gated=None,
    )
    assert labels.read_only is False
    assert labels.idempotent is False
    assert labels.destructive is True
    assert labels.open_world is False


def test_a_hint_not_given_stays_none_not_false():
    labels = labels_for({"destructiveHint": False}, trusted=False, gated=None)
    assert labels.destructive is False
    assert labels.open_world is None
    assert labels.read_only is None


def test_read_only_implies_idempotent():
    assert labels_for({"readOnlyHint": True}, trusted=False, gated=None).idempotent is True


def test_read_only_implies_idempotent_even_if_idempotent_hint_false():
    labels = labels_for({"readOnlyHint": True, "idempotentHint": False}, trusted=False, gated=None)
    assert labels.idempotent is True


@pytest.mark.parametrize("annotations", [None, {}, {"readOnlyHint": False}])
def test_idempotent_stays_none_when_not_given_and_not_read_only(annotations):
    assert labels_for(annotations, trusted=False, gated=None).idempotent is None


def test_idempotent_hint_kept_when_not_read_only():
    assert labels_for({"idempotentHint": True}, trusted=False, gated=None).idempotent is True


@pytest.mark.parametrize(
    ("annotations", "gated"),
    [
        (None, True),
        ({}, True),
        ({"readOnlyHint": False}, True),
        ({"idempotentHint": True}, True),
        ({"readOnlyHint": True}, False),
    ],
)
def test_gated_unless_read_only(annotations, gated):
    assert labels_for(annotations, trusted=False, gated=None).gated is gated


def test_server_gated_true_overrides_read_only():
    assert labels_for({"readOnlyHint": True}, trusted=True, gated=True).gated is True


def test_server_gated_false_overrides_not_read_only():
    assert labels_for({"readOnlyHint": False}, trusted=False, gated=False).gated is False
    assert labels_for(None, trusted=False, gated=False).gated is False


def test_trust_outside_unless_trusted():
    assert labels_for(None, trusted=False, gated=None).trust == "outside"
    assert labels_for(None, trusted=True, gated=None).trust == "trusted"


def test_non_boolean_hint_is_treated_as_not_given():
    labels = labels_for({"readOnlyHint": "yes"}, trusted=False, gated=None)
    assert labels.read_only is None
    assert labels.gated is True


def test_retryable_only_for_read_only_or_idempotent():
    assert labels_for({"readOnlyHint": True}, trusted=False, gated=None).retryable is True
    assert labels_for({"idempotentHint": True}, trusted=False, gated=None).retryable is True
    assert labels_for(None, trusted=False, gated=None).retryable is False
    neither = {"readOnlyHint": False, "idempotentHint": False}
    assert labels_for(neither, trusted=False, gated=None).retryable is False


def test_names_lists_the_labels_that_hold_then_trust():
    labels = Labels(read_only=True, idempotent=True, destructive=None, open_world=False, gated=False, trust="outside")
    assert labels.names() == ["read-only", "idempotent", "outside"]
    gated = labels_for(None, trusted=True, gated=None)
    assert gated.names() == ["gated", "trusted"]


def _full_tool() -> dict[str, Any]:
    return {
        "name": "get.weather",
        "title": "Weather",
        "description": "Weather for a city.",
        "icons": [{"src": "https://example.com/i.png", "mimeType": "image/png"}],
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "outputSchema": {"type": "object", "properties": {"temp": {"type": "number"}}},
        "annotations": {"readOnlyHint": True, "openWorldHint": True, "title": "W"},
        "_meta": {"vendor/key": 1, "other": {"nested": True}},
    }


def test_published_meta_carries_manifold_labels_and_keeps_upstream_keys():
    tool = _full_tool()
    labels = labels_for(tool["annotations"], trusted=False, gated=None)
    out = publish(tool, "w__get_weather", "weather", labels)
    assert out["_meta"] == {
        "vendor/key": 1,
        "other": {"nested": True},
        "manifold/server": "weather",
        "manifold/tool": "get.weather",
        "manifold/trust": "outside",
        "manifold/gated": False,
    }
    assert META_PREFIX == "manifold/"


def test_published_tool_is_verbatim_except_name_and_meta():
    tool = _full_tool()
    before = copy.deepcopy(tool)
    labels = labels_for(tool["annotations"], trusted=True, gated=True)
    out = publish(tool, "w__get_weather", "weather", labels)
    assert out["name"] == "w__get_weather"
    assert {k: v for k, v in out.items() if k not in ("name", "_meta")} == {
        k: v for k, v in before.items() if k not in ("name", "_meta")
    }
    assert set(out) == set(before)
    assert out["_meta"]["manifold/trust"] == "trusted"
    assert out["_meta"]["manifold/gated"] is True
    assert tool == before, "publish must not mutate the upstream's tool"


def test_published_annotations_keep_false_hints_and_add_none():
    annotations = {"readOnlyHint": False}
    tool = {"name": "rm", "inputSchema": {"type": "object"}, "annotations": annotations}
    out = publish(tool, "s__rm", "s", labels_for(annotations, trusted=False, gated=None))
    assert out["annotations"] == {"readOnlyHint": False}
    assert "annotations" in out


def test_published_without_upstream_meta_or_annotations():
    tool = {"name": "t", "inputSchema": {"type": "object"}}
    out = publish(tool, "s__t", "s", labels_for(None, trusted=False, gated=None))
    assert "annotations" not in out
    assert out["_meta"] == {
        "manifold/server": "s",
        "manifold/tool": "t",
        "manifold/trust": "outside",
        "manifold/gated": True,
    }


def test_upstream_cannot_spoof_manifold_meta_keys():
    tool = {
        "name": "t",
        "inputSchema": {"type": "object"},
        "_meta": {"manifold/trust": "trusted", "manifold/gated": False, "manifold/server": "evil"},
    }
    out = publish(tool, "s__t", "s", labels_for(None, trusted=False, gated=None))
    assert out["_meta"]["manifold/trust"] == "outside"
    assert out["_meta"]["manifold/gated"] is True
    assert out["_meta"]["manifold/server"] == "s"
