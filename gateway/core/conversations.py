"""Per-conversation upstreams: a server with `isolation: conversation` runs one connection per conversation.

Stateful servers (a browser, a shell, a login) must not be shared between agents. For such a server
each conversation gets its own connection (stdio: its own process; HTTP: its own session), started
on the conversation's first request to it and closed when the conversation ends (its 2025 session is
deleted or expires) or after `idle_timeout` without a request. The server's listing comes from its
shared connection, so listing tools never starts a process per caller.

What a conversation is: a 2025-era client's `Mcp-Session-Id`; for a sessionless 2026-07-28 client,
its token (an OAuth token's rule and subject) plus the id it sends in `_meta["manifold/conversation"]`
(one conversation per token when it sends none).

The servers a conversation hands over (`gateway.core.handover`) run here too, under their own bounds per
conversation and per token, and count against the same gateway-wide limit (`max_total`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from gateway.catalog.merged import Catalog, Entry, Json, ToolSet
from gateway.config.servers import ServerSpec
from gateway.observe.logs import get_logger
from gateway.observe.metrics import Metrics
from gateway.policy.egress import EgressPolicy
from gateway.protocol.errors import CallFailed, State
from gateway.protocol.naming import sanitise
from gateway.upstream.connection import Upstream

log = get_logger("conversations")
CONVERSATION_META = "manifold/conversation"
REAP_EVERY = 0.5
# `${MANIFOLD_CONVERSATION}` in a conversation-isolated server's options names its conversation (a digest: the
# session id itself is a credential), e.g. a per-conversation data file; the shared listing instance sees it unset.
CONVERSATION_VARIABLE = "MANIFOLD_CONVERSATION"
HANDED = "handed:"  # instance keys of servers a conversation handed over


@dataclass(frozen=True)
class HandedLimits:
    """How many handed-over servers one conversation, and one token's conversations together, may run."""

    per_conversation: int
    per_token: int


class NameClash(ValueError):
    """A handed-over server's name (or prefix) is a server of the gateway's own; the message says whose."""


def conversation_key(session_id: str | None, owner: str, meta: Mapping[str, Any] | None) -> str:
    """The conversation a request belongs to: its 2025 session, else its owner (the caller's token, or OAuth
    rule and subject) and the id it sends (if any)."""
    if session_id:
        return f"session:{session_id}"
    given = meta.get(CONVERSATION_META) if meta else None
    if isinstance(given, str) and given:
        return f"token:{owner}:{given[:128]}"
    return f"token:{owner}"


def label(conversation: str) -> str:
    """A stable, secret-free name of a conversation: 16 hex digits of its key's SHA-256."""
    return hashlib.sha256(conversation.encode()).hexdigest()[:16]


@dataclass
class Instance:
    """One conversation's connection to one server."""

    upstream: Upstream
    scope: anyio.CancelScope
    used: float = field(default_factory=time.monotonic)
    busy: int = 0
    owner: str = ""  # who handed the server over (its token, or OAuth rule and subject); "" for the others


class Conversations:
    """Every per-conversation connection, by (server, conversation)."""

    def __init__(self, metrics: Metrics, *, fast: bool = True) -> None:
        self._metrics = metrics
        self._fast = fast
        self._instances: dict[tuple[str, str], Instance] = {}
        self._starting: dict[tuple[str, str], anyio.Event] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._catalogs: dict[str, Catalog] = {}  # a conversation's own servers' tools
        self.alive: Callable[[str], bool] = lambda key: True
        self.max_total = 256  # every server's conversations together

    def count(self, server: str | None = None) -> int:
        """Open instances (of one server, or of all)."""
        return sum(1 for s, _ in self._instances if server is None or s == server)

    async def run(self) -> None:
        """Own the instances' tasks and close idle ones and those of ended conversations; until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                while True:
                    await anyio.sleep(REAP_EVERY)
                    self._reap()
            finally:
                self._tg = None
                for key in list(self._instances):
                    self._close(key, "shutdown")

    def _reap(self) -> None:
        now = time.monotonic()
        for key, instance in list(self._instances.items()):
            if not self.alive(key[1]):
                self._close(key, "session_end")
            elif key in self._starting:
                continue  # idle only from its first use on: a slow start is no idleness
            elif not instance.busy and now - instance.used > instance.upstream.spec.idle_timeout:
                self._close(key, "idle")

    def end(self, conversation: str) -> None:
        """The conversation ended: close every connection it had."""
        for key in [k for k in self._instances if k[1] == conversation]:
            self._close(key, "session_end")

    def forget(self, server: str) -> None:
        """The server was removed or restarted: close its instances."""
        for key in [k for k in self._instances if k[0] == server]:
            self._close(key, "server_gone")

    def _close(self, key: tuple[str, str], reason: str) -> None:
        instance = self._instances.pop(key, None)
        if instance is None:
            return
        instance.scope.cancel()
        if key[0].startswith(HANDED):
            self._retable(key[1], instance.upstream.name, ())
            log.info("handed-over server stopped", reason=reason)
            return
        self._metrics.count_instance_stop(key[0], reason)
        self._metrics.set_instances(key[0], self.count(key[0]))
        log.info("conversation instance stopped", server=key[0], reason=reason)

    @asynccontextmanager
    async def using(self, shared: Upstream, conversation: str) -> AsyncIterator[Upstream]:
        """The conversation's own connection to `shared`'s server for the block (it is not reaped meanwhile)."""
        instance = await self._instance(shared, conversation)
        instance.busy += 1
        try:
            yield instance.upstream
        finally:
            instance.busy -= 1
            instance.used = time.monotonic()

    async def _instance(self, shared: Upstream, conversation: str) -> Instance:
        """The conversation's own connection to `shared`'s server, started (and waited for) on first use.

        Raises `CallFailed`: busy at `max_instances`, unavailable when it does not come up in time.
        """
        spec = shared.spec
        key = (spec.name, conversation)
        while (starting := self._starting.get(key)) is not None:
            await starting.wait()
        instance = self._instances.get(key)
        if instance is not None and instance.upstream.state is State.UP:
            instance.used = time.monotonic()
            return instance
        if instance is not None:
            self._close(key, "failed")
        if self.count(spec.name) >= spec.max_instances:
            raise CallFailed(
                f"server '{spec.name}' is busy: it runs its limit of {spec.max_instances} conversations "
                "(max_instances); try again when one ends",
                outcome="busy",
                transient=False,
            )
        if len(self._instances) >= self.max_total:
            raise CallFailed(
                f"server '{spec.name}' is busy: the gateway runs its limit of {self.max_total} conversation "
                "connections over all servers (max_conversation_instances); try again when one ends",
                outcome="busy",
                transient=False,
            )
        if self._tg is None:
            raise CallFailed(
                f"server '{spec.name}' is unavailable: the gateway is stopping", outcome="unavailable", transient=False
            )
        self._starting[key] = started = anyio.Event()
        try:
            upstream = shared.sibling(spec, {CONVERSATION_VARIABLE: label(conversation)})
            scope = anyio.CancelScope()
            instance = self._instances[key] = Instance(upstream, scope)
            self._tg.start_soon(self._own, upstream, scope)
            self._metrics.count_instance_start(spec.name)
            self._metrics.set_instances(spec.name, self.count(spec.name))
            log.info("conversation instance started", server=spec.name)
            if not await upstream.wait_up(spec.startup_timeout):
                self._close(key, "failed")
                raise CallFailed(
                    f"server '{spec.name}' is unavailable: its instance for this conversation did not start "
                    f"({upstream.error or 'no answer within startup_timeout'})",
                    outcome="unavailable",
                    transient=False,
                )
            instance.used = time.monotonic()
            return instance
        finally:
            del self._starting[key]
            started.set()

    # --- servers a conversation hands over ---------------------------------------------------------

    def has_handed(self, conversation: str | None) -> bool:
        """Whether the conversation has servers of its own."""
        return conversation is not None and conversation in self._catalogs

    def resolve(self, conversation: str | None, name: str) -> Entry | None:
        """A tool of the conversation's own servers, by public name."""
        catalog = self._catalogs.get(conversation) if conversation is not None else None
        return catalog.resolve(name) if catalog is not None else None

    def listing(self, conversation: str | None) -> list[Json]:
        """The published tools of the conversation's own servers."""
        catalog = self._catalogs.get(conversation) if conversation is not None else None
        return catalog.listing if catalog is not None else []

    def handed(self, conversation: str | None, server: str) -> Upstream | None:
        """The connection of one of the conversation's own servers."""
        if conversation is None:
            return None
        instance = self._instances.get((HANDED + server, conversation))
        if instance is None:
            return None
        instance.used = time.monotonic()
        return instance.upstream

    def _retable(self, conversation: str, server: str, tools: tuple[Json, ...]) -> None:
        catalog = self._catalogs.setdefault(conversation, Catalog())
        if tools:
            catalog.update(ToolSet(server, sanitise(server), False, None, tools))
        else:
            catalog.remove(server)
        if not catalog.served:
            self._catalogs.pop(conversation, None)

    def handed_names(self) -> set[str]:
        """The names of every server a conversation handed over (starting or running)."""
        return {server.removeprefix(HANDED) for server, _ in self._instances if server.startswith(HANDED)}

    def release(self, name: str, prefix: str) -> None:
        """A server of the gateway's own took `name` and `prefix`: stop the handed-over servers it shadows."""
        for key in [k for k in self._instances if k[0].startswith(HANDED)]:
            handed = key[0].removeprefix(HANDED)
            if handed == name or sanitise(handed) == prefix:
                self._close(key, "name_taken")

    def _admit_handed(self, conversation: str, owner: str, limits: HandedLimits) -> None:
        """Refuse one more handed-over server at a limit (`CallFailed`, naming the limit), at once."""
        handed = [(key, i) for key, i in self._instances.items() if key[0].startswith(HANDED)]
        mine = sum(1 for (_, c), _ in handed if c == conversation)
        if mine >= limits.per_conversation:
            why = (
                f"this conversation runs its limit of {limits.per_conversation} handed-over servers "
                "(handover.max_per_conversation)"
            )
        elif sum(1 for _, i in handed if i.owner == owner) >= limits.per_token:
            why = (
                f"this token's conversations run its limit of {limits.per_token} handed-over servers "
                "(handover.max_per_token)"
            )
        elif len(self._instances) >= self.max_total:
            why = (
                f"the gateway runs its limit of {self.max_total} conversation connections over all servers, "
                "handed-over ones included (max_conversation_instances)"
            )
        else:
            return
        raise CallFailed(f"not started: {why}; try again when one stops", outcome="busy", transient=False)

    async def hand_over(
        self,
        conversation: str,
        owner: str,
        spec: ServerSpec,
        egress: EgressPolicy | None,
        limits: HandedLimits,
        taken: Callable[[str], str | None] = lambda _: None,
    ) -> str:
        """Start one server the conversation hands over; `started` or `running`. Raises `CallFailed` (at a limit,
        at once; when it does not come up, as soon as its first try fails) and `NameClash`."""
        key = (HANDED + spec.name, conversation)
        while (starting := self._starting.get(key)) is not None:
            await starting.wait()
        current = self._instances.get(key)
        if current is not None and current.upstream.state is State.UP:
            return "running"
        if current is not None:
            self._close(key, "failed")
        if self._tg is None:
            raise CallFailed("the gateway is stopping", outcome="unavailable", transient=False)
        if (clash := taken(spec.name)) is not None:  # checked and claimed with no wait between: one namespace
            raise NameClash(clash)
        self._admit_handed(conversation, owner, limits)

        async def changed(upstream: Upstream) -> None:
            if (HANDED + spec.name, conversation) in self._instances:
                self._retable(conversation, spec.name, upstream.tools if upstream.state is State.UP else ())

        upstream = Upstream(
            spec,
            changed,
            {},  # a client's `${...}` is never filled from the gateway's environment
            egress=egress if spec.kind != "stdio" else None,
            source="conversation",
            fast=self._fast,
        )
        scope = anyio.CancelScope()
        self._instances[key] = Instance(upstream, scope, owner=owner)
        self._starting[key] = started = anyio.Event()
        try:
            self._tg.start_soon(self._own, upstream, scope)
            # its first try decides: a server that fails at once is reported at once, not after startup_timeout
            with anyio.move_on_after(spec.startup_timeout + 1):
                await upstream.settled.wait()
            if upstream.state is not State.UP:
                reason = upstream.error or "no answer within startup_timeout"
                self._close(key, "failed")
                raise CallFailed(f"it did not start: {reason}", outcome="unavailable", transient=False)
        finally:
            del self._starting[key]
            started.set()
        self._retable(conversation, spec.name, upstream.tools)
        log.info("handed-over server started", server=spec.name, tools=len(upstream.tools))
        return "started"

    async def _own(self, upstream: Upstream, scope: anyio.CancelScope) -> None:
        with scope:
            await upstream.run()
