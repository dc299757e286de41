"""`manifold serve | check | tools | servers | pins | worker`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any
from urllib.parse import quote

import anyio

from gateway import __version__
from gateway.catalog.search import ModelUnavailable, load_model
from gateway.config.credentials import credential_variables, use_problems
from gateway.config.servers import ConfigError, FileConfig, ServerSpec, missing_variables
from gateway.config.settings import Settings, load
from gateway.upstream.sandbox import check as check_sandbox
from gateway.upstream.sandbox import use_default


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="manifold", description="An MCP aggregating gateway.")
    parser.add_argument("--version", action="version", version=f"manifold {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="config file (default: $MANIFOLD_CONFIG or config/manifold.yaml)")
        return p

    serve = with_config(commands.add_parser("serve", help="run the gateway"))
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8080)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["auto", "json", "console"])
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="serve a non-loopback address without API tokens",
    )
    check = with_config(commands.add_parser("check", help="validate the config and report every problem"))
    check.add_argument(
        "--connect",
        action="store_true",
        help="also connect to every server: report what each offers, listings it serves without, and overrides "
        "that name no tool it offers",
    )
    tools = with_config(commands.add_parser("tools", help="connect to every server and print the merged catalog"))
    tools.add_argument("--json", action="store_true", help="print JSON")

    def with_url(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        url = os.environ.get("MANIFOLD_URL", "http://127.0.0.1:8080")
        p.add_argument("--url", default=url, help="gateway URL (default: $MANIFOLD_URL or http://127.0.0.1:8080)")
        return p

    servers = with_url(commands.add_parser("servers", help="manage runtime servers through the admin API"))
    actions = servers.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every server with its state")
    add = actions.add_parser("add", help="add a runtime server")
    add.add_argument("name")
    add.add_argument("--server-url", help="the server's MCP URL")
    add.add_argument("--credential", help="name of a credential in the gateway's config")
    add.add_argument("--options", default="{}", help="further options as a JSON object")
    remove = actions.add_parser("remove", help="remove a runtime server")
    remove.add_argument("name")

    auth = commands.add_parser("auth", help="OAuth sign-in for servers whose credential uses a refresh token")
    auth_actions = auth.add_subparsers(dest="action", required=True)
    auth_login = with_config(
        auth_actions.add_parser("login", help="sign in through a browser and store the refresh token (code + PKCE)")
    )
    auth_login.add_argument("server", help="a server whose credential has `oauth: {grant: refresh_token, ...}`")
    auth_login.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the browser (300)")

    pins = with_url(commands.add_parser("pins", help="review and approve tool definitions through the admin API"))
    pin_actions = pins.add_subparsers(dest="action", required=True)
    pin_list = pin_actions.add_parser("list", help="every pinned or offered tool and how it stands")
    pin_list.add_argument("server", nargs="?")
    diff = pin_actions.add_parser("diff", help="the pinned and the offered definition of a tool, as a diff")
    diff.add_argument("server")
    diff.add_argument("tool")
    approve = pin_actions.add_parser(
        "approve", help="pin a tool as reviewed (--digest), or tools as offered now (default: every held tool)"
    )
    approve.add_argument("server")
    approve.add_argument("tools", nargs="*")
    approve.add_argument(
        "--digest", help="the offered digest `pins diff` showed: refused if the tool's definition changed since"
    )
    worker = commands.add_parser(
        "worker",
        help="offer a local stdio MCP server through a gateway that cannot reach it",
        usage="manifold worker --connect URL [--token T] [--name NAME] -- COMMAND [ARGS...]",
    )
    worker.add_argument("--connect", required=True, help="the gateway's URL, e.g. https://gateway.example:8080")
    worker.add_argument("--token", help="the worker's API token (default: $MANIFOLD_WORKER_TOKEN)")
    worker.add_argument("--name", help="the name to offer the server under (default: the command's name)")
    worker.add_argument(
        "--max-message-bytes", type=int, default=4 * 1024 * 1024, help="largest message either way (default 4 MiB)"
    )
    worker.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    worker.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    worker.add_argument("server", nargs=argparse.REMAINDER, help="the server's command and arguments, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `manifold` command."""
    args = _parser().parse_args(argv)
    if args.command == "servers":
        return _servers(args)
    if args.command == "pins":
        return _pins(args)
    if args.command == "auth":
        return _auth(args)
    if args.command == "worker":
        return _worker(args)
    cli = {k: v for k, v in vars(args).items() if k not in ("command", "json", "connect")}
    try:
        settings, config = load(cli)
    except ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    use_default(settings.sandbox)
    if args.command == "serve":
        return _serve(settings, config)
    if args.command == "check":
        status = _check(settings, config)
        return anyio.run(_check_offers, settings, config) if status == 0 and args.connect else status
    return anyio.run(_tools, settings, config, args.json)


def _auth(args: argparse.Namespace) -> int:
    from gateway.cli.login import LoginFailed, login

    try:
        settings, config = load({"config": args.config})
    except ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        anyio.run(lambda: login(settings, config, args.server, timeout=args.timeout))
    except LoginFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _serve(settings: Settings, config: FileConfig) -> int:
    from gateway.cli.serve import Unsafe, serve
    from gateway.observe.logs import configure

    configure(settings.log_level, settings.log_format)
    try:
        serve(settings, config)
    except (Unsafe, ModelUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:  # the tracing or audit settings, found wanting when the app is built
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


def _worker(args: argparse.Namespace) -> int:
    from gateway.cli.worker import run_worker
    from gateway.observe.logs import configure

    configure(args.log_level, args.log_format)
    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    return run_worker(args.connect, args.token, command, name=args.name, max_message_bytes=args.max_message_bytes)


def _check(settings: Settings, config: FileConfig) -> int:
    problems = [
        f"servers.{spec.name}.{problem}"
        for spec in config.servers
        if not spec.disabled
        for problem in missing_variables(spec, os.environ)
    ]
    used: dict[str, None] = {}
    for spec in config.servers:
        if spec.credential is None:
            continue
        credential = settings.credentials.get(spec.credential)
        problems += use_problems(spec, spec.credential, credential, f"servers.{spec.name}.credential")
        if credential is not None and not spec.disabled:
            used[spec.credential] = None
    problems += [p for name in used for p in credential_variables(name, settings.credentials[name], os.environ)]
    try:
        load_model(settings.search_model)
    except ModelUnavailable as e:
        problems.append(str(e))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    enabled = [s for s in config.servers if not s.disabled]
    if sandbox_problems(enabled):
        return 1
    disabled = len(config.servers) - len(enabled)
    print(f"{settings.config}: ok ({len(enabled)} servers enabled, {disabled} disabled)")
    if settings.search_model != "none":
        print(f"tool search: lexical index fused with the {settings.search_model} embedding model")
    for name in used:
        if (client := settings.credentials[name].oauth) is None:
            continue
        where = f"tokens from {client.token_url or f'the token endpoint of {client.issuer}'}"
        if settings.oauth_key is None:
            kept = "access tokens kept in this process only (set oauth_key to share them through the store)"
        elif settings.store is None:
            kept = "access tokens kept in this process only (no `store` to share them through)"
        else:
            kept = "tokens kept sealed in the store"
        print(f"upstream oauth: credential {name!r} ({client.grant}): {where}; {kept}")
    if (oauth := settings.auth.oauth) is not None:
        keys = oauth.jwks_url or "from the issuer's metadata"
        audience = ", ".join(dict.fromkeys([settings.resource_url, *oauth.audience]))
        print(f"oauth: tokens from {oauth.issuer} (keys: {keys}) for {audience}")
        print(f"oauth: {len(oauth.rules)} rules, first match wins: {', '.join(r.name for r in oauth.rules)}")
    return 0


def sandbox_problems(specs: list[ServerSpec]) -> bool:
    """Warn of each stdio server that runs unsandboxed; True (after saying why) when sandboxed ones cannot start."""
    warnings, errors = check_sandbox(specs)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return bool(errors)


@asynccontextmanager
async def _running(settings: Settings, config: FileConfig) -> AsyncIterator[Any]:
    """The config's servers, connected; OAuth tokens come (and go) through the gateway's store as the gateway's
    would, while pins stay in this process (a look at the catalog approves nothing)."""
    from gateway.core.registry import Registry
    from gateway.store import StoreError, open_store
    from gateway.upstream.tokens import Tokens

    store = open_store(settings.store.get_secret_value() if settings.store else None)
    key = settings.oauth_key.get_secret_value() if settings.oauth_key else None
    registry = Registry(config.servers, credentials=settings.credentials, tokens=Tokens(store, key))
    try:
        with suppress(StoreError):  # then servers whose tokens live there are down, saying so
            await store.start()
        async with registry.running():
            await registry.wait_settled(max((s.startup_timeout for s in config.servers), default=0) + 2)
            yield registry
    finally:
        await store.close()


async def _check_offers(settings: Settings, config: FileConfig) -> int:
    """Connect to every server; report what each offers, what it serves without (a listing that failed), and
    each override that names no tool the server offers (a typo)."""
    from gateway.observe.logs import configure
    from gateway.protocol.errors import State

    configure("error", "console")
    problems: list[str] = []
    async with _running(settings, config) as registry:
        for upstream in registry.upstreams.values():
            if upstream.state is State.DISABLED:
                continue
            if upstream.state is not State.UP:
                print(f"warning: server {upstream.name!r} is {upstream.state.value}: {upstream.error}", file=sys.stderr)
                continue
            offers = upstream.offers
            print(
                f"server {upstream.name!r}: up ({upstream.protocol_version}), {len(offers.tools)} tools, "
                f"{len(offers.prompts)} prompts, {len(offers.resources)} resources, {len(offers.templates)} templates"
            )
            for listing, reason in offers.degraded:
                print(
                    f"warning: server {upstream.name!r} is degraded: its {listing} listing failed ({reason}); "
                    "it serves without it",
                    file=sys.stderr,
                )
            offered = {t["name"] for t in upstream.tools}
            problems += [
                f"servers.{upstream.name}.tools.{name}: the server offers no tool named {name!r}"
                for name in upstream.spec.tools
                if name not in offered
            ]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print("every override names a tool its server offers")
    return 1 if problems else 0


async def _tools(settings: Settings, config: FileConfig, as_json: bool) -> int:
    from gateway.observe.logs import configure
    from gateway.protocol.errors import State

    configure("warning", "console")
    async with _running(settings, config) as registry:
        rows: list[dict[str, Any]] = [
            {
                "name": e.public,
                "server": e.server,
                "tool": e.original,
                "labels": e.labels.names(),
            }
            for e in registry.catalog.entries.values()
        ]
        down = [u for u in registry.upstreams.values() if u.state not in (State.UP, State.DISABLED)]
    for up in down:
        print(f"warning: server {up.name!r} is {up.state.value}: {up.error}", file=sys.stderr)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        table = [("NAME", "SERVER", "TOOL", "LABELS")]
        table += [(r["name"], r["server"], r["tool"], ", ".join(r["labels"])) for r in rows]
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        for row in table:
            print("  ".join([*(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)), row[3]]))
    return 1 if down and not rows else 0


def _admin(args: argparse.Namespace, method: str, path: str, body: Any = None) -> dict[str, Any] | None:
    """One admin API request; the JSON answer, or None after printing why it failed."""
    import httpx2

    token = os.environ.get("MANIFOLD_ADMIN_TOKEN")
    if not token:
        print("error: set MANIFOLD_ADMIN_TOKEN to the gateway's admin token", file=sys.stderr)
        return None
    base = args.url.rstrip("/")
    try:
        response = httpx2.request(
            method, f"{base}{path}", headers={"Authorization": f"Bearer {token}"}, json=body, timeout=30
        )
    except httpx2.TransportError as e:
        print(f"error: cannot reach {base}: {e}", file=sys.stderr)
        return None
    answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if response.status_code >= 400:
        for line in answer.get("errors") or [answer.get("error", f"HTTP {response.status_code}")]:
            print(f"error: {line}", file=sys.stderr)
        return None
    return dict(answer)


def _servers(args: argparse.Namespace) -> int:
    if args.action == "list":
        body = _admin(args, "GET", "/admin/servers")
    elif args.action == "add":
        try:
            options = json.loads(args.options)
        except json.JSONDecodeError as e:
            print(f"error: --options is not valid JSON: {e}", file=sys.stderr)
            return 2
        if not isinstance(options, dict):
            print("error: --options must be a JSON object", file=sys.stderr)
            return 2
        if args.server_url:
            options["url"] = args.server_url
        if args.credential:
            options["credential"] = args.credential
        body = _admin(args, "POST", "/admin/servers", {"name": args.name, **options})
    else:
        body = _admin(args, "DELETE", f"/admin/servers/{quote(args.name, safe='')}")
    if body is None:
        return 1
    if args.action == "list":
        for server in body["servers"]:
            workers = f"{server['workers']} workers  " if "workers" in server else ""
            print(
                f"{server['name']:<24} {server['source']:<8} {server['transport']:<6} {server['state']:<10} "
                f"{server['tools']:>4} tools  {workers}{server['error'] or ''}".rstrip()
            )
    else:
        print(json.dumps(body, indent=2))
    return 0


def _pins(args: argparse.Namespace) -> int:
    if args.action == "list":
        query = f"?server={quote(args.server, safe='')}" if args.server else ""
        body = _admin(args, "GET", f"/admin/pins{query}")
        if body is None:
            return 1
        table = [("SERVER", "TOOL", "STATUS", "MODE", "PINNED", "OFFERED")]
        for row in body["pins"]:
            status = f"{row['status']} (held)" if row["held"] else row["status"]
            short = [(d or "-").removeprefix("sha256:")[:12] for d in (row["pinned"], row["offered"])]
            table.append((row["server"], row["tool"], status, row["mode"], *short))
        widths = [max(len(r[i]) for r in table) for i in range(5)]
        for r in table:
            print("  ".join([*(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)), r[5]]))
        return 0
    server = quote(args.server, safe="")
    if args.action == "diff":
        body = _admin(args, "GET", f"/admin/pins/{server}/{quote(args.tool, safe='')}")
        if body is None:
            return 1
        print(f"{body['server']}/{body['tool']}: {body['status']}")
        print(body["diff"] or "(the offered definition is the pinned one)", end="" if body["diff"] else "\n")
        if body["offered"] is not None and body["diff"]:
            offered = body["offered"]["digest"]
            print(f"offered: {offered}")
            print(f"approve it: manifold pins approve {args.server} {body['tool']} --digest {offered}")
        return 0
    if args.digest is not None and len(args.tools) != 1:
        print("error: --digest goes with exactly one tool (the one `pins diff` showed)", file=sys.stderr)
        return 2
    tools: Any = {args.tools[0]: args.digest} if args.digest is not None else args.tools
    body = _admin(args, "POST", f"/admin/pins/{server}/approve", {"tools": tools})
    if body is None:
        return 1
    approved = body["approved"]
    print(f"approved {len(approved)} tool(s) of {body['server']}: {', '.join(approved) or '(none held)'}")
    if body["mode"] == "off":
        print(f"note: pinning is off for {body['server']}; the pins take effect with `pin: warn` or `pin: hold`")
    return 0
