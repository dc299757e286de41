"""The admin HTTP API under `/admin`: bearer auth, JSON in and out, errors as JSON with a message."""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin.pins import pin_handlers
from gateway.admin.servers import Runtime, RuntimeError_
from gateway.core.registry import Registry
from gateway.upstream.server import UpstreamServer
from gateway.upstream.workerpool import WorkerPool

Handler = Callable[[Request], Awaitable[Response]]
MAX_BODY = 64 * 1024


def error(status: int, message: str, errors: list[str] | None = None) -> JSONResponse:
    """A JSON error body: `{"error": message, "errors": [...]}`."""
    body: dict[str, Any] = {"error": message}
    if errors:
        body["errors"] = errors
    headers = {"WWW-Authenticate": 'Bearer realm="manifold-admin"'} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to be over `limit` bytes: by its declared length, or else
    while it arrives, without reading (or holding) the rest."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def describe_server(upstream: UpstreamServer, registry: Registry, *, with_tools: bool = False) -> dict[str, Any]:
    """A server as the admin API shows it: never its headers, env or credential values."""
    spec = upstream.spec
    body: dict[str, Any] = {**upstream.status(), "source": upstream.source, "transport": spec.kind}
    if spec.url is not None and upstream.source == "runtime":
        body["url"] = spec.url
    if spec.credential is not None:
        body["credential"] = spec.credential  # its name and kind only
        if (kind := upstream.credential_kind) is not None:
            body["credential_kind"] = kind
    if isinstance(upstream, WorkerPool) and with_tools:
        body["worker_list"] = upstream.describe_links()
    if with_tools:
        body["tool_list"] = [
            {"name": e.public, "tool": e.original, "labels": e.labels.names()}
            for e in registry.catalog.tools_of(spec.name)
        ]
    return body


def reconnect_server(registry: Registry, name: str) -> UpstreamServer:
    """Drop a server's connection and connect again at once (a server that is down tries again now, without
    waiting out its backoff); `RuntimeError_` for an unknown name, a disabled server or one offered by workers."""
    upstream = registry.upstreams.get(name)
    if upstream is None:
        raise RuntimeError_(404, [f"no server named {name!r}"])
    if isinstance(upstream, WorkerPool):
        raise RuntimeError_(409, [f"server {name!r} is offered by workers; they dial in themselves"])
    if upstream.spec.disabled:
        raise RuntimeError_(409, [f"server {name!r} is disabled in the config file"])
    upstream.reconnect()
    if (audit := registry.metrics.audit) is not None:
        audit.act("server_reconnected", server=name)
    return upstream


def admin_routes(
    registry: Registry, runtime: Runtime, token: str, reload: Callable[[], Awaitable[list[str]]]
) -> list[Route]:
    """The routes of the admin API, each behind the admin token."""
    expected = f"Bearer {token}".encode()

    def guarded(handler: Handler) -> Handler:
        async def check(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return error(401, "missing or wrong admin token")
            return await handler(request)

        return check

    async def list_servers(_: Request) -> Response:
        servers = sorted(registry.upstreams.values(), key=lambda u: u.name)
        return JSONResponse({"servers": [describe_server(u, registry) for u in servers]})

    async def get_server(request: Request) -> Response:
        upstream = registry.upstreams.get(request.path_params["name"])
        if upstream is None:
            return error(404, f"no server named {request.path_params['name']!r}")
        return JSONResponse(describe_server(upstream, registry, with_tools=True))

    async def add_server(request: Request) -> Response:
        raw = await read_capped(request, MAX_BODY)
        if raw is None:
            return error(413, f"the body is over {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error(400, f"the body is not valid JSON: {e}")
        try:
            spec = await runtime.add(body)
        except RuntimeError_ as e:
            return error(e.status, e.errors[0] if len(e.errors) == 1 else "the server was not added", e.errors)
        return JSONResponse(describe_server(registry.upstreams[spec.name], registry), status_code=201)

    async def remove_server(request: Request) -> Response:
        try:
            await runtime.remove(request.path_params["name"])
        except RuntimeError_ as e:
            return error(e.status, e.errors[0])
        return JSONResponse({"removed": request.path_params["name"]})

    async def reconnect(request: Request) -> Response:
        try:
            upstream = reconnect_server(registry, request.path_params["name"])
        except RuntimeError_ as e:
            return error(e.status, e.errors[0])
        return JSONResponse({"reconnecting": upstream.name})

    async def reconcile(_: Request) -> Response:
        await runtime.reconcile()
        return JSONResponse({"servers": sorted(registry.upstreams), "store": runtime.health.ok})

    async def reload_config(_: Request) -> Response:
        try:
            changes = await reload()
        except RuntimeError_ as e:
            return error(e.status, "the config file was not applied", e.errors)
        return JSONResponse({"changes": changes})

    pins = pin_handlers(registry)
    return [
        Route("/admin/pins", guarded(pins["list_pins"]), methods=["GET"]),
        Route("/admin/pins/{server}/approve", guarded(pins["approve_pins"]), methods=["POST"]),
        Route("/admin/pins/{server}/{tool:path}", guarded(pins["diff_pin"]), methods=["GET"]),
        Route("/admin/servers", guarded(list_servers), methods=["GET"]),
        Route("/admin/servers", guarded(add_server), methods=["POST"]),
        Route("/admin/servers/{name}", guarded(get_server), methods=["GET"]),
        Route("/admin/servers/{name}", guarded(remove_server), methods=["DELETE"]),
        Route("/admin/servers/{name}/reconnect", guarded(reconnect), methods=["POST"]),
        Route("/admin/reconcile", guarded(reconcile), methods=["POST"]),
        Route("/admin/reload", guarded(reload_config), methods=["POST"]),
    ]
