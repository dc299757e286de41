"""Public tool names: `{prefix}__{tool}`, sanitised, capped at 64 characters with a stable hash."""

import hashlib

import pytest

from gateway.protocol.naming import MAX_LENGTH, name_hash, public_name, sanitise, with_hash


def _hash8(server: str, tool: str) -> str:
    return hashlib.sha256(f"{server}/{tool}".encode()).hexdigest()[:8]


def test_prefix_and_tool_joined_by_double_underscore():
    assert public_name("time", "time", "get_current_time") == "time__get_current_time"


def test_prefix_is_used_not_the_server_name():
    assert public_name("lin", "linear", "search_issues") == "lin__search_issues"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("get-sum", "get-sum"),
        ("a.b c", "a_b_c"),
        ("get_sum", "get_sum"),
        ("ABC123", "ABC123"),
        ("a/b:c@d", "a_b_c_d"),
        ("café", "caf_"),
        ("tab\there", "tab_here"),
        ("", ""),
    ],
)
def test_sanitise_keeps_only_safe_characters(raw, expected):
    assert sanitise(raw) == expected


def test_both_parts_are_sanitised():
    assert public_name("my.server", "my.server", "a.b c") == "my_server__a_b_c"
    assert public_name("s", "s", "get-sum") == "s__get-sum"


def test_empty_prefix_keeps_the_bare_tool_name():
    assert public_name("", "time", "get_current_time") == "get_current_time"
    assert public_name("", "time", "a.b") == "a_b"


def test_same_tool_under_two_servers_differs_by_prefix():
    a = public_name("alpha", "alpha", "echo")
    b = public_name("beta", "beta", "echo")
    assert a == "alpha__echo"
    assert b == "beta__echo"
    assert a != b


def test_exactly_64_characters_is_kept_as_is():
    tool = "t" * (MAX_LENGTH - len("srv__"))
    name = public_name("srv", "srv", tool)
    assert name == f"srv__{tool}"
    assert len(name) == 64


def test_over_64_characters_is_cut_to_55_plus_hash_of_raw_server_tool():
    server, tool = "server", "x" * 70
    name = public_name("pfx", server, tool)
    base = f"pfx__{tool}"
    assert name == f"{base[:55]}_{_hash8(server, tool)}"
    assert len(name) == 64


def test_hash_uses_the_raw_unsanitised_names():
    server, tool = "my.server", "a.b " + "y" * 70
    name = public_name("my.server", server, tool)
    assert name.endswith("_" + _hash8("my.server", tool))
    assert not name.endswith("_" + _hash8("my_server", sanitise(tool)))
    assert len(name) == 64


def test_long_name_is_stable_across_calls():
    first = public_name("p", "srv", "z" * 100)
    assert all(public_name("p", "srv", "z" * 100) == first for _ in range(5))


def test_long_names_with_same_first_55_characters_differ():
    common = "q" * 80
    a = public_name("p", "srv", common + "_one")
    b = public_name("p", "srv", common + "_two")
    assert a[:56] == b[:56]
    assert a != b
    assert len(a) == len(b) == 64


def test_long_bare_name_is_capped_too():
    tool = "w" * 65
    assert public_name("", "srv", tool) == f"{'w' * 55}_{_hash8('srv', tool)}"


def test_name_hash_and_with_hash():
    assert name_hash("s", "t") == _hash8("s", "t")
    assert with_hash("abc", "s", "t") == f"abc_{_hash8('s', 't')}"
    assert with_hash("b" * 80, "s", "t") == f"{'b' * 55}_{_hash8('s', 't')}"
