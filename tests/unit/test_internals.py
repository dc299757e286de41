"""Every private name of another package the gateway uses still exists: an upgrade that removes one fails here,
naming it."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp.client.streamable_http as sdk_http_client
import pytest

from gateway.internals import httpcore, sdk, uvicorn

SYMBOLS: dict[str, Callable[[], Any]] = {**sdk.SYMBOLS, **httpcore.SYMBOLS, **uvicorn.SYMBOLS}


@pytest.mark.parametrize("symbol", sorted(SYMBOLS))
def test_private_name_is_still_there(symbol: str) -> None:
    try:
        SYMBOLS[symbol]()
    except (AttributeError, ImportError, KeyError, TypeError) as e:
        pytest.fail(f"{symbol} is gone or changed in this version of its package ({type(e).__name__}: {e})")


def test_the_sdk_still_words_its_http_stand_ins_as_the_quarantine_expects() -> None:
    source = inspect.getsource(sdk_http_client)
    for text in (sdk.SESSION_TERMINATED, sdk.ERROR_STATUS):
        assert f'"{text}"' in source, f"mcp.client.streamable_http no longer says {text!r}: update channel_error"


def test_no_other_module_touches_a_private_name() -> None:
    root = Path(__file__).resolve().parents[2] / "gateway"
    attributes = "|".join(
        ["_stamp", "_server_instances", "_requests_in_flight", "_idle_timeout", "_captured_signals", "_pool"]
    )
    private = re.compile(
        rf"from (mcp|httpcore2|uvicorn|httpx2)[\w.]*\._\w|from (mcp|httpcore2)\S* import _\w|\.({attributes})\b"
    )
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.parent.name != "internals" and private.search(path.read_text())
    ]
    assert offenders == []
