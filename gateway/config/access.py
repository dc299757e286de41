"""The shapes of access in the config: API tokens, endpoints, OAuth access rules and their scopes (pure)."""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

GatedPolicy = Literal["allow", "deny", "confirm"]
Exposure = Literal["direct", "deferred"]
MayAdd = Literal["none", "http", "stdio"]


class Grant(BaseModel):
    """What an API token or an OAuth access rule grants: its name and the scope of its view."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    servers: list[str] = Field(default_factory=lambda: ["*"])
    tools: list[str] = Field(default_factory=lambda: ["*"])
    gated: GatedPolicy = "allow"
    rate: float | None = Field(None, gt=0, description="requests per second (for a rule: for each subject)")
    burst: int | None = Field(None, ge=1)
    may_add: MayAdd = "none"
    exposure: Exposure | None = None


class TokenSpec(Grant):
    """One API token: its secret (`token`, usually `${ENV}`, or `sha256`) and its scope."""

    token: SecretStr | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    may_offer: list[str] = Field(default_factory=list, description="server names (or globs) it may offer as a worker")
    trusted_worker: bool = False

    @model_validator(mode="after")
    def _one_secret(self) -> TokenSpec:
        if (self.token is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `token` (e.g. ${ENV_VAR}) or `sha256`")
        return self

    def may_offer_name(self, name: str) -> bool:
        """Whether a worker dialling in with this token may offer server `name`."""
        return matches_any(name, self.may_offer)

    def digest(self) -> bytes:
        """The SHA-256 of the secret, as bytes."""
        if self.sha256 is not None:
            return bytes.fromhex(self.sha256)
        assert self.token is not None
        return hashlib.sha256(self.token.get_secret_value().encode()).digest()


class EndpointSpec(BaseModel):
    """One curated endpoint, served at `/mcp/NAME`: the servers and public tool names it offers."""

    model_config = ConfigDict(extra="forbid")

    servers: list[str] = Field(default_factory=lambda: ["*"])
    tools: list[str] = Field(default_factory=lambda: ["*"])
    exposure: Exposure | None = None


ENDPOINT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

# Signature algorithms an access token may use: asymmetric ones only. HMAC (HS*) would need a secret shared
# with the authorization server, and a gateway that accepted it could be fooled into using a published key
# as the secret; `none` is no signature at all.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
ClaimValue = str | int | bool
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def http_url_problem(url: str, what: str) -> str | None:
    """Why `url` is not an https URL (http on loopback only) without query or fragment, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{what} must be an http(s) URL, got {url!r}"
    if parts.scheme == "http" and not (parts.hostname in LOOPBACK_HOSTS or parts.hostname.startswith("127.")):
        return f"{what} must use https (http only on a loopback address), got {url!r}"
    if parts.query or parts.fragment:
        return f"{what} must have no query or fragment, got {url!r}"
    return None


class OAuthRule(Grant):
    """One access rule: the claims a token must carry (`when`) and the view its bearer gets."""

    when: dict[str, ClaimValue | list[ClaimValue]] = Field(default_factory=dict)

    def matches(self, claims: Mapping[str, Any]) -> bool:
        """Whether a token with these claims meets every condition of `when` (each key: any of its values)."""
        for key, expected in self.when.items():
            wanted = expected if isinstance(expected, list) else [expected]
            held = scopes_of(claims) if key == "scope" else claim_values(claims, key)
            if not any(w in held for w in wanted):
                return False
        return True


def claim_values(claims: Mapping[str, Any], key: str) -> list[Any]:
    """A claim's values as a list: the claim named `key`, else the one at the dotted path `key`
    (`realm_access.roles`); a single value becomes a list of one, an absent claim an empty list."""
    value: Any = claims.get(key)
    if value is None and "." in key:
        value = claims
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return []
    return [v for v in value if not isinstance(v, dict | list)] if isinstance(value, list) else [value]


def scopes_of(claims: Mapping[str, Any]) -> set[str]:
    """The scopes a token grants: its `scope` (space-separated, RFC 9068) and `scp` (a list, or a string)."""
    scopes: set[str] = set()
    for key in ("scope", "scp"):
        value = claims.get(key)
        if isinstance(value, str):
            scopes.update(value.split())
        elif isinstance(value, list):
            scopes.update(v for v in value if isinstance(v, str))
    return scopes


class OAuthConfig(BaseModel):
    """`auth.oauth:` the gateway as an OAuth 2.1 resource server, taking JWT access tokens (RFC 9068)."""

    model_config = ConfigDict(extra="forbid")

    issuer: str
    audience: list[str] = Field(default_factory=list, description="default: the gateway's public /mcp URL")
    jwks_url: str | None = None
    required_scopes: list[str] = Field(default_factory=list)
    scopes_supported: list[str] | None = None
    algorithms: list[str] = Field(default_factory=lambda: list(ASYMMETRIC))
    clock_skew: float = Field(60.0, ge=0, le=600, allow_inf_nan=False)
    jwks_refetch_interval: float = Field(30.0, ge=1, le=3600, allow_inf_nan=False)
    rules: list[OAuthRule] = Field(default_factory=list)

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        if (problem := http_url_problem(value, "the issuer")) is not None:
            raise ValueError(problem)
        return value

    @field_validator("jwks_url")
    @classmethod
    def _jwks_url(cls, value: str | None) -> str | None:
        if value is not None and (problem := http_url_problem(value, "jwks_url")) is not None:
            raise ValueError(problem)
        return value

    @field_validator("audience", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("required_scopes", "scopes_supported")
    @classmethod
    def _scope_tokens(cls, value: list[str] | None) -> list[str] | None:
        for scope in value or ():
            if not re.fullmatch(r"[\x21\x23-\x5b\x5d-\x7e]+", scope):
                raise ValueError(f"{scope!r} is not a scope (no spaces, quotes or backslashes)")
        return value

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one signature algorithm")
        for alg in value:
            if alg.lower() == "none":
                raise ValueError("'none' is never accepted: a token without a signature proves nothing")
            if alg.upper().startswith("HS"):
                raise ValueError(f"{alg} is refused: only asymmetric algorithms are accepted ({', '.join(ASYMMETRIC)})")
            if alg not in ASYMMETRIC:
                raise ValueError(f"unknown algorithm {alg!r} (known: {', '.join(ASYMMETRIC)})")
        return value

    @model_validator(mode="after")
    def _rules(self) -> OAuthConfig:
        if not self.rules:
            raise ValueError(
                "rules: give at least one rule mapping tokens to what they may use "
                "(a rule without `when` admits every valid token)"
            )
        names = [r.name for r in self.rules]
        if len(names) != len(set(names)):
            raise ValueError("rules: rule names must be unique")
        return self

    @property
    def supported_scopes(self) -> list[str]:
        """The scopes the protected resource metadata lists: as configured, else the required ones and every
        scope a rule asks for."""
        if self.scopes_supported is not None:
            return self.scopes_supported
        scopes = list(self.required_scopes)
        for rule in self.rules:
            wanted = rule.when.get("scope")
            for scope in wanted if isinstance(wanted, list) else [wanted] if wanted is not None else []:
                if isinstance(scope, str) and scope not in scopes:
                    scopes.append(scope)
        return scopes

    def rule_for(self, claims: Mapping[str, Any]) -> OAuthRule | None:
        """The first rule whose conditions the claims meet, or None."""
        return next((rule for rule in self.rules if rule.matches(claims)), None)


class AuthConfig(BaseModel):
    """`auth:` in the config."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenSpec] = Field(default_factory=list)
    oauth: OAuthConfig | None = None

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        names = [t.name for t in self.tokens]
        if len(names) != len(set(names)):
            raise ValueError("token names must be unique")
        clash = sorted(set(names) & {r.name for r in self.oauth.rules}) if self.oauth else []
        if clash:
            raise ValueError(f"oauth rule names must differ from token names: {', '.join(clash)}")
        return self

    @property
    def enabled(self) -> bool:
        """Whether callers must authenticate (with an API token or an OAuth access token)."""
        return bool(self.tokens) or self.oauth is not None


def matches_any(value: str, patterns: Sequence[str]) -> bool:
    """Whether `value` equals one of `patterns` or matches it as a glob."""
    return any(value == p or fnmatch.fnmatchcase(value, p) for p in patterns)
