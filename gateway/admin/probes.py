"""What probes and scrapers read: `/healthz`, `/readyz` and `/metrics`."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin.servers import Runtime
from gateway.core.registry import Registry
from gateway.protocol.errors import State


def server_status(registry: Registry) -> list[dict[str, object]]:
    """Each server's state, tool count, last error and since when (ISO 8601), sorted by name."""
    return [
        {**up.status(), "required": up.spec.required}
        for up in sorted(registry.upstreams.values(), key=lambda u: u.name)
    ]


def readiness(registry: Registry, started: bool) -> tuple[bool, dict[str, object]]:
    """Ready once started and every `required: true` server is up; the body lists every server."""
    waiting = [u.name for u in registry.upstreams.values() if u.spec.required and u.state is not State.UP]
    ready = started and not waiting
    body: dict[str, object] = {"status": "ready" if ready else "not ready", "servers": server_status(registry)}
    if waiting:
        body["waiting_for"] = sorted(waiting)
    return ready, body


def probe_routes(registry: Registry, runtime: Runtime, started: Callable[[], bool]) -> list[Route]:
    """`/healthz` (alive), `/readyz` (started, required servers up, store state) and `/metrics`."""

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> JSONResponse:
        ready, body = readiness(registry, started())
        health = runtime.health
        body["store"] = {
            "kind": runtime.store.kind,
            "ok": health.ok,
            "error": health.error,
            "bad_rows": sorted(runtime.bad_rows),
        }
        if not health.ok:
            body["degraded"] = True
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(_: Request) -> Response:
        body, content_type = registry.metrics.render()
        return Response(body, media_type=content_type)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
