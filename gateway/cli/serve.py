"""Serving the app: uvicorn with a drain before shutdown, and the refusal to expose an open port."""

from __future__ import annotations

import socket

import uvicorn
from prometheus_client import start_http_server
from sse_starlette.sse import AppStatus

from gateway.app import build_app
from gateway.config.servers import FileConfig
from gateway.config.settings import Settings
from gateway.downstream.server import Frontend
from gateway.internals.uvicorn import ConnectionLimits, keep_exit_status_clean, limited_http
from gateway.observe.logs import get_logger

log = get_logger("serve")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class DrainingServer(uvicorn.Server):
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
        keep_exit_status_clean(self)


class Unsafe(Exception):
    """The settings would expose the gateway without authentication."""


def check_exposure(settings: Settings) -> None:
    """Refuse an unauthenticated gateway on a non-loopback address; warn on loopback."""
    if settings.auth.enabled:
        return
    loopback = settings.host in LOOPBACK or settings.host.startswith("127.")
    if not loopback and not settings.allow_unauthenticated:
        raise Unsafe(
            f"refusing to serve {settings.host}:{settings.port} without authentication: add API tokens under "
            "`auth.tokens` or an identity provider under `auth.oauth` in the config (see the README's Security "
            "section), or pass --allow-unauthenticated "
            "(MANIFOLD_ALLOW_UNAUTHENTICATED=true) if something in front of the gateway authenticates callers"
        )
    log.warning("no API tokens configured: /mcp is open to anyone who can reach it", host=settings.host)


def serve(settings: Settings, config: FileConfig) -> None:
    """Run the gateway until SIGTERM or SIGINT, then drain and stop."""
    check_exposure(settings)
    app = build_app(settings, config)
    limits = ConnectionLimits(
        settings.max_header_bytes, settings.header_timeout, settings.body_timeout, settings.max_connections
    )
    server_config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=limited_http(limits, app.state.registry.metrics.count_http_refusal),  # httptools, with bounds
        log_config=None,
        access_log=False,  # every call is logged by the gateway; uvicorn's lines were built per request, then dropped
        server_header=False,  # no `server: uvicorn` on every answer
        lifespan="on",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=settings.keep_alive_timeout,
        ws_max_size=settings.max_body_bytes,  # a worker's message is bounded as a request body is
        ws_ping_interval=None,  # workers are pinged in MCP (`ping`), on `workers.heartbeat_interval`
    )
    # sse-starlette would end every SSE stream, calls in flight included, the moment SIGTERM lands;
    # the drain above ends them itself once the calls are done.
    AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.host, registry=app.state.registry.metrics.registry)
    DrainingServer(server_config, app.state.frontend, settings.drain_timeout).run()
