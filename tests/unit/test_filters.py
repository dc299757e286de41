"""`only` / `deny` over ORIGINAL tool names: exact or shell glob; deny wins; unmatched `only` reported."""

import pytest

from gateway.catalog.filters import apply_filters

NAMES = ["search_issues", "search_users", "create_issue", "get_time", "get_lime", "alpha", "beta", "gamma"]


def test_none_means_all():
    result = apply_filters(NAMES, None, [])
    assert result.kept == NAMES
    assert result.unmatched_only == []


def test_only_exact():
    assert apply_filters(NAMES, ["create_issue"], []).kept == ["create_issue"]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("search_*", ["search_issues", "search_users"]),
        ("get_?ime", ["get_time", "get_lime"]),
        ("[ab]*", ["alpha", "beta"]),
        ("[!ab]*", ["search_issues", "search_users", "create_issue", "get_time", "get_lime", "gamma"]),
    ],
)
def test_only_glob(pattern, expected):
    assert apply_filters(NAMES, [pattern], []).kept == expected


def test_glob_is_case_sensitive():
    assert apply_filters(["Search_x", "search_y"], ["search_*"], []).kept == ["search_y"]


def test_only_keeps_input_order_with_several_patterns():
    assert apply_filters(NAMES, ["get_time", "search_*"], []).kept == [
        "search_issues",
        "search_users",
        "get_time",
    ]


def test_deny_alone_drops_matches():
    assert apply_filters(NAMES, None, ["get_*", "alpha"]).kept == [
        "search_issues",
        "search_users",
        "create_issue",
        "beta",
        "gamma",
    ]


def test_deny_applied_after_only_and_wins():
    result = apply_filters(NAMES, ["search_*", "create_issue"], ["search_users", "create_*"])
    assert result.kept == ["search_issues"]
    assert result.unmatched_only == []


def test_deny_wins_over_exact_only():
    assert apply_filters(NAMES, ["alpha"], ["alpha"]).kept == []


def test_unmatched_only_entries_are_reported():
    result = apply_filters(NAMES, ["search_*", "creat_issue", "nope_*"], [])
    assert result.kept == ["search_issues", "search_users"]
    assert result.unmatched_only == ["creat_issue", "nope_*"]


def test_only_entry_matched_but_denied_is_not_reported_as_unmatched():
    result = apply_filters(NAMES, ["alpha"], ["alpha"])
    assert result.unmatched_only == []


def test_exact_name_with_glob_characters_matches_itself():
    assert apply_filters(["a[1]", "a1"], ["a[1]"], []).kept == ["a[1]", "a1"]
    assert apply_filters(["what?"], ["what?"], []).kept == ["what?"]


def test_empty_only_keeps_nothing():
    assert apply_filters(NAMES, [], []).kept == []


def test_no_tools_reports_every_only_entry():
    assert apply_filters([], ["a", "b*"], []).unmatched_only == ["a", "b*"]
