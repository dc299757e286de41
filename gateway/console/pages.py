"""The console's pages and actions. Each reads or changes the gateway through the admin API's own functions
(`describe_server`, `standing`, `pin_diff`, `approve_tools`, `Runtime.add`/`remove`, `reconnect_server`), so
the page and the API cannot disagree; neither shows a header, an env value, a credential or a token."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from gateway.admin.api import describe_server, read_capped, reconnect_server
from gateway.admin.pins import PinRefusal, approve_tools, pin_diff, standing
from gateway.admin.servers import Runtime, RuntimeError_
from gateway.console.diff import side_by_side
from gateway.console.rates import CallRates
from gateway.console.sessions import (
    COOKIE,
    LIFETIME,
    PREFIX,
    SIGN_IN_COOKIE,
    SIGN_IN_LIFETIME,
    Session,
    Sessions,
    clear_cookie,
    same,
    set_cookie,
    sign_in_token,
)
from gateway.core.registry import Registry
from gateway.observe.callfeed import CallFeed
from gateway.observe.logs import get_logger
from gateway.policy.pins import given_digest
from gateway.upstream.workerpool import WorkerPool

log = get_logger("console")
MAX_FORM = 64 * 1024
KEEP_ALIVE = 15.0  # seconds between comments on an idle event stream
RECENT_ERRORS = 10
ADD_FIELDS = ("name", "url", "transport", "credential", "prefix", "trusted", "pin", "options")
Page = Callable[[Request, Session], Awaitable[Response]]
Action = Callable[[Request, Session, dict[str, str]], Awaitable[Response]]


class Refused(Exception):
    """A request the console does not carry out: a status and a sentence for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def clock(at: float) -> str:
    """A time of day, UTC, to the second."""
    return time.strftime("%H:%M:%SZ", time.gmtime(at))


def moment(iso: str) -> str:
    """An ISO 8601 UTC time as the pages show it: `2026-01-31 12:00:00Z`."""
    return iso.replace("T", " ").replace("+00:00", "Z")


class Console:
    """The pages, bound to one gateway's registry, runtime servers, call feed and admin token."""

    def __init__(
        self, registry: Registry, runtime: Runtime, feed: CallFeed, token: str, credentials: list[str]
    ) -> None:
        self.registry, self.runtime, self.feed = registry, runtime, feed
        self.sessions = Sessions(token)
        self.rates = CallRates(registry.metrics)
        self.credentials = credentials
        self.env = Environment(
            loader=PackageLoader("gateway.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["clock"] = clock
        self.env.filters["moment"] = moment

    # -- plumbing

    def render(self, template: str, session: Session | None, *, status: int = 200, **context: Any) -> HTMLResponse:
        """A page of the console, with the navigation and the session's CSRF token."""
        body = self.env.get_template(template).render(
            prefix=PREFIX,
            csrf=session.csrf if session is not None else "",
            signed_in=session is not None,
            waiting=len(self.registry.catalog.held),
            **context,
        )
        return HTMLResponse(body, status_code=status)

    def page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        """A GET page: a request without a live session is sent to the sign-in form."""

        async def serve(request: Request) -> Response:
            session = self.sessions.find(request)
            if session is None:
                return RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
            try:
                return await handler(request, session)
            except Refused as e:
                return self.render("refused.html", session, status=e.status, message=e.message)

        return serve

    def action(self, handler: Action) -> Callable[[Request], Awaitable[Response]]:
        """A POST: refused unless it comes from the console's own page (Sec-Fetch-Site), with a live session and
        that session's CSRF token in its form."""

        async def serve(request: Request) -> Response:
            session = self.sessions.find(request)
            if session is None:
                return RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
            try:
                form = await self.form(request)
                if not same(form.get("csrf", ""), session.csrf):
                    log.warning("console request refused: no valid CSRF token", path=request.url.path)
                    raise Refused(403, "This form has expired or did not come from the console. Reload the page.")
                return await handler(request, session, form)
            except Refused as e:
                return self.render("refused.html", session, status=e.status, message=e.message)

        return serve

    async def form(self, request: Request) -> dict[str, str]:
        """The fields of a URL-encoded form posted from the console's own pages."""
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise Refused(403, "Forms are accepted from the console's own pages only.")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            raise Refused(415, "The console accepts URL-encoded forms only.")
        raw = await read_capped(request, MAX_FORM)
        if raw is None:
            raise Refused(413, f"The form is over {MAX_FORM} bytes.")
        try:
            return dict(parse_qsl(raw.decode(), keep_blank_values=True, max_num_fields=64))
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "The form could not be read.") from None

    # -- signing in and out

    async def sign_in_form(self, request: Request) -> Response:
        if self.sessions.find(request) is not None:
            return RedirectResponse(f"{PREFIX}/", status_code=303)
        return self._sign_in_page(request)

    def _sign_in_page(self, request: Request, *, error: str | None = None, status: int = 200) -> Response:
        token = sign_in_token(request)
        response = self.render("sign_in.html", None, status=status, sign_in_csrf=token, error=error)
        set_cookie(response, request, SIGN_IN_COOKIE, token, SIGN_IN_LIFETIME)
        return response

    async def sign_in(self, request: Request) -> Response:
        try:
            form = await self.form(request)
        except Refused as e:
            return self.render("refused.html", None, status=e.status, message=e.message)
        expected = request.cookies.get(SIGN_IN_COOKIE, "")
        if not expected or not same(form.get("csrf", ""), expected):
            log.warning("console sign-in refused: no valid CSRF token")
            return self._sign_in_page(request, error="The form had expired; try again.", status=403)
        if not self.sessions.token_matches(form.get("token", "")):
            log.warning("console sign-in refused: wrong admin token")
            return self._sign_in_page(request, error="That is not the admin token.", status=401)
        session = self.sessions.open()
        log.info("console signed in")
        response = RedirectResponse(f"{PREFIX}/", status_code=303)
        set_cookie(response, request, COOKIE, session.id, int(LIFETIME))
        clear_cookie(response, request, SIGN_IN_COOKIE)
        return response

    async def sign_out(self, request: Request, session: Session, _: dict[str, str]) -> Response:
        self.sessions.close(session)
        response = RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
        clear_cookie(response, request, COOKIE)
        return response

    # -- overview

    async def overview(self, request: Request, session: Session) -> Response:
        registry = self.registry
        servers = [
            {**describe_server(u, registry), "held": registry.catalog.held_of(u.name)}
            for u in sorted(registry.upstreams.values(), key=lambda u: u.name)
        ]
        pools = sorted((u for u in registry.upstreams.values() if isinstance(u, WorkerPool)), key=lambda p: p.name)
        workers = [{"server": pool.name, **link} for pool in pools for link in pool.describe_links()]
        sessions = registry.metrics.registry.get_sample_value("manifold_downstream_sessions") or 0
        return self.render(
            "overview.html",
            session,
            servers=servers,
            catalog={
                "served": registry.catalog.served,
                "held": len(registry.catalog.held),
                "prompts": len(registry.catalog.prompts),
            },
            sessions=int(sessions),
            workers=workers,
            rates=self.rates.now(),
            store=self.runtime.health,
            bad_rows=sorted(self.runtime.bad_rows),
            watchers=self.feed.watchers,
        )

    # -- one server

    def _server_context(self, name: str) -> dict[str, Any]:
        registry = self.registry
        upstream = registry.upstreams.get(name)
        if upstream is None:
            raise Refused(404, f"There is no server named {name!r}.")
        described = describe_server(upstream, registry, with_tools=True)
        labels = {e.public: e.labels.names() for e in registry.catalog.offered(name)}
        tools = [{**row, "labels": labels.get(row["public"] or "", [])} for row in standing(registry, name)]
        prompts = [
            {"public": public, "name": entry.original, "description": entry.tool.get("description") or ""}
            for public, entry in registry.catalog.prompts.items()
            if entry.server == name
        ]
        offers = upstream.offers
        resources = [{"uri": r.get("uri", ""), "name": r.get("name", "")} for r in offers.resources]
        resources += [{"uri": t.get("uriTemplate", ""), "name": t.get("name", "")} for t in offers.templates]
        failed = [e for e in reversed(self.feed.recent) if e.server == name and e.outcome != "ok"]
        return {
            "server": described,
            "tools": tools,
            "prompts": prompts,
            "resources": resources,
            "degraded": described.get("degraded", {}),
            "failed_calls": failed[:RECENT_ERRORS],
        }

    async def server(self, request: Request, session: Session) -> Response:
        context = self._server_context(request.path_params["name"])
        return self.render("server.html", session, **context, **_notice(request))

    async def reconnect(self, request: Request, session: Session, _: dict[str, str]) -> Response:
        name = request.path_params["name"]
        try:
            reconnect_server(self.registry, name)
        except RuntimeError_ as e:
            if e.status == 404:
                raise Refused(404, e.errors[0]) from None
            return self.render("server.html", session, status=e.status, error=e.errors[0], **self._server_context(name))
        log.info("console reconnect", server=name)
        return _back(f"/servers/{name}", "reconnecting", name)

    # -- pins waiting

    def _pins_context(self) -> dict[str, Any]:
        waiting = []
        for name in sorted(self.registry.upstreams):
            for row in standing(self.registry, name):
                if row["status"] in ("changed", "new"):
                    diff = pin_diff(self.registry, name, row["tool"])
                    pinned, offered = diff["pinned"], diff["offered"]
                    rows = side_by_side(
                        pinned["definition"] if pinned else None, offered["definition"] if offered else None
                    )
                    waiting.append({**row, "diff": diff, "rows": rows})
        return {"held_tools": waiting}

    async def pins(self, request: Request, session: Session) -> Response:
        return self.render("pins.html", session, **self._pins_context(), **_notice(request))

    async def approve(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        server, tool = request.path_params["server"], form.get("tool", "")
        reviewed = given_digest(form.get("digest", ""))
        if not tool or reviewed is None:
            raise Refused(400, "An approval names the tool and the digest of the definition reviewed.")
        try:
            await approve_tools(self.registry, server, [tool], {tool: reviewed})
        except PinRefusal as e:
            return self.render("pins.html", session, status=e.status, error=e.message, **self._pins_context())
        log.info("console approved a tool", server=server, tool=tool, digest=reviewed)
        return _back("/pins", "approved", f"{server}/{tool}")

    # -- runtime servers

    def _runtime_context(self, values: dict[str, str] | None = None) -> dict[str, Any]:
        servers = [
            describe_server(u, self.registry) for u in sorted(self.registry.upstreams.values(), key=lambda u: u.name)
        ]
        return {
            "servers": servers,
            "credentials": self.credentials,
            "values": values or {},
            "field_errors": {},
            "errors": [],
            "stdio": self.runtime.settings.runtime.stdio,
        }

    async def runtime_page(self, request: Request, session: Session) -> Response:
        return self.render("runtime.html", session, **self._runtime_context(), **_notice(request))

    async def add(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        values = {k: form.get(k, "").strip() for k in ADD_FIELDS}
        context = self._runtime_context(values)
        try:
            body = _add_body(values)
            spec = await self.runtime.add(body)
        except RuntimeError_ as e:
            context["field_errors"], context["errors"] = _by_field(e)
            return self.render("runtime.html", session, status=e.status, **context)
        log.info("console added a runtime server", server=spec.name)
        return _back("/runtime", "added", spec.name)

    async def remove(self, request: Request, session: Session, _: dict[str, str]) -> Response:
        name = request.path_params["name"]
        try:
            await self.runtime.remove(name)
        except RuntimeError_ as e:
            context = self._runtime_context()
            context["errors"] = e.errors
            return self.render("runtime.html", session, status=e.status, **context)
        log.info("console removed a runtime server", server=name)
        return _back("/runtime", "removed", name)

    # -- live calls

    async def calls(self, request: Request, session: Session) -> Response:
        return self.render("calls.html", session, recent=list(reversed(self.feed.recent)))

    async def call_events(self, request: Request, session: Session) -> Response:
        return StreamingResponse(
            self._events(session),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},
        )

    async def _events(self, session: Session) -> AsyncIterator[str]:
        """`ready` once subscribed, then each call as a `call` event; `dropped` says how many this reader missed
        while it was slow. Ends when the session does."""
        with self.feed.subscribe() as subscription:
            yield "retry: 3000\nevent: ready\ndata: {}\n\n"  # subscribed: no call from now on is missed
            while self.sessions.get(session.id) is not None:
                events = await subscription.next(KEEP_ALIVE)
                if not events:
                    yield ": idle\n\n"
                    continue
                for event in events:
                    yield f"event: call\ndata: {json.dumps(event.as_json())}\n\n"
                if subscription.dropped:
                    yield f"event: dropped\ndata: {subscription.dropped}\n\n"
                    subscription.dropped = 0


def _back(path: str, done: str, subject: str) -> RedirectResponse:
    """After a change: back to a page, which says what was done."""
    return RedirectResponse(f"{PREFIX}{path}?{urlencode({'done': done, 'subject': subject})}", status_code=303)


def _notice(request: Request) -> dict[str, Any]:
    done = request.query_params.get("done", "")
    return {"done": done, "subject": request.query_params.get("subject", "")[:200]}


def _add_body(values: dict[str, str]) -> dict[str, Any]:
    """The admin API's body for the add form: the further options (a JSON object), then the fields given."""
    body: dict[str, Any] = {}
    if values["options"]:
        try:
            options = json.loads(values["options"])
        except json.JSONDecodeError as e:
            raise RuntimeError_(422, [f"options: not valid JSON: {e}"]) from None
        if not isinstance(options, dict):
            raise RuntimeError_(422, ["options: must be a JSON object of server options"])
        body.update(options)
    body["name"] = values["name"]
    for key in ("url", "transport", "credential", "prefix", "pin"):
        if values[key]:
            body[key] = values[key]
    if values["trusted"]:
        body["trusted"] = True
    return body


def _by_field(error: RuntimeError_) -> tuple[dict[str, list[str]], list[str]]:
    """The API's problems, each beside the form field it names (`url: ...`, `server.prefix: ...`), the rest apart."""
    fields: dict[str, list[str]] = {}
    others: list[str] = []
    for problem in error.errors:
        head, _, _ = problem.partition(":")
        key = head.removeprefix("server.").split(".")[0].split("[")[0]
        if (head == "server" and "server name" in problem) or error.status == 409:
            key = "name"
        if key in ADD_FIELDS:
            fields.setdefault(key, []).append(problem)
        else:
            others.append(problem)
    return fields, others
