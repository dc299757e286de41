"""The operator's console at `/admin/ui`: server-rendered pages over the admin API's functions, behind the
admin token (see `sessions.py`), served only when the admin API is on."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.admin.servers import Runtime
from gateway.console.headers import SecurityHeaders
from gateway.console.pages import Console
from gateway.console.sessions import PREFIX
from gateway.core.registry import Registry
from gateway.observe.callfeed import CallFeed


async def _to_overview(_: Request) -> Response:
    return RedirectResponse(f"{PREFIX}/", status_code=307)


def console_routes(registry: Registry, runtime: Runtime, token: str) -> list[BaseRoute]:
    """The console, mounted at `PREFIX`; it follows the registry's tool calls from now on."""
    feed = CallFeed()
    registry.metrics.on_call = feed.record
    console = Console(registry, runtime, feed, token, sorted(runtime.settings.credentials))
    page, action = console.page, console.action
    routes = [
        Route("/", page(console.overview), methods=["GET"]),
        Route("/sign-in", console.sign_in_form, methods=["GET"]),
        Route("/sign-in", console.sign_in, methods=["POST"]),
        Route("/sign-out", action(console.sign_out), methods=["POST"]),
        Route("/servers/{name}", page(console.server), methods=["GET"]),
        Route("/servers/{name}/reconnect", action(console.reconnect), methods=["POST"]),
        Route("/pins", page(console.pins), methods=["GET"]),
        Route("/pins/{server}/approve", action(console.approve), methods=["POST"]),
        Route("/runtime", page(console.runtime_page), methods=["GET"]),
        Route("/runtime", action(console.add), methods=["POST"]),
        Route("/runtime/{name}/remove", action(console.remove), methods=["POST"]),
        Route("/calls", page(console.calls), methods=["GET"]),
        Route("/calls/events", page(console.call_events), methods=["GET"]),
        Mount("/static", StaticFiles(packages=[("gateway.console", "static")])),
    ]
    app = SecurityHeaders(Starlette(routes=routes), f"{PREFIX}/static/")
    return [Route(PREFIX, _to_overview, methods=["GET"]), Mount(PREFIX, app=app)]
