"""JSON on the lean paths keeps integers of any size, small texts and large."""

from __future__ import annotations

import pytest

from gateway.protocol.jsonrpc import decode, encode

EDGES = [2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 2**70, -(2**70), 10**30]


@pytest.mark.parametrize("value", EDGES)
def test_integers_of_any_size_round_trip(value: int) -> None:
    small = encode({"value": value})
    assert decode(small) == {"value": value} and type(decode(small)["value"]) is int
    large = encode({"pad": "x" * 10_000, "values": [1.5, value]})
    assert decode(large)["values"] == [1.5, value]


def test_floats_stay_floats() -> None:
    assert decode(b'{"a": 1e300, "b": -2.5}') == {"a": 1e300, "b": -2.5}


def test_not_json_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode(b"{not json")
