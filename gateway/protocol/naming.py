"""Public tool names: `{prefix}__{tool}`, sanitised, at most 64 characters, collisions told apart."""

from __future__ import annotations

import hashlib
import re

MAX_LENGTH = 64
_KEEP = 55
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
SEPARATOR = "__"
RESERVED = "manifold"  # the gateway's own tools are `manifold__*`: no server takes the name or the prefix


def sanitise(part: str) -> str:
    """Replace every character outside `[A-Za-z0-9_-]` with `_`."""
    return _UNSAFE.sub("_", part)


def name_hash(server: str, tool: str) -> str:
    """Eight hex digits of a stable hash of the raw `server/tool`."""
    return hashlib.sha256(f"{server}/{tool}".encode()).hexdigest()[:8]


def with_hash(base: str, server: str, tool: str) -> str:
    """`base` cut to 55 characters, then `_` and the hash: unique per raw `server/tool`."""
    return f"{base[:_KEEP]}_{name_hash(server, tool)}"


def public_name(prefix: str, server: str, tool: str) -> str:
    """The public name of `tool` of `server` under `prefix` ("" keeps the tool's own name)."""
    base = f"{sanitise(prefix)}{SEPARATOR}{sanitise(tool)}" if prefix else sanitise(tool)
    if len(base) > MAX_LENGTH or not base:
        return with_hash(base, server, tool)
    return base


def reserved_problem(name: str, prefix: str | None = None) -> str | None:
    """Why a server may not be called `name` (with `prefix`, when it sets one), or None: `manifold`, in any case,
    is the gateway's own."""
    for what, value in (("name", name), ("prefix", prefix)):
        if value is not None and sanitise(value).lower() == RESERVED:
            own = f"{RESERVED}{SEPARATOR}*"
            return f"the {what} {value!r} is reserved for the gateway's own tools ({own}); choose another {what}"
    return None


def in_reserved_namespace(public: str) -> bool:
    """Whether a public name would pass for one of the gateway's own (`manifold__*`, in any case)."""
    return public.lower().startswith(RESERVED + SEPARATOR)
