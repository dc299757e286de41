"""The Starlette app: `/mcp` for agents, `/healthz` and `/readyz` for probes, and the lifespan."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import anyio
import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import start_http_server
from sse_starlette.sse import AppStatus
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from gateway.admin import admin_routes
from gateway.auth import AuthGate, Limits, views_for
from gateway.config import ConfigError, FileConfig, load_config
from gateway.fastlane import FastLane
from gateway.frontend import Frontend
from gateway.logs import get_logger
from gateway.registry import Registry
from gateway.runtime import Runtime, RuntimeError_
from gateway.settings import FILE_KEYS, Settings
from gateway.store import open_store
from gateway.upstream import State

log = get_logger("app")
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


class GatewayServer(uvicorn.Server):
    """uvicorn, with a drain before its shutdown and a clean exit status after SIGTERM or SIGINT."""

    def __init__(self, config: uvicorn.Config, frontend: Frontend, drain_timeout: float) -> None:
        super().__init__(config)
        self._frontend, self._drain_timeout = frontend, drain_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        await self._frontend.drain(self._drain_timeout)
        AppStatus.should_exit = True  # now end whatever SSE streams are left
        await super().shutdown(sockets)
        self._captured_signals.clear()  # exit 0 instead of re-raising the signal


class Unsafe(Exception):
    """The settings would expose the gateway without authentication."""


def check_exposure(settings: Settings) -> None:
    """Refuse an unauthenticated gateway on a non-loopback address; warn on loopback."""
    if settings.auth.tokens:
        return
    loopback = settings.host in ("127.0.0.1", "localhost", "::1") or settings.host.startswith("127.")
    if not loopback and not settings.allow_unauthenticated:
        raise Unsafe(
            f"refusing to serve {settings.host}:{settings.port} without authentication: add API tokens under "
            "`auth.tokens` in the config (see the README's Security section), or pass --allow-unauthenticated "
            "(MANIFOLD_ALLOW_UNAUTHENTICATED=true) if something in front of the gateway authenticates callers"
        )
    log.warning("no API tokens configured: /mcp is open to anyone who can reach it", host=settings.host)


def serve(settings: Settings, config: FileConfig) -> None:
    """Run the gateway until SIGTERM or SIGINT, then drain and stop."""
    check_exposure(settings)
    app = build_app(settings, config)
    server_config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=None, lifespan="on", timeout_graceful_shutdown=2
    )
    # sse-starlette would end every SSE stream, calls in flight included, the moment SIGTERM lands;
    # the drain above ends them itself once the calls are done.
    AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.host, registry=app.state.registry.metrics.registry)
    GatewayServer(server_config, app.state.frontend, settings.drain_timeout).run()


def build_app(settings: Settings, config: FileConfig, environ: Mapping[str, str] | None = None) -> Starlette:
    """The whole gateway as one ASGI app; upstreams start with its lifespan."""
    registry = Registry(config.servers, environ, credentials=settings.credentials, fast=settings.fast_path)
    frontend = Frontend(registry, views_for(settings.auth.tokens))
    store = open_store(settings.store.get_secret_value() if settings.store else None)
    runtime = Runtime(registry, store, settings)
    security = transport_security(settings)
    mcp_app = frontend.server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=security,
        host=settings.host,
        max_request_body_size=settings.max_body_bytes,
        max_sessions=settings.max_sessions,
        session_idle_timeout=settings.session_idle_timeout,
    )
    lane: ASGIApp = FastLane(mcp_app, frontend, security) if settings.fast_path else mcp_app
    gate = AuthGate(lane, settings.auth.tokens, Limits(settings.max_body_bytes, settings.max_json_depth))

    async def reload() -> list[str]:
        try:
            fresh = load_config(settings.config, FILE_KEYS)
        except ConfigError as e:
            log.error("config reload refused; nothing changed", problems=e.problems)
            raise RuntimeError_(422, e.problems) from None
        changes = await registry.apply_config(fresh.servers)
        log.info("config reloaded", changes=changes)
        return changes

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> JSONResponse:
        ready, body = readiness(registry, app.state.started)
        body["store"] = {"kind": store.kind, "ok": runtime.health.ok, "error": runtime.health.error}
        if not runtime.health.ok:
            body["degraded"] = True
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(_: Request) -> Response:
        registry.metrics.downstream_sessions.set(frontend.legacy_session_count())
        body, content_type = registry.metrics.render()
        return Response(body, media_type=content_type)

    async def prune_sessions() -> None:
        while True:
            await anyio.sleep(60)
            gate.forget_sessions(frontend.live_sessions())

    async def on_sighup() -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                with contextlib.suppress(RuntimeError_):
                    await reload()

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with (
            frontend.server.session_manager.run(),
            registry.running(),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(runtime.run)
            tg.start_soon(on_sighup)
            tg.start_soon(prune_sessions)
            app.state.started = True
            try:
                yield
            finally:
                frontend.close_listen_streams()
                tg.cancel_scope.cancel()
                await store.close()

    routes: list[BaseRoute] = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
    if settings.admin_token is not None:
        routes += admin_routes(registry, runtime, settings.admin_token.get_secret_value(), reload)
    app = Starlette(routes=[*routes, Mount("/", app=gate)], lifespan=lifespan)
    app.state.started = False
    app.state.registry = registry
    app.state.frontend = frontend
    app.state.runtime = runtime
    return app
