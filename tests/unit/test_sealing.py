"""Sealed records: what the store keeps of OAuth tokens opens only with the same key, at the same place."""

from __future__ import annotations

import json

import pytest

from gateway.store.sealing import Sealer, SealError

KEY = "a-key-of-at-least-thirty-two-characters"


def test_sealed_values_open_with_the_same_key_at_the_same_place():
    sealer = Sealer(KEY)
    record = sealer.seal({"refresh_token": "rt-SECRET-1"}, "oauth x")
    assert "rt-SECRET-1" not in json.dumps(record)
    assert Sealer(KEY).open(record, "oauth x") == {"refresh_token": "rt-SECRET-1"}
    assert sealer.seal({"a": 1}, "oauth x")["sealed"] != sealer.seal({"a": 1}, "oauth x")["sealed"], "fresh nonces"


def test_what_does_not_open_says_why():
    record = Sealer(KEY).seal({"refresh_token": "rt"}, "oauth x")
    with pytest.raises(SealError, match="another oauth_key"):
        Sealer(KEY + "!").open(record, "oauth x")
    with pytest.raises(SealError, match="moved from another place"):
        Sealer(KEY).open(record, "oauth y")
    altered = {**record, "sealed": record["sealed"][:-4] + "AAA="}
    with pytest.raises(SealError, match="altered"):
        Sealer(KEY).open(altered, "oauth x")
    with pytest.raises(SealError, match="not a sealed record"):
        Sealer(KEY).open({"refresh_token": "plain"}, "oauth x")
    assert KEY not in repr(Sealer(KEY))
