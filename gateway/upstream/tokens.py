"""Access tokens for upstream servers, from their OAuth credentials (RFC 6749 client credentials or refresh token,
with RFC 8707 resource indicators).

A `TokenSource` hands out the access token for one credential and resource: obtained at connect, renewed
shortly before it expires, and renewed at once when the server refuses it (HTTP 401). Renewal is single-flight
per credential: one at a time in the process (a lock), and, when tokens are kept in the store, one at a time
across every replica sharing it (a store lock). Whoever waited re-reads what the holder got instead of asking
again: two refreshes of one rotating refresh token would lose the login (an authorization server that sees a
used refresh token again revokes the whole grant).

What is kept where: with `oauth_key` set, a credential's refresh token and access tokens are sealed (AES-GCM,
`gateway.store.sealing`) in the store as the record `oauth/<credential>`, so replicas share them; without it, client
credentials tokens live in this process only, and refresh tokens cannot be kept at all. Tokens are never
logged, counted by value, or shown.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
import httpx2

from gateway.config.credentials import OAuthParams
from gateway.observe import tracing
from gateway.observe.logs import get_logger
from gateway.observe.metrics import Metrics
from gateway.protocol.errors import NoToken
from gateway.protocol.oauthmeta import metadata_urls
from gateway.store import Store, StoreError, held
from gateway.store.memory import MemoryStore
from gateway.store.sealing import Sealer, SealError

log = get_logger("tokens")
Json = dict[str, Any]
KIND = "oauth"  # the store's records of OAuth credentials, one per credential
TIMEOUT = 15.0  # seconds for one token endpoint request
LOCK_TTL = 30.0  # a store lock outlives a renewal (TIMEOUT), and frees itself should its holder die
LOCK_WAIT = 40.0
DEFAULT_LIFETIME = 3600.0  # when the token endpoint does not say (`expires_in`)
MAX_DOCUMENT = 256 * 1024


@dataclass(frozen=True)
class Token:
    """An access token and when it stops being good (the wall clock, shared by replicas through the store)."""

    value: str
    issued: float
    expires: float

    def __repr__(self) -> str:
        return f"Token(expires={self.expires})"

    def fresh(self, now: float) -> bool:
        """Good for a while yet: renewal starts a fifth of its lifetime (at most a minute) before it expires."""
        margin = min(60.0, (self.expires - self.issued) / 5)
        return now < self.expires - margin

    def stored(self) -> Json:
        return {"access_token": self.value, "issued": self.issued, "expires": self.expires}

    @classmethod
    def from_stored(cls, value: Any) -> Token | None:
        if not isinstance(value, dict):
            return None
        token, issued, expires = value.get("access_token"), value.get("issued"), value.get("expires")
        if isinstance(token, str) and isinstance(issued, int | float) and isinstance(expires, int | float):
            return cls(token, float(issued), float(expires))
        return None


@dataclass(frozen=True)
class Grant:
    """What a token endpoint answered: the access token, and a new refresh token when it rotates them."""

    token: Token
    refresh_token: str | None


class Tokens:
    """Every token source of the process, the locks of each credential, and where tokens are kept."""

    def __init__(
        self,
        store: Store | None = None,
        key: str | None = None,
        metrics: Metrics | None = None,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.store: Store = store or MemoryStore()
        self.transport = transport  # how token endpoints are reached (tests put a fake one here)
        self.sealer = Sealer(key) if key else None
        self.metrics = metrics
        self._sources: dict[OAuthParams, TokenSource] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._metadata: dict[str, Json] = {}
        self.unsaved: dict[str, Json] = {}  # records the store could not take yet (credential -> record)

    @property
    def kept(self) -> bool:
        """Whether tokens are kept (sealed) in the store, shared by the replicas using it."""
        return self.sealer is not None

    def source(self, params: OAuthParams) -> TokenSource:
        """The one token source of these parameters (a credential, for one resource)."""
        source = self._sources.get(params)
        if source is None:
            source = self._sources[params] = TokenSource(params, self)
        return source

    def lock(self, credential: str) -> anyio.Lock:
        """The process's lock of one credential: its renewals happen one at a time."""
        lock = self._locks.get(credential)
        if lock is None:
            lock = self._locks[credential] = anyio.Lock()
        return lock

    async def read(self, credential: str) -> Json:
        """A credential's kept record, opened (empty when there is none). Raises `StoreError`, `SealError`."""
        assert self.sealer is not None
        loaded = await self.store.records(KIND)
        if credential in loaded.bad:
            raise SealError(f"the stored record is unreadable ({loaded.bad[credential]})")
        record = loaded.servers.get(credential)
        return {} if record is None else self.sealer.open(record, f"{KIND} {credential}")

    async def write(self, credential: str, value: Json) -> None:
        """Seal and keep a credential's record. Raises `StoreError`."""
        assert self.sealer is not None
        await self.store.put_record(KIND, credential, self.sealer.seal(value, f"{KIND} {credential}"))

    async def endpoint(self, params: OAuthParams, which: str) -> str:
        """The `token_endpoint` or `authorization_endpoint`: configured, or from the issuer's metadata. Raises
        `NoToken`."""
        configured = params.token_url if which == "token_endpoint" else params.authorization_url
        if configured is not None:
            return configured
        assert params.issuer is not None  # the config asks for an issuer where an endpoint is not given
        metadata = self._metadata.get(params.issuer)
        if metadata is None:
            metadata = self._metadata[params.issuer] = await discover(params.issuer, self.transport)
        url = metadata.get(which)
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise NoToken(f"the metadata of {params.issuer} names no {which}")
        return url

    async def request(self, params: OAuthParams, form: dict[str, str]) -> Grant:
        """POST one grant to the token endpoint, authenticated as the client. Raises `NoToken` saying why. With
        tracing on, in an `oauth.token` span (its credential and grant; never a secret or a token)."""
        tracer = tracing.ACTIVE
        if tracer is None:
            return await self._request(params, form)
        attributes = {"manifold.credential": params.credential, "manifold.grant": form["grant_type"]}
        with tracer.internal("oauth.token", attributes):
            return await self._request(params, form)

    async def _request(self, params: OAuthParams, form: dict[str, str]) -> Grant:
        grant = form["grant_type"]
        token_url = await self.endpoint(params, "token_endpoint")
        body = dict(form)
        headers = {"Accept": "application/json"}
        if params.scopes and grant != "authorization_code":
            body["scope"] = " ".join(params.scopes)
        if params.resource is not None:
            body["resource"] = params.resource
        if params.method == "client_secret_basic":
            assert params.client_secret is not None  # RFC 6749 2.3.1: each part form-encoded first
            pair = f"{quote(params.client_id, safe='')}:{quote(params.client_secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            body["client_id"] = params.client_id
            if params.method == "client_secret_post":
                assert params.client_secret is not None
                body["client_secret"] = params.client_secret
        outcome = "error"
        try:
            async with httpx2.AsyncClient(timeout=TIMEOUT, follow_redirects=False, transport=self.transport) as http:
                response = await http.post(token_url, data=body, headers=headers)
            answer = _json(response)
            if response.status_code == 200:
                issued = time.time()
                token = answer.get("access_token")
                kind = answer.get("token_type", "Bearer")
                if not isinstance(token, str) or not token or not isinstance(kind, str):
                    raise NoToken(f"the token endpoint's answer has no access_token ({_where(token_url)})")
                if kind.lower() != "bearer":
                    raise NoToken(f"the token endpoint handed out a {kind[:40]!r} token; only Bearer tokens are used")
                lifetime = answer.get("expires_in")
                if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
                    lifetime = DEFAULT_LIFETIME
                refresh = answer.get("refresh_token")
                outcome = "ok"
                return Grant(
                    Token(token, issued, issued + float(lifetime)), refresh if isinstance(refresh, str) else None
                )
            if response.status_code in (400, 401) and isinstance(answer.get("error"), str):
                outcome = "refused"
                raise NoToken(f"the authorization server refused the {grant} grant ({_oauth_error(answer)})")
            raise NoToken(f"the token endpoint {_where(token_url)} answered HTTP {response.status_code}")
        except httpx2.HTTPError as e:
            raise NoToken(f"cannot reach the token endpoint {_where(token_url)} ({type(e).__name__})") from None
        finally:
            if self.metrics is not None:
                self.metrics.count_token_request(params.credential, grant, outcome)


class TokenSource:
    """The access token of one credential for one resource: obtained, kept fresh, renewed when refused."""

    def __init__(self, params: OAuthParams, tokens: Tokens) -> None:
        self.params = params
        self._tokens = tokens
        self._current: Token | None = None

    def __repr__(self) -> str:
        return f"TokenSource({self.params!r})"

    async def token(self) -> str:
        """A good access token: the one held while it is fresh, else a renewed one. Raises `NoToken`."""
        current = self._current
        if current is not None and current.fresh(time.time()):
            return current.value
        return await self._renew(None)

    async def refused(self, value: str) -> str:
        """The server refused `value` (HTTP 401): the token to try once more, renewed unless another task or
        replica has renewed it meanwhile. Raises `NoToken`."""
        if self._tokens.metrics is not None:
            self._tokens.metrics.count_token_refusal(self.params.credential)
        log.info("upstream refused the access token; renewing it", credential=self.params.credential)
        return await self._renew(value)

    async def _renew(self, refused: str | None) -> str:
        credential = self.params.credential
        async with self._tokens.lock(credential):
            current = self._current
            if current is not None and current.value != refused and current.fresh(time.time()):
                return current.value  # another task renewed it while this one waited
            if self._tokens.kept:
                token = await self._renew_kept(refused)
            elif self.params.grant == "refresh_token":
                raise NoToken(f"credential {credential!r}: refresh tokens are kept only with `oauth_key` set")
            else:
                token = await self._obtain({})
            self._current = token
            return token.value

    async def _renew_kept(self, refused: str | None) -> Token:
        """Renew under the store lock: what another replica got meanwhile is taken; else a new grant is kept."""
        credential, slot, tokens = self.params.credential, self.params.slot, self._tokens
        try:
            async with held(tokens.store, f"{KIND}:{credential}", LOCK_TTL, LOCK_WAIT):
                unsaved = tokens.unsaved.pop(credential, None)
                record = unsaved if unsaved is not None else await self._read_kept()
                access = record.get("access")
                kept = Token.from_stored(access.get(slot)) if isinstance(access, dict) else None
                if kept is not None and kept.value != refused and kept.fresh(time.time()):
                    if unsaved is not None:
                        await self._keep(record)
                    return kept
                token = await self._obtain(record)
                await self._keep(record)
                return token
        except StoreError as e:
            if self.params.grant == "refresh_token":
                raise NoToken(f"credential {credential!r}: the store is unavailable ({e})") from None
            log.warning("the store is unavailable; client credentials token kept in this process", reason=str(e))
            return await self._obtain({})

    async def _read_kept(self) -> Json:
        credential = self.params.credential
        try:
            return await self._tokens.read(credential)
        except SealError as e:
            if self.params.grant == "refresh_token":
                raise NoToken(
                    f"credential {credential!r}: the kept refresh token cannot be read: {e}; run `manifold auth "
                    "login` again"
                ) from None
            log.warning("kept tokens cannot be read; replaced", credential=credential, reason=str(e))
            return {}

    async def _keep(self, record: Json) -> None:
        """Keep a credential's record in the store; while the store cannot take it, this process holds it (a
        rotated refresh token must not be lost) and the next renewal tries again."""
        credential = self.params.credential
        try:
            await self._tokens.write(credential, record)
        except StoreError as e:
            self._tokens.unsaved[credential] = record
            log.error(
                "the store is unavailable; the credential's new tokens are held in this process until it is back",
                credential=credential,
                reason=str(e),
            )

    async def _obtain(self, record: Json) -> Token:
        """A new grant; `record` (the credential's kept record) takes the new tokens."""
        params = self.params
        if params.grant == "refresh_token":
            refresh = record.get("refresh_token")
            if not isinstance(refresh, str):
                raise NoToken(
                    f"credential {params.credential!r} has no refresh token yet: run `manifold auth login SERVER` "
                    "for a server that uses it"
                )
            try:
                grant = await self._tokens.request(params, {"grant_type": "refresh_token", "refresh_token": refresh})
            except NoToken as e:
                if "invalid_grant" in str(e):
                    raise NoToken(f"{e}; run `manifold auth login SERVER` again") from None
                raise
            if grant.refresh_token is not None:
                record["refresh_token"] = grant.refresh_token  # rotated: the old one is spent
        else:
            grant = await self._tokens.request(params, {"grant_type": "client_credentials"})
        access = record.setdefault("access", {})
        if isinstance(access, dict):
            access[params.slot] = grant.token.stored()
        log.info(
            "upstream access token obtained",
            credential=params.credential,
            grant=params.grant,
            lifetime_s=round(grant.token.expires - grant.token.issued),
            kept="store" if self._tokens.kept else "process",
        )
        return grant.token


class BearerAuth(httpx2.Auth):
    """The SDK's HTTP requests to a server carry its access token; a 401 renews it and sends the request once more
    (the server refused the request, so it did not run)."""

    def __init__(self, source: TokenSource) -> None:
        self._source = source

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        token = await self._source.token()
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            token = await self._source.refused(token)
            request.headers["Authorization"] = f"Bearer {token}"
            yield request


async def discover(issuer: str, transport: httpx2.AsyncBaseTransport | None = None) -> Json:
    """The issuer's authorization server metadata (RFC 8414), else its OpenID configuration; it must name the issuer.
    Raises `NoToken`."""
    places = metadata_urls(issuer)
    problems = []
    async with httpx2.AsyncClient(timeout=TIMEOUT, follow_redirects=False, transport=transport) as http:
        for url in places:
            try:
                response = await http.get(url, headers={"Accept": "application/json"})
            except httpx2.HTTPError as e:
                problems.append(f"{url}: {type(e).__name__}")
                continue
            metadata = _json(response) if response.status_code == 200 else {}
            if metadata.get("issuer") != issuer:
                problems.append(f"{url}: HTTP {response.status_code}" if not metadata else f"{url}: another issuer")
                continue
            return metadata
    raise NoToken("no usable authorization server metadata: " + "; ".join(problems))


def _json(response: httpx2.Response) -> Json:
    if len(response.content) > MAX_DOCUMENT:
        return {}
    try:
        value = json.loads(response.content)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _oauth_error(answer: Mapping[str, Any]) -> str:
    """`error: error_description` of an OAuth error answer, short and printable."""
    text = str(answer.get("error"))[:80]
    description = answer.get("error_description")
    if isinstance(description, str) and description:
        text += f": {description[:200]}"
    return "".join(c if c.isprintable() else "?" for c in text)


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
