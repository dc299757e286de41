"""The set of upstreams: starts each in its own task and keeps the catalog in step with them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from gateway.catalog.merged import Catalog, Collision, Json, ToolSet
from gateway.config.servers import PinMode, ServerSpec
from gateway.core.conversations import Conversations
from gateway.observe.logs import get_logger
from gateway.observe.metrics import Metrics
from gateway.policy.egress import EgressPolicy
from gateway.policy.pins import ChangedSinceReview, Pin, Pins
from gateway.protocol.errors import State, describe
from gateway.protocol.naming import sanitise
from gateway.store import Store, StoreError
from gateway.store.memory import MemoryStore
from gateway.upstream.connection import Upstream
from gateway.upstream.legacy import LegacySessions, two_eras, wants_legacy
from gateway.upstream.server import UpstreamServer
from gateway.upstream.tokens import Tokens
from gateway.upstream.transports.websocket import CONFLICT, Refusal
from gateway.upstream.workerpool import WorkerPool

log = get_logger("registry")
Listener = Callable[[], Awaitable[None]]
UpdateListener = Callable[[str, str], Awaitable[None]]


class NameTaken(KeyError):
    """A change found the name taken (or, for `replace(..., replacing=...)`, held by a server of another source)."""


class Registry:
    """Every configured upstream, the merged catalog, and who to tell when the catalog changes.

    Every change of the set of upstreams (`add`, `remove`, `replace`, `apply_config`) runs under one lock, so
    no change sees another half done; listeners are told after the lock is released.
    """

    def __init__(
        self,
        specs: Iterable[ServerSpec],
        environ: Mapping[str, str] | None = None,
        credentials: Mapping[str, Any] | None = None,
        *,
        fast: bool = True,
        store: Store | None = None,
        oauth_key: str | None = None,
        tokens: Tokens | None = None,
    ) -> None:
        store = store or MemoryStore()
        self.pins = Pins(store, self._pin_mode)
        self.catalog = Catalog(holds=self.pins.holds)
        self._fast = fast
        self.metrics = Metrics()
        self.tokens = tokens or Tokens(store, oauth_key, self.metrics)
        self.conversations = Conversations(self.metrics, fast=fast)
        self.legacy = LegacySessions()
        self.upstreams: dict[str, UpstreamServer] = {}
        self._environ = environ
        self._credentials = credentials or {}
        self._published: dict[str, tuple[Json, ...]] = {}
        self._collisions: list[Collision] = []
        self._listeners: list[Listener] = []
        self._update_listeners: list[UpdateListener] = []
        self._ranks: dict[str, int] = {}
        self._clashes: list[str] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._changing = anyio.Lock()
        for spec in specs:
            self._create(spec, "config", None)

    def _pin_mode(self, server: str) -> PinMode:
        upstream = self.upstreams.get(server)
        return upstream.spec.pin_mode if upstream is not None else "off"

    def _create(self, spec: ServerSpec, source: str, egress: EgressPolicy | None) -> Upstream:
        upstream = Upstream(
            spec,
            self._upstream_changed,
            self._environ,
            self.metrics,
            credentials=self._credentials,
            egress=egress,
            source=source,
            fast=self._fast,
            tokens=self.tokens,
        )
        self._register(upstream)
        return upstream

    def _register(self, upstream: UpstreamServer) -> UpstreamServer:
        self.metrics.add_server(upstream.name)
        upstream.on_resource_updated = self._resource_updated
        self._ranks.setdefault(upstream.name, len(self._ranks))
        self.upstreams[upstream.name] = upstream
        return upstream

    def _start(self, upstream: UpstreamServer) -> None:
        """Schedule the owner task. Its cancel scope exists from now on, so a removal before the task has
        run still stops it (the task then returns without connecting)."""
        assert self._tg is not None, "the registry is not running"
        scope = upstream.scope = anyio.CancelScope()
        self._tg.start_soon(self._own, upstream, scope, name=f"upstream:{upstream.name}")

    async def _own(self, upstream: UpstreamServer, scope: anyio.CancelScope) -> None:
        try:
            if scope.cancel_called:
                return  # removed before this task ran
            with scope:
                await upstream.run()
        finally:
            upstream.stopped.set()

    async def add(self, spec: ServerSpec, source: str, egress: EgressPolicy | None = None) -> UpstreamServer:
        """Start a new server at once (its tools appear when it is up); `NameTaken` if the name is in use."""
        async with self._changing:
            return self._add(spec, source, egress)

    def _add(self, spec: ServerSpec, source: str, egress: EgressPolicy | None) -> UpstreamServer:
        if spec.name in self.upstreams:
            raise NameTaken(spec.name)
        assert self._tg is not None, "the registry is not running"
        self.conversations.release(spec.name, spec.effective_prefix)  # the gateway's own server takes the name
        upstream = self._create(spec, source, egress)
        self._start(upstream)
        return upstream

    async def remove(self, name: str, *, source: str | None = None) -> bool:
        """Stop a server and forget it, its published tools and its metric series; returns once its connection
        (and process group) is gone. False, changing nothing, when there is no such server or (with `source`)
        it comes from another source."""
        async with self._changing:
            current = self.upstreams.get(name)
            if current is None or (source is not None and current.source != source):
                return False
            changed = await self._remove(name, forget=True)
        if changed:
            await self._notify()
        return True

    async def _remove(self, name: str, *, forget: bool) -> bool:
        """Stop and drop a server; True when the merged catalog changed (the caller tells the listeners)."""
        upstream = self.upstreams[name]
        with anyio.CancelScope(shield=True):  # a cancelled caller must not leave a half-removed server
            if upstream.scope is not None:
                upstream.scope.cancel()
                await upstream.stopped.wait()
        del self.upstreams[name]
        self.conversations.forget(name)
        self.legacy.forget(name)
        self.pins.forget(name)
        self._published.pop(name, None)
        if forget:
            self.metrics.remove_server(name)
        else:
            self.metrics.upstream_up.labels(name).set(0)
            self.metrics.upstream_tools.labels(name).set(0)
        changed = self.catalog.remove(name)
        if changed:
            self.metrics.catalog_tools.set(self.catalog.served)
        return changed

    async def replace(
        self, spec: ServerSpec, source: str, egress: EgressPolicy | None = None, *, replacing: str | None = None
    ) -> UpstreamServer:
        """Restart a server with new options (or start it, if there is none by that name). With `replacing`,
        only a server of that source is replaced: one of another source raises `NameTaken`."""
        async with self._changing:
            current = self.upstreams.get(spec.name)
            if current is not None and replacing is not None and current.source != replacing:
                raise NameTaken(spec.name)
            changed = current is not None and await self._remove(spec.name, forget=False)
            upstream = self._add(spec, source, egress)
        if changed:
            await self._notify()
        return upstream

    @asynccontextmanager
    async def worker_pool(self, spec: ServerSpec) -> AsyncIterator[WorkerPool]:
        """The pool of the workers offering `spec.name`, started with the first of them, held for as long as the
        caller serves one; when no connection holds it any more it is removed, and its tools leave the catalog.

        `NameTaken` when a server of another source has the name, or its prefix is another server's;
        `Refusal` when the workers already offering the name are trusted otherwise than this one.
        """
        async with self._changing:
            current = self.upstreams.get(spec.name)
            if current is None:
                prefix = spec.effective_prefix
                if any(u.spec.effective_prefix == prefix for u in self.upstreams.values()):
                    raise NameTaken(spec.name)
                if any(n == spec.name or sanitise(n) == prefix for n in self.conversations.handed_names()):
                    why = f"'{spec.name}' is the name or prefix of a server a conversation handed over"
                    raise Refusal(CONFLICT, why, "clash")
                assert self._tg is not None, "the registry is not running"
                pool = WorkerPool(spec, self._upstream_changed, self.metrics)
                self._register(pool)
                self._start(pool)
            elif not isinstance(current, WorkerPool):
                raise NameTaken(spec.name)
            elif current.spec.trusted != spec.trusted:
                trust = "trusted" if current.spec.trusted else "outside"
                why = f"the workers offering '{spec.name}' are {trust}; this token's are not"
                raise Refusal(CONFLICT, why, "trust")
            else:
                pool = current
            pool.reserved += 1
        try:
            yield pool
        finally:
            with anyio.CancelScope(shield=True):
                changed = False
                async with self._changing:
                    pool.reserved -= 1
                    if pool.reserved == 0 and self.upstreams.get(pool.name) is pool:
                        changed = await self._remove(pool.name, forget=True)
                if changed:
                    await self._notify()

    def on_catalog_change(self, listener: Listener) -> None:
        """Call `listener` after each change of the merged listing."""
        self._listeners.append(listener)

    def on_resource_updated(self, listener: UpdateListener) -> None:
        """Call `listener(server, uri)` when a server says one of its resources changed."""
        self._update_listeners.append(listener)

    async def _resource_updated(self, upstream: UpstreamServer, uri: str) -> None:
        for listener in self._update_listeners:
            try:
                await listener(upstream.name, uri)
            except Exception as e:
                log.error("resource update listener failed", server=upstream.name, reason=describe(e))

    @asynccontextmanager
    async def connection(
        self,
        upstream: UpstreamServer,
        version: str,
        capabilities: Mapping[str, Any] | None,
        tool: str | None = None,
        conversation: str | None = None,
        *,
        plain: bool = False,
    ) -> AsyncIterator[UpstreamServer]:
        """The connection a request to `upstream`'s server takes: `conversation`'s own (`isolation:
        conversation`), a 2025-era session beside a 2026 one for a 2025-era caller with these `capabilities`
        (None: no caller to ask; see `gateway.upstream.legacy`), the era its tool answers faster in for a `plain`
        call (a tool call whose caller can be asked nothing; see `gateway.upstream.eras`), or the server's shared
        connection."""
        if isinstance(upstream, Upstream):  # worker pools have neither conversations nor 2025-era sessions
            if upstream.spec.isolation == "conversation" and conversation is not None:
                async with self.conversations.using(upstream, conversation) as own:
                    yield own
                return
            if capabilities is not None and wants_legacy(upstream, version, capabilities):
                upstream = await self.legacy.serving(upstream, tool)
            elif plain and tool is not None and two_eras(upstream):
                with self.legacy.plain(upstream, tool) as serving:
                    yield serving
                return
        yield upstream

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Registry]:
        """Start every upstream in the background; stop them all on exit."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.conversations.run)
            tg.start_soon(self.legacy.run)
            await self._read_pins()
            for upstream in self.upstreams.values():
                self._start(upstream)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                self._tg = None

    async def apply_config(self, specs: Iterable[ServerSpec]) -> list[str]:
        """Apply a re-read config file as a diff: add, remove, or restart only servers whose options changed.
        A server of the file replaces a runtime server of the same name."""
        wanted = {spec.name: spec for spec in specs}
        changes = []
        changed = False
        async with self._changing:
            for name, upstream in list(self.upstreams.items()):
                if upstream.source == "config" and name not in wanted:
                    changed |= await self._remove(name, forget=True)
                    changes.append(f"removed {name}")
            for name, spec in wanted.items():
                current = self.upstreams.get(name)
                if current is None:
                    self._add(spec, "config", None)
                    changes.append(f"added {name}")
                elif current.spec != spec or current.source != "config":
                    changed |= await self._remove(name, forget=False)
                    self._add(spec, "config", None)
                    changes.append(f"restarted {name}")
        if changed:
            await self._notify()
        return changes

    async def wait_settled(self, timeout: float) -> None:
        """Wait until every upstream has come up or failed once, or `timeout` passes."""
        with anyio.move_on_after(timeout):
            for upstream in self.upstreams.values():
                await upstream.settled.wait()

    async def _upstream_changed(self, upstream: UpstreamServer) -> None:
        up = upstream.state is State.UP
        tools = upstream.tools if up else ()
        if up:
            spec, offers = upstream.spec, upstream.offers
            toolset = ToolSet(
                spec.name,
                spec.effective_prefix,
                spec.trusted,
                spec.gated,
                tools,
                offers.prompts,
                offers.resources,
                offers.templates,
                self._ranks.get(spec.name, len(self._ranks)),
                {name: o.model_dump(exclude_none=True) for name, o in spec.tools.items()},
            )
            offered = {t["name"] for t in tools}
            for name in spec.tools:
                if name not in offered:
                    log.warning("override names no tool the server offers", server=spec.name, tool=name[:128])
            changed = self.catalog.update(toolset)
            if spec.pin_mode != "off" and self.pins.loaded and not self.pins.seen(spec.name):
                changed |= await self._pin_first_listing(spec.name)
            elif spec.pin_mode != "off" and self.pins.loaded:
                changed |= await self._upgrade_pins(spec.name)
        else:
            changed = self.catalog.remove(upstream.name)
        self.metrics.upstream_up.labels(upstream.name).set(1 if up else 0)
        self.metrics.upstream_tools.labels(upstream.name).set(len(tools))
        self.metrics.catalog_tools.set(self.catalog.served)
        self._observe_pins([upstream.name])
        if self._published.get(upstream.name, ()) != tools:
            self._published[upstream.name] = tools
            self.metrics.tools_changes.labels(upstream.name).inc()
        for collision in self.catalog.collisions:
            if collision.reserved and collision not in self._collisions:
                [(server, tool)] = collision.origins
                log.warning(
                    "tool not offered: its name would pass for one of the gateway's own (manifold__*); give the "
                    "server a prefix or an override name",
                    name=collision.name,
                    server=server,
                    tool=tool[:128],
                )
            elif collision not in self._collisions:
                log.warning(
                    "tool names collide; each keeps a hash suffix",
                    name=collision.name,
                    origins=[f"{s}/{t}" for s, t in collision.origins],
                )
        self._collisions = list(self.catalog.collisions)
        for clash in self.catalog.clashes:
            if clash not in self._clashes:
                log.warning("resources clash; config order decides", clash=clash)
        self._clashes = list(self.catalog.clashes)
        if changed:
            await self._notify()

    async def _read_pins(self) -> bool:
        """Read the pins from the store; True when they changed. A store that cannot be read is logged and
        leaves the pins as they were (before the first read, `hold` servers' tools stay held)."""
        try:
            with anyio.fail_after(10):
                if not self.pins.loaded:
                    await self.pins.store.start()  # creates what is missing; the runtime may not have yet
                return await self.pins.load()
        except (StoreError, TimeoutError) as e:
            log.error("pins cannot be read from the store; held tools stay held", reason=describe(e))
            return False

    async def _pin_first_listing(self, server: str) -> bool:
        """Pin a server's first complete listing; True when the merged listing changed."""
        try:
            await self.pins.first_use(server, self.catalog.offered(server))
        except StoreError as e:
            log.error("first listing could not be pinned; it is pinned in memory", server=server, reason=describe(e))
        return self.catalog.refresh([server])

    async def _upgrade_pins(self, server: str) -> bool:
        """Complete a server's pins of an earlier form that still match (see `Pins.upgrade`); True when the merged
        listing changed."""
        try:
            if not await self.pins.upgrade(self.catalog.offered(server)):
                return False
        except StoreError as e:
            log.error("pins could not be completed", server=server, reason=describe(e))
        return self.catalog.refresh([server])

    def _observe_pins(self, servers: Iterable[str]) -> None:
        """Log and count definitions unlike their pins, and export how many tools each server has held."""
        for server in servers:
            mode = self._pin_mode(server)
            if mode == "off":
                continue
            for entry in self.catalog.offered(server):
                if self.pins.report(self.pins.judge(entry)):
                    self.metrics.count_pin_mismatch(server, mode)
            self.metrics.set_held(server, self.catalog.held_of(server))

    async def refresh_pins(self) -> None:
        """Write the first listings the store refused before, re-read the pins (another replica may have approved
        some) and judge every tool again."""
        try:
            await self.pins.store_pending()  # a no-op unless the store refused a first listing
        except StoreError as e:
            log.error("first listing could not be pinned; it is pinned in memory", reason=describe(e))
        changed = await self._read_pins()
        if not self.pins.loaded:
            return
        for name, upstream in list(self.upstreams.items()):
            if upstream.state is State.UP and upstream.spec.pin_mode != "off" and not self.pins.seen(name):
                changed |= await self._pin_first_listing(name)
            elif upstream.state is State.UP and upstream.spec.pin_mode != "off":
                changed |= await self._upgrade_pins(name)
        listing_changed = changed and self.catalog.refresh()
        self._observe_pins(list(self.upstreams))
        if listing_changed:
            self.metrics.catalog_tools.set(self.catalog.served)
            await self._notify()

    async def approve(self, server: str, tools: Iterable[str], reviewed: Mapping[str, str] | None = None) -> list[Pin]:
        """Pin tools of a server as offered now (all its held tools when `tools` is empty); the pins written.
        With `reviewed` (tool -> the digest the operator reviewed), each tool is pinned only if it is still
        offered as reviewed, else nothing is and `ChangedSinceReview` says which changed. `KeyError` names a
        tool the server does not offer."""
        offered = {e.original: e for e in self.catalog.offered(server)}
        by_public = {e.public: e for e in offered.values()}
        wanted = list(tools)
        chosen = []
        for name in wanted:
            entry = offered.get(name) or by_public.get(name)
            if entry is None:
                raise KeyError(name)
            chosen.append(entry)
        if reviewed is not None:
            judged = [(name, self.pins.judge(entry).offered) for name, entry in zip(wanted, chosen, strict=True)]
            changes = [(name, reviewed[name], now) for name, now in judged if reviewed.get(name) != now]
            if changes:
                raise ChangedSinceReview(server, changes)
        if not wanted:
            chosen = [e for e in self.catalog.held.values() if e.server == server]
        # the entries checked above are the definitions pinned, whatever the server offers meanwhile
        pins = await self.pins.approve(chosen, reviewed=reviewed is not None)
        if self.catalog.refresh():
            self.metrics.catalog_tools.set(self.catalog.served)
            await self._notify()
        self._observe_pins([server])
        return pins

    async def _notify(self) -> None:
        """Tell every listener; one that fails is logged and the others are still told. This runs in an
        upstream's owner task or a change's caller, which a listener's failure must never end."""
        log.info("catalog changed", version=self.catalog.version, tools=self.catalog.served)
        for listener in self._listeners:
            try:
                await listener()
            except Exception as e:
                log.error(
                    "catalog change listener failed",
                    version=self.catalog.version,
                    listener=getattr(listener, "__qualname__", type(listener).__name__),
                    reason=f"{type(e).__name__}: {describe(e)}",
                )
