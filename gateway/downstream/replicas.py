"""2025-era sessions any replica can serve: each session's record (its view, owner and opening `initialize`) is
kept in the shared store, and a replica that meets a session it does not know takes it up from there.

A session taken up is dormant here (see `downstream.sessions`): the shortcut serves its tool listings and calls
at once, and its first request that needs the SDK replays the opening handshake into the SDK's session table,
exactly as for a dormant session opened on this replica. So a 2025-era client behind a load balancer without
affinity keeps its session whichever replica each request reaches, and when a replica dies. The record expires
after the idle timeout (every request of the session, on any replica, reads it in one round trip that also keeps
it alive, so a session deleted on one replica is unknown on the next request anywhere); the log level its client
sets travels in the record too.

A server's question to a 2025-era client is asked by the replica serving the call; the client's answer, a POST of
its own, may reach another. Each replica notes in the store the sessions it has questions out to, and a replica
that receives an answer it did not ask for passes it over pub/sub to the ones that did (`route_answer`,
`deliver`), which hand it to their SDK as if the client had posted it there.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, Protocol, cast

import anyio

from gateway.downstream.sessions import Sessions, asks_capabilities
from gateway.observe.logs import get_logger
from gateway.store import Store, StoreError

log = get_logger("replicas")
Found = Literal["known", "taken", "foreign", "unknown"]


class SessionStore(Protocol):
    """A store that keeps sessions for every replica (Redis)."""

    async def put_session(self, key: str, value: bytes, ttl: float) -> None: ...
    async def use_session(self, key: str, ttl: float) -> bytes | None: ...
    async def delete_session(self, key: str) -> bool: ...
    async def asking(self, session: str, replica: str, delta: int, ttl: float) -> None: ...
    async def askers(self, session: str) -> list[str]: ...
    async def send_answer(self, replica: str, payload: bytes) -> None: ...
    def answers(self, replica: str) -> Any: ...
    def changes(self) -> Any: ...


Inject = Callable[[str, str, bytes], Awaitable[None]]  # hands (session, version, body) to this replica's SDK


class SharedSessions:
    """The records of 2025-era sessions in the shared store: written when this replica opens one, read (and kept
    alive) on every request of one, whichever replica opened it."""

    def __init__(self, store: SessionStore, sessions: Sessions, idle_timeout: float) -> None:
        self._store = store
        self._sessions = sessions
        self._ttl = idle_timeout
        self._local: set[str] = set()  # sessions the store could not take: this replica's alone
        self._versions: dict[str, str] = {}  # the revision each session settled on, from its record
        self._asking: Counter[str] = Counter()  # questions this replica has out, by session
        self._ending: set[str] = set()  # sessions whose DELETE this replica is serving
        self.replica = secrets.token_hex(8)
        sessions.on_level = self.level_set
        sessions.asking = self.asking

    async def opened(self, session_id: str, view: str, owner: str, opening: bytes, version: str) -> None:
        """Record a session this replica opened (a store that cannot be written leaves it this replica's)."""
        record = {"view": view, "owner": owner, "version": version, "opening": opening.decode()}
        try:
            await self._store.put_session(session_id, json.dumps(record).encode(), self._ttl)
        except StoreError as e:
            log.warning("session not shared; only this replica can serve it", reason=str(e))
            self._local.add(session_id)

    async def resolve(self, session_id: str, owner: str) -> Found:
        """Where a request's session stands, from its record (read in one round trip that also keeps it alive):
        `known` here, `taken` up now (dormant here), `foreign` (another caller's: answered as unknown) or
        `unknown` (never opened, deleted or idle past the timeout: forgotten here too)."""
        here = self._sessions.owner(session_id)
        if session_id in self._local:
            return "known" if here is not None else "unknown"
        try:
            raw = await self._store.use_session(session_id, self._ttl)
        except StoreError as e:
            log.warning("shared sessions unreachable; serving the sessions this replica knows", reason=str(e))
            return "known" if here is not None else "unknown"
        record = _decode(raw) if raw is not None else None
        if record is None:
            self._versions.pop(session_id, None)
            if here is not None:
                await self._sessions.terminate(session_id)  # deleted on another replica, or expired
            return "unknown"
        if record["owner"] != owner:
            return "foreign"
        taken = here is None
        if taken:
            opening = record["opening"].encode()
            talks = asks_capabilities(json.loads(opening))
            self._sessions.open_dormant(session_id, record["view"], owner, opening, record["version"], talks=talks)
            log.info("session taken up from the store", session=session_id[:8])
        self._versions[session_id] = record["version"]
        level = record.get("level")
        if level is not None and self._sessions.level(session_id) != level:
            self._sessions.set_level(session_id, level)
        return "taken" if taken else "known"

    async def level_set(self, session_id: str, level: str) -> None:
        """Record the log level a session's client set, so the replica serving its next call filters by it."""
        if session_id in self._local:
            return
        try:
            raw = await self._store.use_session(session_id, self._ttl)
            record = _decode(raw) if raw is not None else None
            if record is not None:
                record["level"] = level
                await self._store.put_session(session_id, json.dumps(record).encode(), self._ttl)
        except StoreError as e:
            log.warning("session log level not shared; only this replica filters by it", reason=str(e))

    @asynccontextmanager
    async def asking(self, session_id: str) -> AsyncIterator[None]:
        """Mark a question this replica puts to a session's client for the block: its answer, a POST of its own
        that may reach another replica, is passed here (see `route_answer`)."""
        self._asking[session_id] += 1
        try:
            with suppress(StoreError):
                await self._store.asking(session_id, self.replica, 1, self._ttl)
            yield
        finally:
            self._asking[session_id] -= 1
            if self._asking[session_id] <= 0:
                del self._asking[session_id]
            with anyio.CancelScope(shield=True), suppress(StoreError):
                await self._store.asking(session_id, self.replica, -1, self._ttl)

    async def route_answer(self, session_id: str, body: bytes) -> bool:
        """Pass a client's answer (a JSON-RPC response) to the replicas that have a question out to it; False
        when this replica has one itself, or none has (the SDK here takes it as it would)."""
        if self._asking.get(session_id) or session_id in self._local:
            return False
        try:
            askers = [r for r in await self._store.askers(session_id) if r != self.replica]
            payload = json.dumps({"session": session_id, "body": body.decode()}).encode()
            for replica in askers:
                await self._store.send_answer(replica, payload)
        except (StoreError, UnicodeDecodeError) as e:
            log.warning("an answer could not be passed to the replica that asked", reason=str(e))
            return False
        return bool(askers)

    async def deliver(self, inject: Inject) -> None:
        """Hand the answers other replicas pass here to this replica's SDK (forever: run it in a task)."""
        async for payload in self._store.answers(self.replica):
            try:
                message = json.loads(payload)
                session_id, body = message["session"], message["body"].encode()
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if self._sessions.owner(session_id) is None:
                continue
            version = self._versions.get(session_id)
            if version is not None:
                await inject(session_id, version, body)

    async def ending(self, session_id: str) -> None:
        """The client is deleting the session here: delete its record, so every replica forgets it (this one
        ends it through the SDK's own DELETE, then calls `ended`)."""
        self._ending.add(session_id)
        self._local.discard(session_id)
        try:
            await self._store.delete_session(session_id)
        except StoreError as e:
            log.warning("session record not deleted; it expires when idle", reason=str(e))

    def ended(self, session_id: str) -> None:
        """The session's DELETE was answered here."""
        self._ending.discard(session_id)
        self._versions.pop(session_id, None)

    async def follow(self) -> None:
        """End, on this replica, the sessions deleted on another (their GET streams included) as soon as the
        store says so (forever: run it in a task). A request that comes first finds the record gone anyway."""
        async for reason in self._store.changes():
            if not reason.startswith("session "):
                continue
            session_id = reason.removeprefix("session ")
            if session_id in self._ending or session_id in self._local:
                continue  # deleted here: the SDK's own DELETE ends it
            if self._sessions.owner(session_id) is not None:
                await self.resolve(session_id, "")  # reads the record; a deleted one is forgotten here


def shared_sessions(store: Store, sessions: Sessions, idle_timeout: float) -> SharedSessions | None:
    """2025-era sessions every replica can serve, when the store is shared (Redis); else None."""
    if store.kind != "redis":
        return None
    return SharedSessions(cast(SessionStore, store), sessions, idle_timeout)


def _decode(raw: bytes) -> dict[str, str] | None:
    """A session record, or None when it is not one (a corrupt row is treated as no session)."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    keys = ("view", "owner", "version", "opening")
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in keys):
        return None
    found = {k: record[k] for k in keys}
    if isinstance(level := record.get("level"), str):
        found["level"] = level
    return found
