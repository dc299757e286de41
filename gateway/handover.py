"""Servers a conversation hands over: its own MCP servers (the ACP `mcpServers` shape), for its view only.

An agent host that received the Agent Client Protocol's `session/new` forwards its `mcpServers` list in
one request, `manifold/servers/add`, on its own conversation (see `gateway.conversations`). Each server
starts for that conversation alone, under its given name as prefix: its tools join that conversation's
view and no other. A token may hand over nothing (`may_add: none`, the default), HTTP servers only
(`http`: they pass the egress checks of runtime servers), or stdio servers too (`stdio`: a program of
the client's choosing runs on the gateway host). Values the client hands over (env, headers) are used,
never logged, stored or shown; `${...}` in them is not filled from the gateway's environment.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.access import MayAdd
from gateway.config import ServerSpec

Json = dict[str, Any]
ALLOWED: dict[MayAdd, frozenset[str]] = {
    "none": frozenset(),
    "http": frozenset({"http", "sse"}),
    "stdio": frozenset({"http", "sse", "stdio"}),
}


class Refused(ValueError):
    """A handed-over server that cannot be started; the message names why (never a secret)."""


def _pairs(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, list) or not all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("value"), str) for p in value
    ):
        raise Refused(f"`{what}` must be a list of {{name, value}} strings")
    return {p["name"]: p["value"] for p in value}


def spec_of(entry: Any, may_add: MayAdd) -> ServerSpec:
    """The server spec of one `mcpServers` entry, if the token may hand it over. Raises `Refused`."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise Refused("each server needs a `name`")
    kind = entry.get("type", "stdio" if "command" in entry else None)
    if kind not in ("stdio", "http", "sse"):
        raise Refused(f"`type` must be http or sse (or give a `command` for stdio), got {str(kind)[:32]!r}")
    if kind not in ALLOWED[may_add]:
        permitted = {"none": "no servers", "http": "HTTP servers only"}.get(may_add, "")
        raise Refused(f"this token may not hand over {kind} servers (may_add: {may_add}: {permitted})")
    fields: Json = {"name": entry["name"], "timeout": 60}
    if kind == "stdio":
        args = entry.get("args", [])
        if not isinstance(entry.get("command"), str) or not isinstance(args, list):
            raise Refused("a stdio server needs a `command` string and `args` list")
        fields.update(command=entry["command"], args=[str(a) for a in args], env=_pairs(entry.get("env"), "env"))
    else:
        if not isinstance(entry.get("url"), str):
            raise Refused(f"an {kind} server needs a `url`")
        fields.update(url=entry["url"], transport=kind, headers=_pairs(entry.get("headers"), "headers"))
    try:
        return ServerSpec.model_validate(fields)
    except ValidationError as e:
        # Only where and what: the pydantic message may quote the value, and values may be secrets.
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['type']}" for err in e.errors())
        raise Refused(f"invalid server: {problems}") from None
