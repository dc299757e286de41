"""The admin API's pin operations: list pins and their standing, diff one tool, approve tools (each with the
digest reviewed, refused when the definition changed since; or, without digests, as offered when applied)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.catalog.merged import Entry
from gateway.core.registry import Registry
from gateway.policy.pins import ChangedSinceReview, Judged, Pin, given_digest, readable_diff, visible
from gateway.store import StoreError

MAX_BODY = 64 * 1024
APPROVE_BODY = (
    'the body must be {"tools": {tool: the digest reviewed, ...}}, or {"tools": [tool names]} to approve what is '
    "offered when the approval is applied (empty or absent: every held tool)"
)
Handler = Callable[[Request], Awaitable[Response]]


def _pin_body(pin: Pin | None) -> dict[str, Any] | None:
    if pin is None:
        return None
    return {"digest": pin.digest, "how": pin.how, "at": pin.at, "definition": pin.definition}


def standing(registry: Registry, server: str) -> list[dict[str, Any]]:
    """Every tool of a server that is offered or pinned, with how it stands against its pin."""
    mode = registry.upstreams[server].spec.pin_mode
    rows: dict[str, dict[str, Any]] = {}
    for entry in registry.catalog.offered(server):
        judged = registry.pins.judge(entry)
        rows[entry.original] = {
            "server": server,
            "tool": entry.original,
            "public": entry.public,
            "mode": mode,
            "status": judged.status,
            "held": entry.public in registry.catalog.held,
            "offered": judged.offered,
            "pinned": judged.pin.digest if judged.pin is not None else None,
        }
    for pin in registry.pins.pins(server):
        rows.setdefault(
            pin.tool,
            {
                "server": server,
                "tool": pin.tool,
                "public": None,
                "mode": mode,
                "status": "absent",
                "held": False,
                "offered": None,
                "pinned": pin.digest,
            },
        )
    return [rows[name] for name in sorted(rows)]


def _find(registry: Registry, server: str, tool: str) -> Entry | None:
    for entry in registry.catalog.offered(server):
        if tool in (entry.original, entry.public):
            return entry
    return None


class PinRefusal(Exception):
    """A pin request that cannot be carried out: an HTTP status, a message, and any further fields of the answer."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.fields = status, message, fields


def pin_diff(registry: Registry, server: str, tool: str) -> dict[str, Any]:
    """One tool (original or public name) against its pin: both definitions, their digests and a readable diff;
    `PinRefusal(404)` when the server neither offers nor has a pin for it."""
    if server not in registry.upstreams:
        raise PinRefusal(404, f"no server named {server!r}")
    entry = _find(registry, server, tool)
    original = entry.original if entry is not None else tool
    pin = registry.pins.pin_of(server, original)
    if entry is None and pin is None:
        raise PinRefusal(404, f"server {server!r} neither offers nor has a pin for a tool named {tool!r}")
    judged: Judged | None = registry.pins.judge(entry) if entry is not None else None
    offered = visible(entry) if entry is not None else None
    return {
        "server": server,
        "tool": original,
        "public": entry.public if entry is not None else None,
        "status": judged.status if judged is not None else "absent",
        "pinned": _pin_body(pin),
        "offered": {"digest": judged.offered, "definition": offered} if judged is not None else None,
        "diff": readable_diff(pin.definition if pin is not None else None, offered, server, original),
    }


async def approve_tools(
    registry: Registry, server: str, tools: list[str], reviewed: dict[str, str] | None
) -> dict[str, Any]:
    """Approve tools of a server (every held one when `tools` is empty), each bound to the digest reviewed when
    `reviewed` names them; what was approved, or `PinRefusal` (404, 409 with `changed`, 503)."""
    if server not in registry.upstreams:
        raise PinRefusal(404, f"no server named {server!r}")
    try:
        approved = await registry.approve(server, tools, reviewed)
    except KeyError as e:
        raise PinRefusal(404, f"server {server!r} offers no tool named {e.args[0]!r}") from None
    except ChangedSinceReview as e:
        changed = [{"tool": tool, "reviewed": was, "offered": now} for tool, was, now in e.changes]
        raise PinRefusal(409, str(e), changed=changed) from None
    except StoreError as e:
        raise PinRefusal(503, f"the store is unavailable: {e}") from None
    if (audit := registry.metrics.audit) is not None:
        audit.act(
            "pins_approved",
            server=server,
            tools=[pin.tool for pin in approved],
            digests={pin.tool: pin.digest for pin in approved},
            reviewed=reviewed is not None,
        )
    return {
        "server": server,
        "approved": [pin.tool for pin in approved],
        "digests": {pin.tool: pin.digest for pin in approved},
        "reviewed": reviewed is not None,
        "mode": registry.upstreams[server].spec.pin_mode,
    }


def _error(status: int, message: str, **fields: Any) -> JSONResponse:
    return JSONResponse({"error": message, **fields}, status_code=status)


def pin_handlers(registry: Registry) -> dict[str, Handler]:
    """The handlers, by name: `list_pins`, `diff_pin`, `approve_pins` (the caller guards them)."""

    async def list_pins(request: Request) -> Response:
        only = request.query_params.get("server")
        if only is not None and only not in registry.upstreams:
            return _error(404, f"no server named {only!r}")
        servers = [only] if only is not None else sorted(registry.upstreams)
        return JSONResponse({"pins": [row for server in servers for row in standing(registry, server)]})

    async def diff_pin(request: Request) -> Response:
        try:
            return JSONResponse(pin_diff(registry, request.path_params["server"], request.path_params["tool"]))
        except PinRefusal as e:
            return _error(e.status, e.message, **e.fields)

    async def approve_pins(request: Request) -> Response:
        server = request.path_params["server"]
        if server not in registry.upstreams:
            return _error(404, f"no server named {server!r}")
        raw = await request.body()
        if len(raw) > MAX_BODY:
            return _error(413, f"the body is over {MAX_BODY} bytes")
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not valid JSON: {e}")
        tools = body.get("tools", []) if isinstance(body, dict) else None
        reviewed: dict[str, str] | None = None
        if isinstance(tools, dict) and tools and all(isinstance(d, str) for d in tools.values()):
            reviewed = {name: given_digest(value) or "" for name, value in tools.items()}
            if bad := [name for name, value in reviewed.items() if not value]:
                return _error(400, f"not a digest (sha256:<64 hex digits>, as `pins diff` shows it) for {bad[0]!r}")
            tools = list(reviewed)
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            return _error(400, APPROVE_BODY)
        try:
            return JSONResponse(await approve_tools(registry, server, tools, reviewed))
        except PinRefusal as e:
            return _error(e.status, e.message, **e.fields)

    return {"list_pins": list_pins, "diff_pin": diff_pin, "approve_pins": approve_pins}
