"""Public tool names: `{prefix}__{tool}`, sanitised, at most 64 characters, collisions told apart."""

from __future__ import annotations

import hashlib
import re

MAX_LENGTH = 64
_KEEP = 55
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
SEPARATOR = "__"


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
