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


def decode(data: bytes | bytearray) -> Any:
    """Parsed JSON, integers past 64 bits kept exact. Raises `ValueError` for text that is not JSON.

    orjson reads such an integer as a float; a float that large sends the text to the standard
    library instead, which keeps every integer as it was written. Finding one costs a walk over the
    parsed value's containers and numbers (not its bytes: a 1 MiB text is one string).
    """
    value = orjson.loads(data)
    return json.loads(data) if _has_huge_float(value) else value


def messages_in(body: bytes | bytearray) -> list[Any] | None:
    """The messages of a JSON body that holds several, one per line (some servers answer a request with its
    notices and then its answer that way); None for a body that is one JSON value, or is not JSON at all."""
    if b"\n{" not in body:
        return None  # one value: the common case costs one scan, no copy
    try:
        decode(body)
        return None
    except ValueError:
        pass
    return lines_in(body)


def lines_in(body: bytes | bytearray) -> list[Any] | None:
    """The messages of a body of several JSON values, one per line; None when a line is not JSON. For a body that
    did not parse as one value (`messages_in` is the whole test)."""
    try:
        return [decode(line) for line in body.splitlines() if line.strip()]
    except ValueError:
        return None


def _has_huge_float(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not -(2.0**63) < item < 2.0**63:
            return True
    return False


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
