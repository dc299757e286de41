"""The Starlette app: `/mcp` for agents, `/healthz` and `/readyz` for probes, and the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from gateway.config import FileConfig
from gateway.frontend import Frontend
from gateway.registry import Registry
from gateway.settings import Settings
from gateway.upstream import State

LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """Host/Origin checks against DNS rebinding: loopback names plus the configured extras.

    `allowed_hosts: ["*"]` turns the checks off (for a proxy in front that owns `Host`).
    """
    if "*" in settings.allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [h for local in LOCAL_HOSTS for h in (local, f"{local}:*")]
    origins = [o for local in LOCAL_HOSTS for o in (f"http://{local}", f"http://{local}:*")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *settings.allowed_hosts],
        allowed_origins=[*origins, *settings.allowed_origins],
    )


def server_status(registry: Registry) -> list[dict[str, object]]:
    """Each server's state, tool count, last error and since when, sorted by name."""
    return [
        {
            "name": up.name,
            "state": up.state.value,
            "tools": len(up.tools) if up.state is State.UP else 0,
            "error": up.error,
            "since": up.since,
        }
        for up in sorted(registry.upstreams.values(), key=lambda u: u.name)
    ]


def build_app(settings: Settings, config: FileConfig, environ: Mapping[str, str] | None = None) -> Starlette:
    """The whole gateway as one ASGI app; upstreams start with its lifespan."""
    registry = Registry(config.servers, environ)
    frontend = Frontend(registry)
    mcp_app = frontend.server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=transport_security(settings),
        host=settings.host,
    )

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ready", "servers": server_status(registry)})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with frontend.server.session_manager.run(), registry.running():
            try:
                yield
            finally:
                frontend.listen_handler.close()

    app = Starlette(
        routes=[Route("/healthz", healthz), Route("/readyz", readyz), Mount("/", app=mcp_app)],
        lifespan=lifespan,
    )
    app.state.registry = registry
    app.state.frontend = frontend
    return app
