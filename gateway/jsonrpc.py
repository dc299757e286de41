"""JSON-RPC on the wire, shared by every lean path: encoding, error bodies, progress params, codes."""

from __future__ import annotations

import json
from typing import Any

import orjson
from mcp.shared.dispatcher import ProgressFnT

Json = dict[str, Any]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800


def encode(value: Any) -> bytes:
    """JSON bytes; orjson, or the standard library for what orjson refuses (integers past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def decode(data: bytes | str) -> Any:
    """Parsed JSON; orjson, or the standard library for what orjson refuses (integers past 64 bits).

    Raises `ValueError` (which `json.JSONDecodeError` and `orjson.JSONDecodeError` both are) for bad JSON.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def error_body(code: int, message: str, request_id: Any = None, data: Any = None) -> Json:
    """A JSON-RPC error response."""
    error: Json = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def report_progress(params: Any, report: ProgressFnT) -> None:
    """Hand a `notifications/progress` params object to `report`, if it carries a numeric progress."""
    if isinstance(params, dict) and isinstance(progress := params.get("progress"), int | float):
        total = params.get("total")
        await report(progress, total if isinstance(total, int | float) else None, params.get("message"))
