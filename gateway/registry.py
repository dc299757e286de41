"""The set of upstreams: starts each in its own task and keeps the catalog in step with them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from gateway.catalog import Catalog, Collision, Json, ToolSet
from gateway.config import ServerSpec
from gateway.conversations import Conversations
from gateway.egress import EgressPolicy
from gateway.logs import get_logger
from gateway.metrics import Metrics
from gateway.upstream.connection import Upstream
from gateway.upstream.errors import State, describe

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
    ) -> None:
        self.catalog = Catalog()
        self._fast = fast
        self.metrics = Metrics()
        self.conversations = Conversations(self.metrics, environ, credentials or {}, fast=fast)
        self.upstreams: dict[str, Upstream] = {}
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

    def _create(self, spec: ServerSpec, source: str, egress: EgressPolicy | None) -> Upstream:
        self.metrics.add_server(spec.name)
        upstream = Upstream(
            spec,
            self._upstream_changed,
            self._environ,
            self.metrics,
            credentials=self._credentials,
            egress=egress,
            source=source,
            fast=self._fast,
        )
        upstream.on_resource_updated = self._resource_updated
        self._ranks.setdefault(spec.name, len(self._ranks))
        self.upstreams[spec.name] = upstream
        return upstream

    def _start(self, upstream: Upstream) -> None:
        """Schedule the owner task. Its cancel scope exists from now on, so a removal before the task has
        run still stops it (the task then returns without connecting)."""
        assert self._tg is not None, "the registry is not running"
        scope = upstream.scope = anyio.CancelScope()
        self._tg.start_soon(self._own, upstream, scope, name=f"upstream:{upstream.name}")

    async def _own(self, upstream: Upstream, scope: anyio.CancelScope) -> None:
        try:
            if scope.cancel_called:
                return  # removed before this task ran
            with scope:
                await upstream.run()
        finally:
            upstream.stopped.set()

    async def add(self, spec: ServerSpec, source: str, egress: EgressPolicy | None = None) -> Upstream:
        """Start a new server at once (its tools appear when it is up); `NameTaken` if the name is in use."""
        async with self._changing:
            return self._add(spec, source, egress)

    def _add(self, spec: ServerSpec, source: str, egress: EgressPolicy | None) -> Upstream:
        if spec.name in self.upstreams:
            raise NameTaken(spec.name)
        assert self._tg is not None, "the registry is not running"
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
        self._published.pop(name, None)
        if forget:
            self.metrics.remove_server(name)
        else:
            self.metrics.upstream_up.labels(name).set(0)
            self.metrics.upstream_tools.labels(name).set(0)
        changed = self.catalog.remove(name)
        if changed:
            self.metrics.catalog_tools.set(len(self.catalog.entries))
        return changed

    async def replace(
        self, spec: ServerSpec, source: str, egress: EgressPolicy | None = None, *, replacing: str | None = None
    ) -> Upstream:
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

    def on_catalog_change(self, listener: Listener) -> None:
        """Call `listener` after each change of the merged listing."""
        self._listeners.append(listener)

    def on_resource_updated(self, listener: UpdateListener) -> None:
        """Call `listener(server, uri)` when a server says one of its resources changed."""
        self._update_listeners.append(listener)

    async def _resource_updated(self, upstream: Upstream, uri: str) -> None:
        for listener in self._update_listeners:
            try:
                await listener(upstream.name, uri)
            except Exception as e:
                log.error("resource update listener failed", server=upstream.name, reason=describe(e))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Registry]:
        """Start every upstream in the background; stop them all on exit."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.conversations.run)
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

    async def _upstream_changed(self, upstream: Upstream) -> None:
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
        else:
            changed = self.catalog.remove(upstream.name)
        self.metrics.upstream_up.labels(upstream.name).set(1 if up else 0)
        self.metrics.upstream_tools.labels(upstream.name).set(len(tools))
        self.metrics.catalog_tools.set(len(self.catalog.entries))
        if self._published.get(upstream.name, ()) != tools:
            self._published[upstream.name] = tools
            self.metrics.tools_changes.labels(upstream.name).inc()
        for collision in self.catalog.collisions:
            if collision not in self._collisions:
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

    async def _notify(self) -> None:
        """Tell every listener; one that fails is logged and the others are still told. This runs in an
        upstream's owner task or a change's caller, which a listener's failure must never end."""
        log.info("catalog changed", version=self.catalog.version, tools=len(self.catalog.entries))
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
