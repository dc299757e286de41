"""The gateway as an OAuth 2.1 resource server: JWT access tokens (RFC 9068) checked against the issuer's
published keys, and the protected resource metadata (RFC 9728) that tells clients where to get one.

`ResourceServer.authenticate` turns a bearer token into the caller it names (the first access rule its
claims meet, and its subject), or a `Refusal` that says what was wrong (never what the token holds).
Keys come from the issuer's JWKS, fetched with `httpx2` and kept; a token signed with a key not among
them makes the keys be fetched again, at most once per `jwks_refetch_interval`, so a flood of made-up key
ids cannot hammer the authorization server. A token that passed is remembered briefly by its SHA-256,
so a client's next requests skip the signature check.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import jwt
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.config.access import OAuthConfig, OAuthRule, scopes_of
from gateway.observe.logs import get_logger
from gateway.protocol.oauthmeta import metadata_urls

log = get_logger("oauth")
Json = dict[str, Any]

RETRY_UNAVAILABLE = 5.0  # while no keys could be fetched yet, a new try at most this often
KEYS_MAX_AGE = 600.0  # keys older than this are fetched again (a key the issuer withdrew stops working)
FETCH_TIMEOUT = 5.0
MAX_DOCUMENT = 256 * 1024  # a metadata or JWKS document larger than this is refused
REMEMBER_FOR = 60.0  # seconds a validated token is remembered (never past its expiry)
REMEMBERED = 4096  # validated tokens remembered at most
ACCEPTED_TYP = ("at+jwt", "application/at+jwt", "jwt")
PRM_PATH = "/.well-known/oauth-protected-resource"
CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}


class Refusal(Exception):
    """Why a request's bearer token is not accepted: HTTP status, OAuth error code, a reason to show (never
    the token's contents), the scope to ask for, and the outcome to count."""

    def __init__(self, status: int, error: str, reason: str, scope: str | None = None, outcome: str = "invalid"):
        super().__init__(reason)
        self.status, self.error, self.reason, self.scope, self.outcome = status, error, reason, scope, outcome


def _invalid(reason: str, outcome: str) -> Refusal:
    return Refusal(401, "invalid_token", reason, outcome=outcome)


@dataclass(frozen=True)
class Principal:
    """Who a valid token names: its subject and the rule it met."""

    subject: str
    rule: OAuthRule


def _algorithms_for(jwk: Mapping[str, Any], allowed: list[str]) -> list[str]:
    """The allowed algorithms a published key can verify: its own `alg` if it names one, else by key type."""
    if jwk.get("use") not in (None, "sig") or jwk.get("kty") == "oct":
        return []
    if isinstance(jwk.get("alg"), str):
        return [jwk["alg"]] if jwk["alg"] in allowed else []
    kty, crv = jwk.get("kty"), jwk.get("crv")
    if kty == "RSA":
        return [a for a in allowed if a[:2] in ("RS", "PS")]
    if kty == "EC":
        return [a for a in allowed if CURVES.get(a) == crv]
    if kty == "OKP" and crv in ("Ed25519", "Ed448"):
        return [a for a in allowed if a == "EdDSA"]
    return []


class Keys:
    """The issuer's signing keys, by (key id, algorithm)."""

    def __init__(self, config: OAuthConfig, fetch: Callable[[str], Any] | None = None) -> None:
        self.config = config
        self._fetch_json = fetch or _fetch_json
        self._jwks_url = config.jwks_url
        self._keys: dict[tuple[str | None, str], jwt.PyJWK] = {}
        self._fetched_at: float | None = None  # monotonic time of the last successful fetch
        self._tried_at = -math.inf  # monotonic time of the last attempt
        self._lock = anyio.Lock()
        self.on_fetch: Callable[[str], None] = lambda outcome: None

    async def candidates(self, kid: str | None, alg: str) -> list[jwt.PyJWK]:
        """The keys that may verify a token with this header (its `kid`'s, or without one every key for `alg`).

        The keys are fetched when there are none yet (at most every `RETRY_UNAVAILABLE` s), when they are
        older than `KEYS_MAX_AGE`, and when the token names a key not among them; the last two at most
        once per `jwks_refetch_interval`.
        """
        await self.ensure()
        found = self._find(kid, alg)
        may_refetch = time.monotonic() - self._tried_at >= self.config.jwks_refetch_interval
        if not found and self._fetched_at is not None and may_refetch:
            await self._refresh()
            found = self._find(kid, alg)
        if found:
            return found
        if self._fetched_at is None:
            raise Refusal(
                503, "temporarily_unavailable", "the authorization server's keys cannot be fetched", None, "no_keys"
            )
        raise _invalid("the token is signed with a key the issuer does not publish", "unknown_key")

    async def ensure(self) -> None:
        """Fetch the keys if there are none yet or they are old (within the bounds on fetches)."""
        since = time.monotonic() - self._tried_at
        if self._fetched_at is None:
            if since >= RETRY_UNAVAILABLE:
                await self._refresh()
        elif time.monotonic() - self._fetched_at > KEYS_MAX_AGE and since >= self.config.jwks_refetch_interval:
            await self._refresh()

    def _find(self, kid: str | None, alg: str) -> list[jwt.PyJWK]:
        """The key with the token's `kid`; else (no `kid`, or published keys without one) each key for `alg`."""
        if kid is not None and (key := self._keys.get((kid, alg))) is not None:
            return [key]
        return [k for (k_id, a), k in self._keys.items() if a == alg and (kid is None or k_id is None)]

    async def _refresh(self) -> None:
        attempt = self._tried_at
        async with self._lock:
            if self._tried_at != attempt:
                return  # another request fetched (or tried to) while this one waited
            self._tried_at = time.monotonic()
            try:
                keys = await self._load()
            except (OSError, httpx2.HTTPError, ValueError) as e:
                self.on_fetch("error")
                log.warning("authorization server keys not fetched", issuer=self.config.issuer, reason=str(e)[:300])
                return
            self.on_fetch("ok")
            self._keys, self._fetched_at = keys, time.monotonic()
            log.info("authorization server keys fetched", issuer=self.config.issuer, keys=len({k for k, _ in keys}))

    async def _load(self) -> dict[tuple[str | None, str], jwt.PyJWK]:
        if self._jwks_url is None:
            self._jwks_url = await self._discover()
        document = await self._fetch_json(self._jwks_url)
        published = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(published, list):
            raise ValueError(f"{self._jwks_url} is not a JWK set (no `keys` list)")
        keys: dict[tuple[str | None, str], jwt.PyJWK] = {}
        for entry in published:
            if not isinstance(entry, dict):
                continue
            kid = entry.get("kid") if isinstance(entry.get("kid"), str) else None
            for alg in _algorithms_for(entry, self.config.algorithms):
                try:
                    keys[(kid, alg)] = jwt.PyJWK(entry, algorithm=alg)
                except (jwt.PyJWKError, jwt.InvalidKeyError) as e:
                    log.warning("a published key is unusable; skipped", issuer=self.config.issuer, reason=str(e)[:200])
        if not keys:
            raise ValueError(f"{self._jwks_url} publishes no key usable with {', '.join(self.config.algorithms)}")
        return keys

    async def _discover(self) -> str:
        """The issuer's `jwks_uri`, from its authorization server metadata (RFC 8414) or OpenID configuration."""
        issuer = self.config.issuer
        problems = []
        for url in metadata_urls(issuer):
            try:
                metadata = await self._fetch_json(url)
            except (OSError, httpx2.HTTPError, ValueError) as e:
                problems.append(f"{url}: {str(e)[:200]}")
                continue
            if not isinstance(metadata, dict):
                problems.append(f"{url}: not a JSON object")
                continue
            if metadata.get("issuer") != issuer:
                problems.append(f"{url}: names the issuer {str(metadata.get('issuer'))[:200]!r}, not {issuer!r}")
                continue
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
                problems.append(f"{url}: no jwks_uri")
                continue
            return jwks_uri
        raise ValueError("no usable authorization server metadata: " + "; ".join(problems))


def _header_problem(token: bytes) -> str:
    """What is wrong with a JOSE header PyJWT refused after it parsed (a `kid` that is no string, a `crit`)."""
    try:
        header = json.loads(base64.urlsafe_b64decode(token.split(b".", 1)[0] + b"=="))
    except ValueError:
        header = {}
    if isinstance(header, dict) and "crit" in header:
        return "the token's header lists critical extensions (crit), which the gateway does not support"
    if isinstance(header, dict) and not isinstance(header.get("kid", ""), str):
        return "the token's kid header is not a string"
    return "the token's header is malformed"


async def _fetch_json(url: str) -> Any:
    """GET a JSON document (no redirects, bounded size)."""
    async with (
        httpx2.AsyncClient(timeout=FETCH_TIMEOUT, follow_redirects=False) as client,
        client.stream("GET", url, headers={"Accept": "application/json"}) as response,
    ):
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}")
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_DOCUMENT:
                raise ValueError(f"larger than {MAX_DOCUMENT} bytes")
        return json.loads(body)


@dataclass
class ResourceServer:
    """Checks access tokens for the gateway's `/mcp` (and `/mcp/NAME`) and describes it to clients."""

    config: OAuthConfig
    resource: str  # the gateway's /mcp URL, as clients reach it
    endpoints: frozenset[str] = frozenset()
    keys: Keys | None = None
    on_outcome: Callable[[str], None] = lambda outcome: None
    _remembered: dict[bytes, tuple[Json, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.keys is None:
            self.keys = Keys(self.config)
        self._audience = frozenset([*(self.config.audience or []), self.resource])  # /mcp's is good everywhere
        parts = urlsplit(self.resource)
        self._origin, self._path = f"{parts.scheme}://{parts.netloc}", parts.path

    async def warm_up(self) -> None:
        """Fetch the issuer's keys at start, so that a wrong issuer or an unreachable server shows in the log
        at once (requests fetch them again if this fails)."""
        assert self.keys is not None
        await self.keys.ensure()

    def resource_of(self, endpoint: str | None) -> str:
        """The resource identifier of `/mcp` or of a curated endpoint `/mcp/NAME`."""
        return f"{self.resource}/{endpoint}" if endpoint in self.endpoints else self.resource

    def metadata_url(self, endpoint: str | None) -> str:
        """Where the protected resource metadata of `/mcp` (or `/mcp/NAME`) is served."""
        suffix = f"/{endpoint}" if endpoint in self.endpoints else ""
        return f"{self._origin}{PRM_PATH}{self._path}{suffix}"

    def metadata(self, endpoint: str | None) -> Json:
        """The protected resource metadata (RFC 9728) of `/mcp` or of `/mcp/NAME`."""
        document: Json = {
            "resource": self.resource_of(endpoint),
            "authorization_servers": [self.config.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "Manifold MCP gateway",
        }
        if scopes := self.config.supported_scopes:
            document["scopes_supported"] = scopes
        return document

    def challenge(self, endpoint: str | None, refusal: Refusal | None = None) -> bytes:
        """A `WWW-Authenticate` value: where the metadata is, and what was wrong with the token given."""
        parts = [f'resource_metadata="{self.metadata_url(endpoint)}"']
        if refusal is not None and refusal.status in (401, 403):
            parts.append(f'error="{refusal.error}"')
            parts.append(f'error_description="{refusal.reason}"')
            if refusal.scope:
                parts.append(f'scope="{refusal.scope}"')
        return ("Bearer " + ", ".join(parts)).encode()

    async def authenticate(self, token: bytes, endpoint: str | None) -> Principal:
        """The caller a bearer token names at `/mcp` (or `/mcp/NAME`), or `Refusal`."""
        try:
            principal = await self._authenticate(token, endpoint)
        except Refusal as refusal:
            self.on_outcome(refusal.outcome)
            log.debug("access token refused", outcome=refusal.outcome, reason=refusal.reason, endpoint=endpoint)
            raise
        self.on_outcome("accepted")
        return principal

    async def _authenticate(self, token: bytes, endpoint: str | None) -> Principal:
        digest = hashlib.sha256(token).digest()
        now = time.time()
        remembered = self._remembered.get(digest)
        if remembered is not None and remembered[1] > time.monotonic():
            claims = remembered[0]
            if now > claims["exp"] + self.config.clock_skew:
                raise _invalid("the token has expired", "expired")
        else:
            claims = await self._verify(token)
            until = min(time.monotonic() + REMEMBER_FOR, time.monotonic() + claims["exp"] - now)
            if len(self._remembered) >= REMEMBERED:
                self._forget(time.monotonic())
            self._remembered[digest] = (claims, until)
        audience = claims.get("aud")
        given = {a for a in (audience if isinstance(audience, list) else [audience]) if isinstance(a, str)}
        if not given & (self._audience | {self.resource_of(endpoint)}):
            raise _invalid(
                f"the token is for another resource (its audience is not {self.resource_of(endpoint)})", "audience"
            )
        missing = [s for s in self.config.required_scopes if s not in scopes_of(claims)]
        if missing:
            raise Refusal(
                403,
                "insufficient_scope",
                "the token lacks a required scope",
                " ".join(self.config.required_scopes),
                "scope",
            )
        rule = self.config.rule_for(claims)
        if rule is None:
            raise Refusal(
                403,
                "insufficient_scope",
                "no access rule of this gateway matches the token",
                " ".join(self.config.required_scopes) or None,
                "no_rule",
            )
        return Principal(str(claims["sub"]), rule)

    def _forget(self, now: float) -> None:
        """Drop expired memories; if none were, the oldest half."""
        expired = [k for k, (_, until) in self._remembered.items() if until <= now]
        for key in expired or list(self._remembered)[: REMEMBERED // 2]:
            del self._remembered[key]

    async def _verify(self, token: bytes) -> Json:
        """The claims of a token whose signature, issuer, times and type are right."""
        if token.count(b".") != 2:
            raise _invalid("the token is not a JWT (three dot-separated parts)", "malformed")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise _invalid("the token's header is not valid base64url JSON", "malformed") from None
        except jwt.InvalidTokenError:  # PyJWT's own header checks; its words may quote the header, so not shown
            raise _invalid(_header_problem(token), "malformed") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.config.algorithms:
            raise _invalid(
                f"the token's signature algorithm is not accepted (accepted: {', '.join(self.config.algorithms)})",
                "algorithm",
            )
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCEPTED_TYP):
            raise _invalid("the token's type is not an access token (typ at+jwt or JWT)", "type")
        kid = header.get("kid")
        assert self.keys is not None
        keys = await self.keys.candidates(kid if isinstance(kid, str) else None, alg)
        try:
            claims = self._decode(token, keys, alg)
        except jwt.ExpiredSignatureError:
            raise _invalid("the token has expired", "expired") from None
        except jwt.ImmatureSignatureError:
            raise _invalid("the token is not valid yet (nbf or iat in the future)", "not_yet_valid") from None
        except jwt.InvalidIssuerError:
            raise _invalid(f"the token was not issued by {self.config.issuer}", "issuer") from None
        except jwt.InvalidSignatureError:
            raise _invalid("the token's signature does not verify", "signature") from None
        except jwt.MissingRequiredClaimError as e:
            raise _invalid(f"the token has no {e.claim} claim", "claims") from None
        except jwt.InvalidTokenError as e:
            raise _invalid(f"the token is not valid ({type(e).__name__})", "malformed") from None
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise _invalid("the token's sub claim is not a string", "claims")
        if not isinstance(claims.get("exp"), int | float):
            raise _invalid("the token's exp claim is not a number", "claims")
        return claims

    def _decode(self, token: bytes, keys: list[jwt.PyJWK], alg: str) -> Json:
        """The verified claims, by the first of `keys` the signature verifies with."""
        for i, key in enumerate(keys):
            try:
                claims: Json = jwt.decode(
                    token,
                    key.key,
                    algorithms=[alg],
                    issuer=self.config.issuer,
                    leeway=self.config.clock_skew,
                    options={"verify_aud": False, "require": ["exp", "iss", "sub", "aud"]},
                )
                return claims
            except jwt.InvalidSignatureError:
                if i == len(keys) - 1:
                    raise
        raise jwt.InvalidSignatureError("no key")

    def routes(self) -> list[BaseRoute]:
        """The protected resource metadata: at the root well-known path, and suffixed with `/mcp` (or
        `/mcp/NAME`) as RFC 9728 builds it from the resource's path."""

        async def serve(request: Request) -> Response:
            rest = request.path_params.get("rest", "")
            if rest in ("", "/", self._path):
                endpoint = None
            elif rest.startswith(f"{self._path}/") and rest[len(self._path) + 1 :] in self.endpoints:
                endpoint = rest[len(self._path) + 1 :]
            else:
                return JSONResponse({"error": "no protected resource here"}, status_code=404)
            return JSONResponse(
                self.metadata(endpoint),
                headers={"Access-Control-Allow-Origin": "*", "Cache-Control": "max-age=300"},
            )

        return [Route(PRM_PATH, serve, methods=["GET"]), Route(PRM_PATH + "{rest:path}", serve, methods=["GET"])]
