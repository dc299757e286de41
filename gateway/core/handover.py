"""Servers a conversation hands over: its own MCP servers (the ACP `mcpServers` shape), for its view only.

An agent host that received the Agent Client Protocol's `session/new` forwards its `mcpServers` list in
one request, `manifold/servers/add`, on its own conversation (see `gateway.core.conversations`). Each server
starts for that conversation alone, under its given name as prefix: its tools join that conversation's
view and no other. A token may hand over nothing (`may_add: none`, the default), HTTP servers only
(`http`: they always pass the egress rules, as runtime servers do), or stdio servers too (`stdio`: a
program of the client's choosing runs on the gateway host). Values the client hands over (env, headers)
are used, never logged, stored or shown; `${...}` in them is not filled from the gateway's environment.

Bounds (`handover:` settings): servers per request, per conversation and per token; handed-over servers
also count against `max_conversation_instances`. A server refused (by a bound, the egress rules, its name)
is refused at once, and one that fails to start is reported as soon as its first try fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
from pydantic import ValidationError

from gateway.config.access import MayAdd
from gateway.config.servers import ServerSpec
from gateway.config.settings import HandoverSettings
from gateway.core.conversations import HandedLimits, NameClash
from gateway.observe.logs import get_logger
from gateway.policy.egress import EgressPolicy, check_url
from gateway.protocol.errors import CallFailed, EgressDenied
from gateway.protocol.naming import reserved_problem, sanitise

if TYPE_CHECKING:
    from gateway.core.registry import Registry

log = get_logger("handover")
SOURCES = {"worker": "offered by workers", "runtime": "added at runtime"}

Json = dict[str, Any]
ALLOWED: dict[MayAdd, frozenset[str]] = {
    "none": frozenset(),
    "http": frozenset({"http", "sse"}),
    "stdio": frozenset({"http", "sse", "stdio"}),
}


# A client's program always runs sandboxed (whatever the default), with no network (the egress rules cannot see a
# process's own sockets), and sees no script of the gateway host's that its arguments name.
HANDED_SANDBOX: Json = {"enabled": True, "network": "none", "scripts": False}


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
    if (reserved := reserved_problem(entry["name"])) is not None:
        raise Refused(reserved)
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
        fields["sandbox"] = HANDED_SANDBOX
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


class HandOver:
    """`manifold/servers/add`: checks a request's servers against the token, the bounds, the egress rules and
    the names in use, starts them (together), and reports each one's status."""

    def __init__(self, registry: Registry, egress: EgressPolicy, limits: HandoverSettings) -> None:
        self.registry = registry
        self.egress = egress
        self.limits = limits

    def taken(self, name: str) -> str | None:
        """Why a handed-over server may not take `name`: a server of the gateway's own (from its config, the admin
        API or workers) has it as its name or prefix; None when it is free."""
        prefix = sanitise(name)
        for upstream in self.registry.upstreams.values():
            if name == upstream.name or prefix == upstream.spec.effective_prefix:
                kind = SOURCES.get(upstream.source, "configured")
                return f"the name '{name}' is (or has the prefix of) a server of the gateway's own ({kind})"
        return None

    async def add(self, conversation: str, owner: str, may_add: MayAdd, entries: Any) -> list[Json]:
        """Hand over `entries` (the request's `mcpServers`) for `conversation`, whose caller is `owner` with
        `may_add`; one report per entry, in order. Raises `Refused` for a request that is refused as a whole."""
        if not isinstance(entries, list) or not entries:
            raise Refused("manifold/servers/add needs a non-empty `mcpServers` list")
        if len(entries) > self.limits.max_per_request:
            raise Refused(
                f"manifold/servers/add names {len(entries)} servers; at most {self.limits.max_per_request} are taken "
                "in one request (handover.max_per_request)"
            )
        report: list[Json] = [{} for _ in entries]
        named: set[str] = set()
        async with anyio.create_task_group() as tg:
            for index, entry in enumerate(entries):
                name = entry.get("name") if isinstance(entry, dict) else None
                if isinstance(name, str) and name in named:
                    report[index] = self._failed(name, "the name is given twice in this request")
                    continue
                if isinstance(name, str):
                    named.add(name)
                tg.start_soon(self._one, report, index, entry, conversation, owner, may_add)
        if (audit := self.registry.metrics.audit) is not None:
            for item in report:
                status = item.get("status", "failed")
                outcome = "ok" if status != "failed" else "refused"
                audit.act("handover", who=owner, outcome=outcome, server=item.get("name"), status=status)
        return report

    async def _one(
        self, report: list[Json], index: int, entry: Any, conversation: str, owner: str, may_add: MayAdd
    ) -> None:
        name = entry.get("name") if isinstance(entry, dict) else None
        limits = HandedLimits(self.limits.max_per_conversation, self.limits.max_per_token)
        try:
            spec = spec_of(entry, may_add)
            if (clash := self.taken(spec.name)) is not None:
                raise Refused(clash)
            if spec.url is not None:
                await check_url(spec.url, self.egress)  # refused at once; the connection checks again
            status = await self.registry.conversations.hand_over(
                conversation, owner, spec, self.egress, limits, self.taken
            )
            report[index] = {"name": spec.name, "status": status}
        except EgressDenied as e:
            report[index] = self._failed(name, f"egress check failed: {e}")
        except (Refused, NameClash, CallFailed) as e:
            report[index] = self._failed(name, str(e))

    @staticmethod
    def _failed(name: Any, reason: str) -> Json:
        log.info("handed-over server refused", server=str(name)[:64], reason=reason)
        return {"name": str(name)[:64], "status": "failed", "error": reason}
