"""A 2025-era session beside a server's 2026 connection, for the 2025-era callers the server may ask things of.

A server that speaks both eras asks a 2026 client through `input_required` answers, and a 2025 client through
requests on its session (sampling, elicitation, roots). Servers of the 2025 generation that learned the 2026
wire often answer `input_required` only from the tools written for it: their other tools ask through the
session, which a 2026 connection does not have, so a 2025-era caller would never be asked. A 2025-era caller
that can answer (it declared sampling, elicitation or roots) is therefore served over a 2025-era session to
the same HTTP server, opened on first need and kept while the server's main connection lasts. A server that
refuses the 2025 handshake is remembered and served over its 2026 connection, as every other caller is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from gateway.observe.logs import get_logger
from gateway.protocol.era import LATEST_HANDSHAKE, Era
from gateway.protocol.errors import State
from gateway.relay.asks import asks_through, declared
from gateway.upstream.connection import Upstream

log = get_logger("upstream")


def wants_legacy(shared: Upstream, caller_version: str, capabilities: Mapping[str, Any]) -> bool:
    """Whether a request of a 2025-era caller with these `capabilities` should take a 2025-era session: the
    caller can answer something the server may ask, and the server (one of the gateway's own, not one a
    conversation handed over) is reached over HTTP, left to negotiate (`protocol: auto`), and spoke 2026."""
    return (
        not Era.of(caller_version).modern
        and asks_through(declared(shared.spec, dict(capabilities)))
        and Era.of(shared.protocol_version).modern
        and shared.spec.protocol == "auto"
        and shared.spec.kind == "http"
        and shared.spec.isolation != "conversation"
        and shared.source != "conversation"  # a handed-over server ends with its conversation; nothing forgets it here
    )


class LegacySessions:
    """The 2025-era sessions opened beside servers' 2026 connections, one per server at most."""

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[Upstream, anyio.CancelScope, Upstream]] = {}
        self._refused: dict[str, Upstream] = {}  # server -> the main connection that was refused one
        self._starting: dict[str, anyio.Event] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self) -> None:
        """Own the sessions' tasks until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None
                for name in list(self._sessions):
                    self.forget(name)

    def forget(self, server: str) -> None:
        """The server was removed or restarted: close its 2025-era session."""
        self._refused.pop(server, None)
        held = self._sessions.pop(server, None)
        if held is not None:
            held[1].cancel()

    async def serving(self, shared: Upstream, tool: str | None = None) -> Upstream:
        """The 2025-era session to `shared`'s server (opened and waited for on first need), or `shared` itself
        when the server refuses one, is not up, or (for a tool call) does not offer `tool` on it."""
        name = shared.name
        while (starting := self._starting.get(name)) is not None:
            await starting.wait()
        held = self._sessions.get(name)
        if held is not None and held[2] is not shared:  # the main connection was replaced: start afresh
            self.forget(name)
            held = None
        if self._refused.get(name) is shared or self._tg is None:
            return shared
        if held is None:
            held = await self._open(shared)
            if held is None:
                return shared
        legacy = held[0]
        if legacy.state is not State.UP:
            return shared
        if tool is not None and all(t.get("name") != tool for t in legacy.offers.tools):
            return shared
        return legacy

    async def _open(self, shared: Upstream) -> tuple[Upstream, anyio.CancelScope, Upstream] | None:
        name, spec = shared.name, shared.spec
        assert self._tg is not None
        self._starting[name] = started = anyio.Event()
        try:
            legacy = shared.sibling(spec.model_copy(update={"protocol": LATEST_HANDSHAKE}))
            scope = anyio.CancelScope()
            self._tg.start_soon(_own, legacy, scope)
            with anyio.move_on_after(spec.startup_timeout + 1):
                await legacy.settled.wait()
            if legacy.state is not State.UP:
                scope.cancel()
                self._refused[name] = shared
                log.info(
                    "server refused a 2025-era session; its 2025-era callers use its 2026 connection",
                    server=name,
                    reason=legacy.error,
                )
                return None
            log.info("2025-era session opened beside the server's 2026 connection", server=name)
            self._sessions[name] = held = (legacy, scope, shared)
            return held
        finally:
            del self._starting[name]
            started.set()


async def _own(upstream: Upstream, scope: anyio.CancelScope) -> None:
    with scope:
        await upstream.run()
