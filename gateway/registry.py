"""The set of upstreams: starts each in its own task and keeps the catalog in step with them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from gateway.catalog import Catalog, Collision, Json, ToolSet
from gateway.config import ServerSpec
from gateway.egress import EgressPolicy
from gateway.logs import get_logger
from gateway.metrics import Metrics
from gateway.upstream.connection import Upstream
from gateway.upstream.errors import State

log = get_logger("registry")
Listener = Callable[[], Awaitable[None]]


class Registry:
    """Every configured upstream, the merged catalog, and who to tell when the catalog changes."""

    def __init__(
        self,
        specs: Iterable[ServerSpec],
        environ: Mapping[str, str] | None = None,
        metrics: Metrics | None = None,
        credentials: Mapping[str, Any] | None = None,
        *,
        fast: bool = True,
    ) -> None:
        self.catalog = Catalog()
        self._fast = fast
        self.metrics = metrics or Metrics()
        self.upstreams: dict[str, Upstream] = {}
        self._environ = environ
        self._credentials = credentials or {}
        self._published: dict[str, tuple[Json, ...]] = {}
        self._collisions: list[Collision] = []
        self._listeners: list[Listener] = []
        self._tg: anyio.abc.TaskGroup | None = None
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
        self.upstreams[spec.name] = upstream
        return upstream

    async def _own(self, upstream: Upstream) -> None:
        with anyio.CancelScope() as scope:
            upstream.scope = scope
            try:
                await upstream.run()
            finally:
                upstream.stopped.set()

    def add(self, spec: ServerSpec, source: str = "runtime", egress: EgressPolicy | None = None) -> Upstream:
        """Start a new server at once (its tools appear when it is up)."""
        if spec.name in self.upstreams:
            raise KeyError(spec.name)
        assert self._tg is not None, "the registry is not running"
        upstream = self._create(spec, source, egress)
        self._tg.start_soon(self._own, upstream, name=f"upstream:{spec.name}")
        return upstream

    async def remove(self, name: str) -> None:
        """Stop a server and forget it; returns once its connection (and process group) is gone."""
        upstream = self.upstreams[name]
        if upstream.scope is not None:
            upstream.scope.cancel()
            await upstream.stopped.wait()
        del self.upstreams[name]
        self._published.pop(name, None)
        self.metrics.upstream_up.labels(name).set(0)
        self.metrics.upstream_tools.labels(name).set(0)
        if self.catalog.remove(name):
            self.metrics.catalog_tools.set(len(self.catalog.entries))
            await self._notify()

    async def replace(self, spec: ServerSpec, source: str, egress: EgressPolicy | None = None) -> Upstream:
        """Restart a server with new options."""
        await self.remove(spec.name)
        return self.add(spec, source, egress)

    def on_catalog_change(self, listener: Listener) -> None:
        """Call `listener` after each change of the merged listing."""
        self._listeners.append(listener)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Registry]:
        """Start every upstream in the background; stop them all on exit."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for upstream in self.upstreams.values():
                tg.start_soon(self._own, upstream, name=f"upstream:{upstream.name}")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                self._tg = None

    async def apply_config(self, specs: Iterable[ServerSpec]) -> list[str]:
        """Apply a re-read config file as a diff: add, remove, or restart only servers whose options changed."""
        wanted = {spec.name: spec for spec in specs}
        changes = []
        for name, upstream in list(self.upstreams.items()):
            if upstream.source == "config" and name not in wanted:
                await self.remove(name)
                changes.append(f"removed {name}")
        for name, spec in wanted.items():
            current = self.upstreams.get(name)
            if current is None:
                self.add(spec, "config")
                changes.append(f"added {name}")
            elif current.spec != spec or current.source != "config":
                await self.replace(spec, "config")
                changes.append(f"restarted {name}")
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
            spec = upstream.spec
            changed = self.catalog.update(ToolSet(spec.name, spec.effective_prefix, spec.trusted, spec.gated, tools))
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
        if changed:
            await self._notify()

    async def _notify(self) -> None:
        log.info("catalog changed", version=self.catalog.version, tools=len(self.catalog.entries))
        for listener in self._listeners:
            await listener()
