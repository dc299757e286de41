"""`manifold auth login SERVER`: a person's OAuth grant for a server's `refresh_token` credential.

The authorization code flow with PKCE (RFC 7636) and a loopback redirect (RFC 8252): the command prints the
URL to open, waits for the browser to come back to `http://127.0.0.1:PORT/...`, checks the state (and the
issuer, RFC 9207, when the server names it), exchanges the code, and keeps the refresh token, sealed, in the
store the gateway reads. Neither token is ever printed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import sys
from contextlib import suppress
from dataclasses import dataclass
from typing import TextIO
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import anyio
import anyio.abc

from gateway.config.credentials import OAuthParams
from gateway.config.servers import ConfigError, FileConfig, resolve
from gateway.config.settings import Settings
from gateway.protocol.errors import NoToken
from gateway.store import StoreError, held, open_store
from gateway.upstream.tokens import KIND, LOCK_TTL, LOCK_WAIT, Tokens

MAX_HEAD = 16 * 1024
PAGE = "<!doctype html><meta charset=utf-8><title>manifold</title><p style='font-family:sans-serif'>{text}</p>"


class LoginFailed(Exception):
    """The login did not complete; the message says why (never a secret)."""


@dataclass
class Callback:
    """What the browser brought back to the loopback redirect."""

    query: dict[str, str]


def pkce_pair() -> tuple[str, str]:
    """A PKCE code verifier (43 characters of 32 random bytes) and its S256 challenge."""
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def login_params(settings: Settings, config: FileConfig, server: str) -> tuple[OAuthParams, list[str]]:
    """The OAuth client of `server`'s credential (which must use the refresh_token grant) and every resource its
    servers need. Raises `LoginFailed`."""
    spec = next((s for s in config.servers if s.name == server), None)
    if spec is None:
        raise LoginFailed(f"no server named {server!r} in {settings.config}")
    credential = settings.credentials.get(spec.credential) if spec.credential is not None else None
    if credential is None or credential.oauth is None or credential.oauth.grant != "refresh_token":
        raise LoginFailed(
            f"server {server!r} does not use an OAuth credential with `grant: refresh_token`; nothing to log in to"
        )
    try:
        resolved = resolve(spec, os.environ, settings.credentials)
    except ConfigError as e:
        raise LoginFailed("; ".join(e.problems)) from None
    assert resolved.oauth is not None
    resources = [resolved.oauth.resource] if resolved.oauth.resource is not None else []
    for other in config.servers:  # one grant serves every server using the credential
        if other.credential == spec.credential and other.name != server and not other.disabled:
            try:
                extra = resolve(other, os.environ, settings.credentials).oauth
            except ConfigError:
                continue
            if extra is not None and extra.resource is not None and extra.resource not in resources:
                resources.append(extra.resource)
    return resolved.oauth, resources


async def login(
    settings: Settings, config: FileConfig, server: str, *, timeout: float = 300.0, out: TextIO = sys.stdout
) -> None:
    """Run the whole flow for `server` and keep the refresh token. Raises `LoginFailed`."""
    params, resources = login_params(settings, config, server)
    assert settings.oauth_key is not None and settings.store is not None  # settings insist on both for this grant
    store = open_store(settings.store.get_secret_value())
    tokens = Tokens(store, settings.oauth_key.get_secret_value())
    try:
        await store.start()
        try:
            authorize = await tokens.endpoint(params, "authorization_endpoint")
        except NoToken as e:
            raise LoginFailed(str(e)) from None
        redirect = urlsplit(params.redirect_uri or "http://127.0.0.1:0/callback")
        host = "::1" if redirect.hostname == "::1" else "127.0.0.1"
        listener = await anyio.create_tcp_listener(local_host=host, local_port=redirect.port or 0)
        async with listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            netloc = f"[::1]:{port}" if host == "::1" else f"{redirect.hostname}:{port}"
            redirect_uri = urlunsplit(("http", netloc, redirect.path or "/", "", ""))
            verifier, challenge = pkce_pair()
            state = secrets.token_urlsafe(24)
            query: list[tuple[str, str]] = [
                ("response_type", "code"),
                ("client_id", params.client_id),
                ("redirect_uri", redirect_uri),
                ("state", state),
                ("code_challenge", challenge),
                ("code_challenge_method", "S256"),
            ]
            if params.scopes:
                query.append(("scope", " ".join(params.scopes)))
            query += [("resource", r) for r in resources]
            separator = "&" if urlsplit(authorize).query else "?"
            print(
                f"Open this URL in a browser to sign in for credential {params.credential!r} (server {server!r}):\n\n"
                f"  {authorize}{separator}{urlencode(query)}\n\n"
                f"Waiting up to {timeout:g} s for the browser to come back to {redirect_uri} ...",
                file=out,
                flush=True,
            )
            with anyio.move_on_after(timeout) as waited:
                callback = await _wait_for_callback(listener, redirect.path or "/", state, params.issuer)
            if waited.cancelled_caught:
                raise LoginFailed(f"no redirect came back within {timeout:g} s")
        code = callback.query["code"]
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
        form["code_verifier"] = verifier
        try:
            grant = await tokens.request(params, form)
        except NoToken as e:
            raise LoginFailed(str(e)) from None
        if grant.refresh_token is None:
            raise LoginFailed(
                "the authorization server issued no refresh token (may the client use the refresh_token grant? "
                "some servers also want the offline_access scope)"
            )
        record = {
            "refresh_token": grant.refresh_token,
            "client_id": params.client_id,
            "access": {params.slot: grant.token.stored()},
        }
        try:
            async with held(store, f"{KIND}:{params.credential}", LOCK_TTL, LOCK_WAIT):
                await tokens.write(params.credential, record)
        except StoreError as e:
            raise LoginFailed(f"the refresh token could not be stored: {e}") from None
        print(
            f"Signed in. The refresh token of credential {params.credential!r} is stored, sealed with oauth_key, in "
            f"the {store.kind} store; the gateway uses it from its next connection to {server!r}.",
            file=out,
            flush=True,
        )
    finally:
        await store.close()


async def _wait_for_callback(
    listener: anyio.abc.Listener[anyio.abc.SocketStream], path: str, state: str, issuer: str | None
) -> Callback:
    """Serve the loopback redirect until the browser brings back this flow's answer. Raises `LoginFailed` for an
    error answer; requests for other paths or states are answered and ignored."""
    result: list[Callback | LoginFailed] = []
    done = anyio.Event()

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = b""
            with anyio.move_on_after(10):
                while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                    try:
                        head += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
            line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            target = urlsplit(line[1]) if len(line) == 3 and line[0] == "GET" else None
            if target is None or target.path != path or done.is_set():
                await _respond(stream, 404, "Not found.")
                return
            query = {k: v[0] for k, v in parse_qs(target.query).items()}
            if not hmac.compare_digest(query.get("state", ""), state):
                await _respond(stream, 400, "This answer belongs to another sign-in; it was ignored.")
                return
            answer: Callback | LoginFailed
            if "error" in query:
                why = query["error"][:80] + (
                    f": {query['error_description'][:200]}" if "error_description" in query else ""
                )
                answer = LoginFailed(f"the authorization server refused: {_printable(why)}")
            elif issuer is not None and "iss" in query and query["iss"] != issuer:
                answer = LoginFailed("the answer names another issuer (RFC 9207); ignored")
            elif not query.get("code"):
                answer = LoginFailed("the redirect carries no code")
            else:
                answer = Callback(query)
            ok = isinstance(answer, Callback)
            await _respond(stream, 200 if ok else 400, "Signed in: you can close this window." if ok else str(answer))
            result.append(answer)
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        await done.wait()
        tg.cancel_scope.cancel()
    answer = result[0]
    if isinstance(answer, LoginFailed):
        raise answer
    return answer


async def _respond(stream: anyio.abc.SocketStream, status: int, text: str) -> None:
    body = PAGE.format(text=text.replace("&", "&amp;").replace("<", "&lt;")).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {len(body)}\r\n"
    head += "cache-control: no-store\r\nconnection: close\r\n\r\n"
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(head.encode() + body)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)
