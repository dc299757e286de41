"""Named upstream credentials: static headers and env, or an OAuth client the gateway gets tokens with.

A server refers to one with `credential: NAME`. `${VAR}` in a credential is filled when a server using it
connects (so an unset variable makes that server, not the gateway, fail). Pure: no I/O here; tokens are
fetched by `gateway.upstream.tokens`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.config.interpolate import MissingVariable, interpolate

Grant = Literal["client_credentials", "refresh_token"]
AuthMethod = Literal["client_secret_basic", "client_secret_post", "none"]
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_URL = re.compile(r"^(https?://|\$\{)")
_SCOPE = re.compile(r"^[\x21\x23-\x5B\x5D-\x7E]+$")  # RFC 6749 3.3 scope-token


def _url(value: str | None, what: str) -> str | None:
    if value is not None and not _URL.match(value):
        raise ValueError(f"{what} must start with http:// or https://, got {value!r}")
    return value


def tls_problem(url: str) -> str | None:
    """Why a client secret or grant may not travel to `url`: plain http off loopback."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "http" and host not in LOOPBACK and not host.startswith("127."):
        return f"must use https (http only on a loopback address), got {url!r}"
    return None


class OAuthSpec(BaseModel):
    """How the gateway gets access tokens for the servers using the credential (RFC 6749, RFC 8707).

    `client_credentials`: a service account; the token endpoint hands out tokens for the client's id and
    secret. `refresh_token`: a person's grant, obtained once by `manifold auth login SERVER` (authorization
    code with PKCE) and kept, encrypted, in the store; each access token comes from the refresh token.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    grant: Grant
    client_id: str = Field(min_length=1)
    client_secret: str | None = Field(None, min_length=1)
    issuer: str | None = None  # endpoints from its metadata (RFC 8414, or OpenID Connect discovery)
    token_url: str | None = None  # instead of (or over) the issuer's token endpoint
    authorization_url: str | None = None  # for `manifold auth login`; default: the issuer's
    scopes: list[str] = Field(default_factory=list)
    resource: str | Literal[False] | None = None  # None: the server's URL; False: send no `resource`
    auth_method: AuthMethod | None = None  # default: client_secret_basic with a secret, none without
    redirect_uri: str | None = None  # loopback redirect of `manifold auth login`; default: a free port

    @field_validator("issuer", "token_url", "authorization_url")
    @classmethod
    def _urls(cls, value: str | None) -> str | None:
        _url(value, "the URL")
        if value is not None and "${" not in value and (why := tls_problem(value)) is not None:
            raise ValueError(why)
        return value

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str | Literal[False] | None) -> str | Literal[False] | None:
        if isinstance(value, str):
            _url(value, "resource")
            if "#" in value:
                raise ValueError("resource must not have a fragment (RFC 8707)")
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: list[str]) -> list[str]:
        for scope in value:
            if not _SCOPE.match(scope):
                raise ValueError(f"{scope!r} is not a scope (no spaces, quotes or backslashes)")
        return value

    @field_validator("redirect_uri")
    @classmethod
    def _redirect(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme != "http" or parts.hostname not in LOOPBACK or parts.query or parts.fragment:
            raise ValueError(
                f"redirect_uri must be a loopback http URL such as http://127.0.0.1:8976/callback, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> OAuthSpec:
        if self.issuer is None and self.token_url is None:
            raise ValueError("give `issuer` (endpoints from its metadata) or `token_url`")
        method = self.method
        if method != "none" and self.client_secret is None:
            raise ValueError(f"auth_method {method} needs `client_secret`")
        if method == "none" and self.client_secret is not None:
            raise ValueError("auth_method none sends no `client_secret`; remove it or choose another method")
        if self.grant == "client_credentials" and method == "none":
            raise ValueError("grant client_credentials needs `client_secret`")
        if self.grant == "refresh_token" and self.issuer is None and self.authorization_url is None:
            raise ValueError("grant refresh_token needs `issuer` or `authorization_url` (for `manifold auth login`)")
        return self

    @property
    def method(self) -> AuthMethod:
        """How the client authenticates at the token endpoint."""
        if self.auth_method is not None:
            return self.auth_method
        return "client_secret_basic" if self.client_secret is not None else "none"


class Credential(BaseModel):
    """Secrets a server can refer to by name (`credential: NAME`): static `headers` and `env`, or `oauth`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    headers: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    oauth: OAuthSpec | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Credential:
        if self.oauth is not None and (self.headers or self.env):
            raise ValueError("an OAuth credential holds only `oauth` (the gateway sets the Authorization header)")
        return self

    @property
    def kind(self) -> str:
        """`static`, or `oauth:<grant>`: what the admin API may show of it."""
        return "static" if self.oauth is None else f"oauth:{self.oauth.grant}"


@dataclass(frozen=True)
class OAuthParams:
    """An OAuth credential with every `${VAR}` filled in, for one resource. Holds a secret: never log it."""

    credential: str
    grant: Grant
    client_id: str
    client_secret: str | None
    issuer: str | None
    token_url: str | None
    authorization_url: str | None
    scopes: tuple[str, ...]
    resource: str | None
    method: AuthMethod
    redirect_uri: str | None

    def __repr__(self) -> str:
        return f"OAuthParams(credential={self.credential!r}, grant={self.grant!r}, resource={self.resource!r})"

    @property
    def slot(self) -> str:
        """Names the access tokens these parameters get, among those a credential's record keeps."""
        text = "\n".join(
            [self.issuer or "", self.token_url or "", self.client_id, self.resource or "", " ".join(self.scopes)]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def fill_oauth(
    name: str, spec: OAuthSpec, server_url: str | None, environ: Mapping[str, str], problems: list[str]
) -> OAuthParams | None:
    """`spec` with `${VAR}` filled (its resource defaulting to `server_url`); each unset variable is appended to
    `problems` with its place (`credentials.NAME.oauth.client_secret: ...`), and None returned."""
    before = len(problems)

    def fill(field: str, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return interpolate(value, environ)
        except MissingVariable as e:
            problems.append(f"credentials.{name}.oauth.{field}: {e}")
            return None

    filled = {
        field: fill(field, getattr(spec, field))
        for field in ("client_id", "client_secret", "issuer", "token_url", "authorization_url", "redirect_uri")
    }
    for field in ("issuer", "token_url", "authorization_url"):
        value = filled[field]
        if value is not None and (why := tls_problem(value)) is not None:
            problems.append(f"credentials.{name}.oauth.{field}: {why}")
    resource = fill("resource", spec.resource) if isinstance(spec.resource, str) else None
    if spec.resource is None:
        resource = server_url
    if len(problems) > before:
        return None
    return OAuthParams(
        credential=name,
        grant=spec.grant,
        client_id=filled["client_id"] or "",
        client_secret=filled["client_secret"],
        issuer=filled["issuer"],
        token_url=filled["token_url"],
        authorization_url=filled["authorization_url"],
        scopes=tuple(spec.scopes),
        resource=resource,
        method=spec.method,
        redirect_uri=filled["redirect_uri"],
    )


def credential_variables(name: str, credential: Credential, environ: Mapping[str, str]) -> list[str]:
    """Each place in a credential whose `${VAR}` is unset, as `credentials.NAME.headers.X: ...`."""
    problems: list[str] = []
    for kind in ("headers", "env"):
        for key, text in getattr(credential, kind).items():
            try:
                interpolate(text, environ)
            except MissingVariable as e:
                problems.append(f"credentials.{name}.{kind}.{key}: {e}")
    if credential.oauth is not None:
        fill_oauth(name, credential.oauth, None, environ, problems)
    return problems


def use_problems(
    server: Any, credential_name: str, credential: Credential | None, place: str = "credential"
) -> list[str]:
    """Why a server (a `ServerSpec`: its `command`, `headers`, `forward_headers`) cannot use the credential it
    names."""
    if credential is None:
        return [f"{place}: no credential named {credential_name!r} under `credentials` in the gateway's config"]
    if credential.oauth is None:
        return []
    problems = []
    if server.command is not None:
        problems.append(f"{place}: {credential_name!r} is an OAuth credential; it applies to HTTP servers only")
    if any(h.lower() == "authorization" for h in server.headers):
        problems.append(f"{place}: {credential_name!r} sets the Authorization header; remove it from `headers`")
    if any(h.lower() == "authorization" for h in server.forward_headers):
        problems.append(f"{place}: {credential_name!r} sets the Authorization header; remove it from `forward_headers`")
    return problems
