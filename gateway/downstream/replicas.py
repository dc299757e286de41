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

A held call (`requestState`) and a task live on the replica that began them; their ids begin with its mark. A
request about one that reaches another replica is handed over to that one through its inbox in the store, run
there as if it had arrived there, and its HTTP answer passed back (`holder_of`, `hand_over`). When that replica is
gone, the request is answered with an error that says the call may have run.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, Protocol, cast

import anyio

from gateway.core.registry import Registry
from gateway.core.tasks import Tasks
from gateway.downstream.sessions import Sessions, asks_capabilities
from gateway.observe.logs import get_logger
from gateway.policy.access import View
from gateway.relay.held import HeldCalls
from gateway.store import Store, StoreError

log = get_logger("replicas")
Found = Literal["known", "taken", "foreign", "unknown"]
Json = dict[str, Any]
TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/update", "tasks/cancel"})
HOLDER_CHECK = 1.0  # seconds between checks that the replica running a handed-over request is still there
OWNED_FOR = 3600.0  # seconds a conversation stays its replica's after its last request there
UNREACHED: Json = {"unreached": True}  # `hand_over`: the holder was not there to take the request (never sent)
LOST: Json = {"lost": True}  # `hand_over`: the holder took the request and went away before answering


class SessionStore(Protocol):
    """A store that keeps sessions for every replica (Redis)."""

    async def put_session(self, key: str, value: bytes, ttl: float, *, announce: bool = False) -> None: ...
    async def use_session(self, key: str, ttl: float) -> bytes | None: ...
    async def delete_session(self, key: str) -> bool: ...
    async def asking(self, session: str, replica: str, delta: int, ttl: float) -> None: ...
    async def askers(self, session: str) -> list[str]: ...
    async def send_to(self, replica: str, payload: bytes) -> int: ...
    async def listening(self, replica: str) -> bool: ...
    async def replicas(self) -> list[str]: ...
    def inbox(self, replica: str) -> Any: ...
    def changes(self) -> Any: ...
    async def claim(self, name: str, replica: str, ttl: float, replacing: str = "") -> str: ...


Inject = Callable[[str, str, bytes], Awaitable[None]]  # hands (session, version, body) to this replica's SDK
Serve = Callable[[Json], Awaitable[Json]]  # runs a request handed over to this replica; its HTTP answer


class SharedSessions:
    """The records of 2025-era sessions in the shared store: written when this replica opens one, read (and kept
    alive) on every request of one, whichever replica opened it."""

    def __init__(self, store: SessionStore, sessions: Sessions, idle_timeout: float, replica: str) -> None:
        self._store = store
        self._sessions = sessions
        self._ttl = idle_timeout
        self._local: set[str] = set()  # sessions the store could not take: this replica's alone
        self._versions: dict[str, str] = {}  # the revision each session settled on, from its record
        self._asking: Counter[str] = Counter()  # questions this replica has out, by session
        self._ending: set[str] = set()  # sessions whose DELETE this replica is serving
        self._replies: dict[str, tuple[anyio.Event, list[Json]]] = {}  # requests handed over, by ticket
        self.replica = replica
        sessions.share = self.share
        self.on_subscriptions: Callable[[], Awaitable[None]] | None = None  # a session's subscriptions changed here
        sessions.asking = self.asking
        sessions.replicated = True

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
        adopted = self._sessions.adopt(session_id, record.get("level"), record["subscribed"], record["revealed"])
        if adopted.subscriptions and self.on_subscriptions is not None:
            await self.on_subscriptions()  # follow upstream what the session now follows, for its stream here
        if adopted.listing and adopted.pusher is not None:
            with suppress(Exception):  # a stream that just ended: its client lists afresh when it comes back
                await adopted.pusher.send_tool_list_changed()
        return "taken" if taken else "known"

    async def share(self, session_id: str, fields: dict[str, Any]) -> None:
        """Record a change to a session's own state (its log level, subscriptions, or the tools a search revealed
        to it) and announce it: the replica holding the session's stream follows its resources and tells it of its
        listing, and the one serving its next call filters by its level."""
        if session_id in self._local:
            return
        try:
            raw = await self._store.use_session(session_id, self._ttl)
            record = _decode(raw) if raw is not None else None
            if record is not None:
                record.update(fields)
                await self._store.put_session(session_id, json.dumps(record).encode(), self._ttl, announce=True)
        except StoreError as e:
            log.warning("a session's state not shared; only this replica knows it", reason=str(e))

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
            payload = json.dumps({"kind": "answer", "session": session_id, "body": body.decode()}).encode()
            for replica in askers:
                await self._store.send_to(replica, payload)
        except (StoreError, UnicodeDecodeError) as e:
            log.warning("an answer could not be passed to the replica that asked", reason=str(e))
            return False
        return bool(askers)

    def holder_of(self, message: Any) -> str | None:
        """The replica holding what a request names (a held call's `requestState`, a task's id), when another."""
        params = message.get("params") if isinstance(message, dict) else None
        if not isinstance(params, dict):
            return None
        method, origin = message.get("method"), None
        if method == "tools/call" and isinstance(state := params.get("requestState"), str):
            origin = HeldCalls.origin_of(state)
        elif method in TASK_METHODS and isinstance(task := params.get("taskId"), str):
            origin = Tasks.origin_of(task)
        return origin if origin is not None and origin != self.replica else None

    async def conversation_owner(self, conversation: str, replacing: str = "") -> str:
        """The replica whose instances serve `conversation` (`isolation: conversation`): the first to serve one of
        its requests to such a server, or this one when that one is `replacing` (gone) or the store is not there."""
        name = hashlib.sha256(conversation.encode()).hexdigest()[:32]
        try:
            return await self._store.claim(name, self.replica, OWNED_FOR, replacing)
        except StoreError as e:
            log.warning("conversation owner unknown; served here", reason=str(e))
            return self.replica

    async def hand_over(self, holder: str, request: Json) -> Json:
        """Run `request` (an HTTP request, see `AuthGate.serve_handed`) on the replica `holder` and return its HTTP
        answer; `UNREACHED` when that replica was not there to take it, `LOST` when it went away (stopped, killed,
        or cut off from the store) after taking it and before answering."""
        ticket = secrets.token_hex(8)
        arrived, box = anyio.Event(), cast(list[Json], [])
        self._replies[ticket] = (arrived, box)
        try:
            envelope = {**request, "kind": "request", "from": self.replica, "ticket": ticket}
            if await self._store.send_to(holder, json.dumps(envelope).encode()) == 0:
                return UNREACHED
            while not arrived.is_set():
                with anyio.move_on_after(HOLDER_CHECK):
                    await arrived.wait()
                if not arrived.is_set() and not await self._store.listening(holder):
                    return LOST
            return box[0]
        except StoreError as e:
            log.warning("a request could not be handed to the replica holding its call", reason=str(e))
            return LOST
        finally:
            self._replies.pop(ticket, None)

    async def hand_to_peers(self, request: Json) -> list[Json]:
        """Run `request` on every other live replica at once (see `hand_over`); the HTTP answers of those that
        answered (one that was gone, or went away, is left out)."""
        try:
            peers = [r for r in await self._store.replicas() if r != self.replica]
        except StoreError as e:
            log.warning("the other replicas could not be listed", reason=str(e))
            return []
        answers: list[Json] = []

        async def ask(peer: str) -> None:
            answer = await self.hand_over(peer, request)
            if answer is not UNREACHED and answer is not LOST:
                answers.append(answer)

        async with anyio.create_task_group() as tg:
            for peer in peers:
                tg.start_soon(ask, peer)
        return answers

    async def deliver(self, inject: Inject, serve: Serve) -> None:
        """Take what other replicas pass here (forever: run it in a task): a client's answer to a question asked
        here (handed to this replica's SDK), a request about a call or task held here (run, and its answer sent
        back), and the answers to the requests this replica handed over."""
        async with anyio.create_task_group() as tg:
            async for payload in self._store.inbox(self.replica):
                try:
                    message = json.loads(payload)
                    kind = message["kind"]
                    if kind == "answer":
                        await self._take_answer(message["session"], message["body"].encode(), inject)
                    elif kind == "request":
                        tg.start_soon(self._serve, message, serve)
                    elif kind == "reply" and (waiting := self._replies.get(message["ticket"])) is not None:
                        waiting[1].append(message)
                        waiting[0].set()
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    log.warning("a message from another replica could not be read", reason=type(e).__name__)

    async def _take_answer(self, session_id: str, body: bytes, inject: Inject) -> None:
        if self._sessions.owner(session_id) is None:
            return
        version = self._versions.get(session_id)
        if version is not None:
            await inject(session_id, version, body)

    async def _serve(self, request: Json, serve: Serve) -> None:
        answer = await serve(request)
        with suppress(StoreError):
            reply = {**answer, "kind": "reply", "ticket": request["ticket"]}
            await self._store.send_to(request["from"], json.dumps(reply).encode())

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
        """End, on this replica, the sessions deleted on another (their GET streams included), and take the state
        another replica changed of the ones it holds, as soon as the store says so (forever: run it in a task). A
        request that comes first reads the record anyway."""
        async for reason in self._store.changes():
            if not reason.startswith("session "):
                continue
            session_id = reason.removeprefix("session ")
            if session_id in self._ending or session_id in self._local:
                continue  # deleted here: the SDK's own DELETE ends it
            owner = self._sessions.owner(session_id)
            if owner is not None:
                await self.resolve(session_id, owner)  # reads the record: a deleted one is forgotten here, a
                # changed one's state taken


def conversational(registry: Registry) -> Callable[[Any, View], bool]:
    """Whether a request reaches a server with `isolation: conversation` (a call of one of its tools, a read of one
    of its resources): such a request is served by the replica that owns its conversation."""

    def isolated(server: str | None) -> bool:
        upstream = registry.upstreams.get(server) if server is not None else None
        return upstream is not None and upstream.spec.isolation == "conversation"

    def reaches(message: Any, view: View) -> bool:
        params = message.get("params") if isinstance(message, dict) else None
        if not isinstance(params, dict):
            return False
        if message.get("method") == "tools/call" and isinstance(name := params.get("name"), str):
            entry = registry.catalog.resolve(name)
            return entry is not None and isolated(entry.server)
        if message.get("method") == "resources/read" and isinstance(uri := params.get("uri"), str):
            return isolated(registry.catalog.route_uri(uri, view.sees))
        return False

    return reaches


def shared_sessions(store: Store, sessions: Sessions, idle_timeout: float, replica: str) -> SharedSessions | None:
    """2025-era sessions every replica can serve, when the store is shared (Redis); else None. `replica` is this
    process's mark (the one its held calls and tasks carry)."""
    if store.kind != "redis":
        return None
    return SharedSessions(cast(SessionStore, store), sessions, idle_timeout, replica)


def _decode(raw: bytes) -> dict[str, Any] | None:
    """A session record, or None when it is not one (a corrupt row is treated as no session)."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    keys = ("view", "owner", "version", "opening")
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in keys):
        return None
    found: dict[str, Any] = {k: record[k] for k in keys}
    if isinstance(level := record.get("level"), str):
        found["level"] = level
    for listed in ("subscribed", "revealed"):
        names = record.get(listed)
        found[listed] = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    return found
