"""The set of upstreams: starts each in its own task and keeps the catalog in step with them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager

import anyio

from gateway.catalog import Catalog, Collision, Json, ToolSet
from gateway.config import ServerSpec
from gateway.logs import get_logger
from gateway.metrics import Metrics
from gateway.upstream import State, Upstream

log = get_logger("registry")
Listener = Callable[[], Awaitable[None]]


class Registry:
    """Every configured upstream, the merged catalog, and who to tell when the catalog changes."""

    def __init__(
        self,
        specs: Iterable[ServerSpec],
        environ: Mapping[str, str] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.catalog = Catalog()
        self.metrics = metrics or Metrics()
        self.upstreams: dict[str, Upstream] = {}
        self._published: dict[str, tuple[Json, ...]] = {}
        self._collisions: list[Collision] = []
        self._listeners: list[Listener] = []
        for spec in specs:
            self.metrics.add_server(spec.name)
            self.upstreams[spec.name] = Upstream(spec, self._upstream_changed, environ, self.metrics)

    def on_catalog_change(self, listener: Listener) -> None:
        """Call `listener` after each change of the merged listing."""
        self._listeners.append(listener)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Registry]:
        """Start every upstream in the background; stop them all on exit."""
        async with anyio.create_task_group() as tg:
            for upstream in self.upstreams.values():
                tg.start_soon(upstream.run, name=f"upstream:{upstream.name}")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

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
            log.info("catalog changed", version=self.catalog.version, tools=len(self.catalog.entries))
            for listener in self._listeners:
                await listener()
