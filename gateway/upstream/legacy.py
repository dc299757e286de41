"""A 2025-era session beside a server's 2026 connection, for the 2025-era callers the server may ask things of.

A server that speaks both eras asks a 2026 client through `input_required` answers, and a 2025 client through
requests on its session (sampling, elicitation, roots). Servers of the 2025 generation that learned the 2026
wire often answer `input_required` only from the tools written for it: their other tools ask through the
session, which a 2026 connection does not have, so a 2025-era caller would never be asked. A 2025-era caller
that can answer (it declared sampling, elicitation or roots) is therefore served over a 2025-era session to
the same HTTP server, opened on first need and kept while the server's main connection lasts. A server that
refuses the 2025 handshake is remembered and served over its 2026 connection, as every other caller is.

The same session serves plain calls (callers that can be asked nothing) of the tools that the server answers
faster in the 2025 era, as learned from their first plain calls (`gateway.upstream.eras`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc

from gateway.observe.logs import get_logger
from gateway.protocol.era import LATEST_HANDSHAKE, Era
from gateway.protocol.errors import State
from gateway.relay.asks import asks_through, declared
from gateway.upstream.connection import Upstream
from gateway.upstream.eras import PlainEras, ToolTally

log = get_logger("upstream")


def wants_legacy(shared: Upstream, caller_version: str, capabilities: Mapping[str, Any]) -> bool:
    """Whether a request of a 2025-era caller with these `capabilities` should take a 2025-era session: the
    caller can answer something the server may ask, and the server (one of the gateway's own, not one a
    conversation handed over) is reached over HTTP, left to negotiate (`protocol: auto`), and spoke 2026."""
    return (
        not Era.of(caller_version).modern
        and asks_through(declared(shared.spec, dict(capabilities)))
        and two_eras(shared)
    )


def two_eras(shared: Upstream) -> bool:
    """Whether a 2025-era session may be opened beside the server's connection: it is reached over HTTP, left to
    negotiate (`protocol: auto`, so the `protocol` option still fixes the era of every call), spoke 2026, and is
    one of the gateway's own (not one a conversation handed over, or isolated per conversation)."""
    return (
        Era.of(shared.protocol_version).modern
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
        self._opening: set[str] = set()  # servers whose session a plain call started opening in the background
        self._eras: dict[str, tuple[Upstream, PlainEras]] = {}  # server -> its main connection and its tallies
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
        self._eras.pop(server, None)
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

    @contextmanager
    def plain(self, shared: Upstream, tool: str) -> Iterator[Upstream]:
        """Hold the connection a plain call of `tool` takes, for the call (`two_eras(shared)` holds).

        Until the tool has had `LEARN_AFTER` plain calls, the main connection's. Once the tool's era is chosen, that
        era's. While it is learned, the era of the server's current block (`PlainEras.turn`); the call is timed
        when it meets no call of the other era as it starts, and is answered. A 2025 turn before that session is up
        takes the main connection untimed, and the session is opened in the background."""
        name = shared.name
        held = self._eras.get(name)
        if held is None or held[0] is not shared:  # a new main connection learns afresh
            held = self._eras[name] = (shared, PlainEras())
        eras = held[1]
        tally = eras.tally(tool)
        now = time.monotonic()
        if tally is not None and tally.stale(now):
            tally = eras.renew(tool)
        if tally is not None and tally.chosen is None and (eras.expired(tally) or self._refused.get(name) is shared):
            tally.settle(False, now)
        if tally is None or tally.chosen is False or (tally.chosen is None and not tally.due()):
            serving, legacy_turn, timed, block = shared, False, False, 0
        else:
            legacy = self._ready(shared, tool, tally, now)
            if tally.chosen:
                serving, legacy_turn, timed, block = legacy or shared, legacy is not None, False, 0
            else:
                legacy_turn, block = eras.turn(now)
                if tally.first_block is None:
                    tally.first_block = block
                timed = eras.clean(legacy_turn) and (legacy is not None or not legacy_turn)
                if legacy_turn and legacy is None:
                    legacy_turn = False  # the session is not up yet: the main connection, untimed
                serving = legacy if legacy_turn and legacy is not None else shared
        eras.in_flight[legacy_turn] += 1
        try:
            started = time.perf_counter()
            yield serving
            if timed and tally is not None:
                self._timed(shared, tool, tally, legacy_turn, time.perf_counter() - started, block)
        finally:
            eras.in_flight[legacy_turn] -= 1

    def _timed(self, shared: Upstream, tool: str, tally: ToolTally, legacy: bool, seconds: float, block: int) -> None:
        chosen = tally.add(legacy, seconds, block, time.monotonic())
        if chosen is not None:
            legacy_ms, modern_ms = tally.medians_ms
            log.info(
                "plain calls of a tool take the era that answered them faster",
                server=shared.name,
                tool=tool,
                era=LATEST_HANDSHAKE if chosen else shared.protocol_version,
                median_2025_ms=legacy_ms,
                median_2026_ms=modern_ms,
            )

    def _ready(self, shared: Upstream, tool: str, tally: ToolTally, now: float) -> Upstream | None:
        """The 2025-era session to `shared`'s server when it is up and offers `tool`; else None, and the session
        is opened in the background if it is not open or opening. A session up without the tool settles the
        tool's era: 2026."""
        name = shared.name
        held = self._sessions.get(name)
        if held is not None and held[2] is not shared:  # the main connection was replaced: start afresh
            del self._sessions[name]
            held[1].cancel()
            held = None
        if held is None:
            if name not in self._starting and name not in self._opening and self._tg is not None:
                self._opening.add(name)
                self._tg.start_soon(self._open_soon, shared)
            return None
        legacy = held[0]
        if legacy.state is not State.UP:
            return None
        if all(t.get("name") != tool for t in legacy.offers.tools):
            tally.settle(False, now)
            return None
        return legacy

    async def _open_soon(self, shared: Upstream) -> None:
        try:
            await self.serving(shared)
        finally:
            self._opening.discard(shared.name)

    async def _open(self, shared: Upstream) -> tuple[Upstream, anyio.CancelScope, Upstream] | None:
        name, spec = shared.name, shared.spec
        assert self._tg is not None
        self._starting[name] = started = anyio.Event()
        try:
            legacy = shared.sibling(spec.model_copy(update={"protocol": LATEST_HANDSHAKE}))
            legacy.share_slots(shared)  # the server's max_concurrent and max_queued hold across both connections
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
