"""The composition root: builds the gateway's ASGI app and its lifespan, and nothing else."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.admin.api import admin_routes
from gateway.admin.probes import probe_routes
from gateway.admin.servers import Runtime, RuntimeError_
from gateway.catalog.search import load_model
from gateway.config.servers import ConfigError, FileConfig, load_config
from gateway.config.settings import FILE_KEYS, Settings
from gateway.console import console_routes
from gateway.core.handover import HandOver
from gateway.core.registry import Registry
from gateway.downstream.dialin import WorkerDoor
from gateway.downstream.gate import AuthGate, Limits, transport_security
from gateway.downstream.oauth import ResourceServer
from gateway.downstream.replicas import conversational, shared_sessions
from gateway.downstream.server import Frontend
from gateway.downstream.shortcut import Shortcut
from gateway.observe import tracing
from gateway.observe.audit import AuditConfig, AuditLog
from gateway.observe.logs import get_logger
from gateway.observe.tracing import TracingConfig
from gateway.policy.access import views_for
from gateway.store import open_store
from gateway.upstream.sandbox import use_default

log = get_logger("app")


class GatewayApp(Starlette):
    """Starlette with a front door: requests for `/mcp` (and `/mcp/ENDPOINT`) go straight to the gate, past the
    router's walk over every probe, admin and metadata route and its error-handling layers (uvicorn answers 500
    for an exception there, as those layers would); everything else is routed as usual."""

    def __init__(self, gate: ASGIApp, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] == "/mcp" or scope["path"].startswith("/mcp/")):
            scope["app"] = self
            await self._gate(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def build_app(settings: Settings, config: FileConfig, environ: Mapping[str, str] | None = None) -> Starlette:
    """The whole gateway as one ASGI app; upstreams start with its lifespan."""
    use_default(settings.sandbox)
    tracer = start_tracing(settings)  # before the frontend: its middleware is chosen by it
    store = open_store(settings.store.get_secret_value() if settings.store else None)
    oauth_key = settings.oauth_key.get_secret_value() if settings.oauth_key else None
    registry = Registry(
        config.servers,
        environ,
        credentials=settings.credentials,
        fast=settings.fast_path,
        store=store,
        oauth_key=oauth_key,
    )
    registry.conversations.max_total = settings.max_conversation_instances
    audit = open_audit(settings, registry)
    confirm_key = settings.confirm_key.get_secret_value().encode() if settings.confirm_key else None
    oauth = settings.auth.oauth
    rules = oauth.rules if oauth is not None else []
    views = views_for(settings.auth.tokens, settings.endpoints, rules)
    frontend = Frontend(registry, views, confirm_key, settings.exposure, load_model(settings.search_model))
    runtime = Runtime(registry, store, settings)
    frontend.handover = HandOver(registry, runtime.egress, settings.handover)
    security = transport_security(settings.allowed_hosts, settings.allowed_origins)
    mcp_app = frontend.server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=security,
        host=settings.host,
        max_request_body_size=settings.max_body_bytes,
        max_sessions=settings.max_sessions,
        session_idle_timeout=settings.session_idle_timeout,
    )
    frontend.sessions.attach(frontend.server.session_manager)
    lane: ASGIApp = Shortcut(mcp_app, frontend, security) if settings.fast_path else mcp_app
    limits = Limits(settings.max_body_bytes, settings.max_json_depth, settings.max_token_bytes)
    resource_server = None
    if oauth is not None:
        resource_server = ResourceServer(oauth, settings.resource_url, frozenset(settings.endpoints))
        resource_server.on_outcome = registry.metrics.count_oauth_token
        assert resource_server.keys is not None
        resource_server.keys.on_fetch = registry.metrics.count_key_fetch
    shared = shared_sessions(store, frontend.sessions, settings.session_idle_timeout, frontend.tools.origin)
    if shared is not None:
        shared.on_subscriptions = frontend.notices.follow
    gate = AuthGate(
        lane,
        settings.auth.tokens,
        frontend.sessions,
        limits,
        settings.endpoints,
        resource_server,
        shared,
        shortcut=settings.fast_path,
        conversational=conversational(registry) if shared is not None else None,
    )

    async def reload() -> list[str]:
        try:
            fresh = await anyio.to_thread.run_sync(load_config, settings.config, FILE_KEYS)
        except ConfigError as e:
            log.error("config reload refused; nothing changed", problems=e.problems)
            if audit is not None:
                audit.act("reload", outcome="refused", problems=len(e.problems))
            raise RuntimeError_(422, e.problems) from None
        changes = await registry.apply_config(fresh.servers)
        log.info("config reloaded", changes=changes)
        if audit is not None:
            audit.act("reload", changes=changes)
        return changes

    async def on_sighup() -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                try:
                    await reload()
                except RuntimeError_:
                    continue  # logged by reload; the running config stays

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with (
            frontend.server.session_manager.run(),
            registry.running(),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(runtime.run)
            tg.start_soon(door.departures.run)
            tg.start_soon(on_sighup)
            if shared is not None:
                tg.start_soon(shared.follow)
                tg.start_soon(shared.deliver, gate.inject, gate.serve_handed)
            if resource_server is not None:
                tg.start_soon(resource_server.warm_up)
            app.state.started = True
            try:
                yield
            finally:
                frontend.close_listen_streams()
                tg.cancel_scope.cancel()
                await store.close()
                with anyio.CancelScope(shield=True):
                    if audit is not None:
                        await anyio.to_thread.run_sync(audit.close)
                    if tracer is not None:
                        await anyio.to_thread.run_sync(tracer.shutdown)
                        tracing.ACTIVE = None

    door = WorkerDoor(registry, settings.auth.tokens, settings.workers, settings.max_body_bytes)
    routes: list[BaseRoute] = list(probe_routes(registry, runtime, lambda: bool(app.state.started)))
    routes.append(WebSocketRoute("/workers", door.serve))
    if settings.admin_token is not None:
        routes += admin_routes(registry, runtime, settings.admin_token.get_secret_value(), reload)
        routes += console_routes(registry, runtime, settings.admin_token.get_secret_value())
    if resource_server is not None:
        routes += resource_server.routes()
    app = GatewayApp(gate, routes=[*routes, Mount("/", app=gate)], lifespan=lifespan)
    app.state.started = False
    app.state.registry = registry
    app.state.frontend = frontend
    app.state.runtime = runtime
    return app


def start_tracing(settings: Settings) -> tracing.Tracing | None:
    """The process's tracing (`observe.tracing`), or None when it is off."""
    block = settings.tracing
    config = TracingConfig(
        enabled=block.enabled,
        endpoint=block.endpoint,
        headers=block.headers,
        service_name=block.service_name,
        sampler=block.sampler,
        sampler_arg=block.sampler_arg,
        timeout=block.timeout,
    )
    try:
        tracer = tracing.configure(config)
    except ValueError as e:  # an OTEL_TRACES_SAMPLER(_ARG) the SDK cannot take
        raise ConfigError([f"tracing: {e}"]) from None
    if tracer is not None:
        log.info("tracing on", endpoint=tracing.shown_url(tracer.url), sampler=tracer.sampler)
    return tracer


def open_audit(settings: Settings, registry: Registry) -> AuditLog | None:
    """The audit log (`observe.audit`) the `audit:` block asks for, told of calls through the metrics, or None."""
    block = settings.audit
    if not block.enabled:
        return None
    key = block.digest_key.get_secret_value() if block.digest_key is not None else None
    config = AuditConfig(enabled=True, path=block.path, queue=block.queue, digest_key=key)
    try:
        audit = AuditLog.open(config, on_drop=registry.metrics.audit_dropped.inc)
    except OSError as e:
        raise ConfigError([f"audit.path: cannot open {block.path!r} ({e.strerror})"]) from None
    registry.metrics.audit = audit
    log.info("audit log on", path=block.path)
    return audit
