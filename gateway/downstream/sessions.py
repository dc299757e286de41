"""What the gateway records of each downstream 2025-era session (the SDK's transport holds the rest).

A session is opened by the SDK's transport (on `initialize`), or by the shortcut, which keeps a session
that only lists and calls tools as one small record here (dormant) and hands it to the SDK, replaying its
handshake, the first time it asks for more (`wake`). The gate records which view opened a session and its
owner (an API token, or an OAuth rule and the token's subject: no one else may use it), the server
records the SDK session it pushes change notices through. Liveness comes from the SDK's own table of
open sessions, read through `gateway.internals.sdk`, and for dormant sessions from their last request and
the idle timeout; records of closed sessions are pruned whenever the sessions are counted or told of a
change, and as the table grows.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Scope

from gateway.internals.sdk import (
    adopt_session,
    holding,
    number_requests_apart,
    serving_transport,
    session_transports,
)
from gateway.relay.asks import asks_through


def asks_capabilities(message: Any) -> bool:
    """Whether an `initialize` request declares a capability a server may ask the user through."""
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return False
    params = message.get("params")
    capabilities = params.get("capabilities") if isinstance(params, dict) else None
    return isinstance(capabilities, dict) and asks_through(capabilities)


@dataclass
class Dormant:
    """A session the SDK does not hold yet: its opening request, to replay when it wakes, and its last use."""

    opening: bytes
    version: str
    touched: float
    woken: anyio.Event | None = None  # set once a wake is under way: later requests wait for it


@dataclass(frozen=True)
class Adopted:
    """What taking a session's shared state changed here: its subscriptions, its listing (and where to say so)."""

    subscriptions: bool
    listing: bool
    pusher: Any


@dataclass
class Session:
    """One open 2025-era session: the view it belongs to, its owner (who alone may use it), and (once it served
    a request) its SDK session, or what it takes to open one (`dormant`)."""

    view: str
    owner: str | None = None
    pusher: Any = None
    level: str | None = None
    talks: bool = False
    subscribed: set[str] = field(default_factory=set)
    dormant: Dormant | None = None
    revealed: set[str] = field(default_factory=set)  # tools a search added to its listing (deferred exposure)


class Sessions:
    """Every open 2025-era session by id."""

    def __init__(self) -> None:
        self._manager: StreamableHTTPSessionManager | None = None
        self._by_id: dict[str, Session] = {}
        self._prune_at = 64
        self.on_end: Callable[[str], None] = lambda session_id: None
        # tells the shared store of a change to a session's own state (`level`, `subscribed`, `revealed`; replicas)
        self.share: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        self.asking: Callable[[str], AbstractAsyncContextManager[None]] | None = None  # a question out (replicas)
        self.replicated = False  # other replicas may ask this one's clients things too

    def attach(self, manager: StreamableHTTPSessionManager) -> None:
        """Read liveness from this SDK session manager."""
        self._manager = manager

    def owner(self, session_id: str) -> str | None:
        """Who opened the session (its owner, else its view), or None when unknown here."""
        session = self._by_id.get(session_id)
        if session is None:
            return None
        return session.owner if session.owner is not None else session.view

    def opened(self, session_id: str, view: str, owner: str | None = None, *, talks: bool = False) -> None:
        """Record a session the SDK just opened for a caller with `view` and `owner` (default: the view's name;
        `talks`: its client can be asked)."""
        self._by_id.setdefault(session_id, Session(view, owner, talks=talks))
        self._grown()

    def _grown(self) -> None:
        if len(self._by_id) >= self._prune_at:
            self.prune()
            self._prune_at = max(64, 2 * len(self._by_id))

    def open_dormant(
        self, session_id: str, view: str, owner: str, opening: bytes, version: str, *, talks: bool = False
    ) -> None:
        """Record a session opened with the `initialize` request `opening` that the SDK does not hold: one the
        shortcut opened itself, or one taken up from another replica (`talks`: its client can be asked)."""
        dormant = Dormant(opening, version, time.monotonic())
        self._by_id[session_id] = Session(view, owner, talks=talks, dormant=dormant)
        self._grown()

    def dormant(self, session_id: str) -> bool:
        """Whether the session is open and the SDK does not hold it (its requests are the shortcut's, or wake
        it); marks it used."""
        session = self._by_id.get(session_id)
        if session is None or session.dormant is None or session.dormant.woken is not None:
            return False
        if self._expired(session.dormant):
            del self._by_id[session_id]
            return False
        session.dormant.touched = time.monotonic()
        return True

    def waking(self, session_id: str) -> bool:
        """Whether the session is dormant or being woken (a request for it must wait for `wake`)."""
        session = self._by_id.get(session_id)
        return session is not None and session.dormant is not None

    async def wake(self, session_id: str, template: Scope) -> None:
        """Hand a dormant session to the SDK (once, however many requests ask at a time); a session the SDK
        does not take is forgotten, so the request that woke it is answered as for an unknown session."""
        session = self._by_id.get(session_id)
        if session is None or (dormant := session.dormant) is None:
            return
        if dormant.woken is not None:
            await dormant.woken.wait()
            return
        dormant.woken = anyio.Event()
        taken = False
        try:
            assert self._manager is not None
            with anyio.CancelScope(shield=True):
                taken = await adopt_session(self._manager, session_id, template, dormant.opening, dormant.version)
        finally:
            session.dormant = None
            if not taken:
                self._by_id.pop(session_id, None)
            dormant.woken.set()

    def _expired(self, dormant: Dormant) -> bool:
        timeout = self._manager.session_idle_timeout if self._manager is not None else None
        return timeout is not None and time.monotonic() - dormant.touched > timeout

    def served(self, session_id: str, view: str, pusher: Any) -> bool:
        """Record the SDK session a request of `session_id` was served on (change notices go through it); whether
        that made its resource subscriptions ones to follow here (it has some, and had no SDK session here)."""
        session = self._by_id.setdefault(session_id, Session(view))
        if session.pusher is not None:
            return False
        session.pusher = pusher
        if self.replicated:
            number_requests_apart(pusher)  # its questions and another replica's never share an id
        return bool(session.subscribed)

    def talking(self, session_id: str) -> None:
        """Record that the session's client can be asked things or wants log lines (it needs the SDK path)."""
        session = self._by_id.get(session_id)
        if session is not None:
            session.talks = True

    def talks(self, session_id: str) -> bool:
        """Whether the session's client can be asked things or wants log lines."""
        session = self._by_id.get(session_id)
        return session is not None and session.talks

    def set_level(self, session_id: str, level: str) -> None:
        """Record the log level the session's client asked for."""
        session = self._by_id.get(session_id)
        if session is not None:
            session.level, session.talks = level, True

    def level(self, session_id: str | None) -> str | None:
        """The session's log level (None: none was set)."""
        session = self._by_id.get(session_id) if session_id is not None else None
        return session.level if session is not None else None

    def levels(self) -> list[str]:
        """The log levels the live sessions asked for."""
        self.prune()
        return [s.level for s in self._by_id.values() if s.level is not None]

    def subscribe(self, session_id: str, uri: str, on: bool) -> list[str]:
        """Record (or drop) the session's subscription to a resource; the session's subscriptions now."""
        session = self._by_id.get(session_id)
        if session is None:
            return []
        (session.subscribed.add if on else session.subscribed.discard)(uri)
        return sorted(session.subscribed)

    def adopt(self, session_id: str, level: str | None, subscribed: list[str], revealed: list[str]) -> Adopted:
        """Take a session's own state as another replica left it (from its shared record)."""
        session = self._by_id.get(session_id)
        if session is None:
            return Adopted(False, False, None)
        if level is not None and session.level != level:
            session.level, session.talks = level, True
        subscriptions = set(subscribed) != session.subscribed
        session.subscribed = set(subscribed)
        grew = not set(revealed) <= session.revealed
        session.revealed |= set(revealed)
        return Adopted(subscriptions, grew, session.pusher)

    def subscribed(self) -> Iterator[tuple[str, str, Any]]:
        """(view, URI, SDK session) of every live subscription of a 2025-era session."""
        self.prune()
        for session in list(self._by_id.values()):
            if session.pusher is not None:
                for uri in session.subscribed:
                    yield session.view, uri, session.pusher

    def revealed(self, session_id: str | None) -> set[str]:
        """The tools a search added to the session's listing (none for a session unknown here)."""
        session = self._by_id.get(session_id) if session_id is not None else None
        return session.revealed if session is not None else set()

    def reveal(self, session_id: str, names: list[str], limit: int) -> list[str]:
        """Add tools a search found to the session's listing, `limit` at most in all; the ones new to it. They go
        with the session's record, when it is deleted or idles out."""
        session = self._by_id.get(session_id)
        if session is None:
            return []
        fresh = [n for n in dict.fromkeys(names) if n not in session.revealed][: max(0, limit - len(session.revealed))]
        session.revealed.update(fresh)
        return fresh

    def knows(self, session_id: str) -> bool:
        """Whether the session has served a request through the SDK (so it is initialised)."""
        session = self._by_id.get(session_id)
        return session is not None and session.pusher is not None

    def prune(self) -> None:
        """Forget the sessions the SDK has closed, and dormant ones idle for longer than the idle timeout."""
        if self._manager is None:
            return
        live = session_transports(self._manager)
        gone = [
            session_id
            for session_id, session in self._by_id.items()
            if (self._expired(session.dormant) if session.dormant is not None else session_id not in live)
        ]
        for session_id in gone:
            del self._by_id[session_id]

    def ended(self, session_id: str) -> None:
        """The client deleted the session: forget it and tell `on_end` at once."""
        self._by_id.pop(session_id, None)
        self.on_end(session_id)

    async def terminate(self, session_id: str) -> None:
        """The session was deleted elsewhere (another replica): forget it, and end the SDK's session of it."""
        self.ended(session_id)
        transport = session_transports(self._manager).get(session_id) if self._manager is not None else None
        if transport is not None and not transport.is_terminated:
            await transport.terminate()

    def live(self, session_id: str) -> bool:
        """Whether the SDK still holds the session open (True before the SDK's table is attached)."""
        if self._manager is None:
            return True
        session = self._by_id.get(session_id)
        if session is not None and session.dormant is not None:
            return not self._expired(session.dormant)
        transport = session_transports(self._manager).get(session_id)
        return transport is not None and not transport.is_terminated

    def count(self) -> int:
        """Open 2025-era sessions."""
        self.prune()
        return len(self._by_id)

    def full(self, limit: int) -> bool:
        """Whether `limit` sessions are open (the records are pruned only when they reach it)."""
        return len(self._by_id) >= limit and self.count() >= limit

    def pushers(self) -> Iterator[tuple[str, Any]]:
        """(view, SDK session) of every live session that can be sent change notices."""
        self.prune()
        for session in list(self._by_id.values()):
            if session.pusher is not None:
                yield session.view, session.pusher

    def transport(self, session_id: str) -> StreamableHTTPServerTransport | None:
        """The SDK transport of a known, live session that can take a request, or None."""
        if self._manager is None or not self.knows(session_id):
            return None
        return serving_transport(self._manager, session_id)

    def holding(self, transport: StreamableHTTPServerTransport | None) -> AbstractContextManager[None]:
        """Keep the session from idling out while a request is served beside the SDK (None: a dormant one)."""
        return holding(transport) if transport is not None else nullcontext()
