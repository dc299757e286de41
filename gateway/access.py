"""Who may see and call what: API tokens, their scopes, and the view of the catalog each one gets (pure)."""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from gateway.catalog import Entry

GatedPolicy = Literal["allow", "deny", "confirm"]
MayAdd = Literal["none", "http", "stdio"]


class TokenSpec(BaseModel):
    """One API token: its secret (`token`, usually `${ENV}`, or `sha256`) and its scope."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    token: SecretStr | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    servers: list[str] = Field(default_factory=lambda: ["*"])
    tools: list[str] = Field(default_factory=lambda: ["*"])
    gated: GatedPolicy = "allow"
    rate: float | None = Field(None, gt=0, description="requests per second")
    burst: int | None = Field(None, ge=1)
    may_add: MayAdd = "none"
    may_offer: list[str] = Field(default_factory=list, description="server names (or globs) it may offer as a worker")
    trusted_worker: bool = False

    @model_validator(mode="after")
    def _one_secret(self) -> TokenSpec:
        if (self.token is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `token` (e.g. ${ENV_VAR}) or `sha256`")
        return self

    def may_offer_name(self, name: str) -> bool:
        """Whether a worker dialling in with this token may offer server `name`."""
        return _matches(name, self.may_offer)

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


ENDPOINT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class AuthConfig(BaseModel):
    """`auth:` in the config."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        names = [t.name for t in self.tokens]
        if len(names) != len(set(names)):
            raise ValueError("token names must be unique")
        return self


def _matches(value: str, patterns: Sequence[str]) -> bool:
    return any(value == p or fnmatch.fnmatchcase(value, p) for p in patterns)


class TokenTable:
    """The configured tokens by digest: who a bearer credential belongs to."""

    def __init__(self, tokens: Iterable[TokenSpec]) -> None:
        self._tokens = [(t.digest(), t) for t in tokens]

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def identify(self, header: bytes | None) -> TokenSpec | None:
        """The token an `Authorization: Bearer ...` header value presents, or None."""
        if not header or header[:7].lower() != b"bearer ":
            return None
        presented = hashlib.sha256(header[7:].strip()).digest()
        found = None
        for digest, token in self._tokens:  # every entry is compared: the time does not tell which matched
            if hmac.compare_digest(digest, presented):
                found = token
        return found


@dataclass(frozen=True)
class View:
    """What one caller may see and call."""

    name: str
    servers: tuple[str, ...] = ("*",)
    tools: tuple[str, ...] = ("*",)
    gated: GatedPolicy = "allow"
    may_add: MayAdd = "none"
    within: tuple[View, ...] = ()  # further views this one is narrowed to (a curated endpoint's)

    def allows(self, entry: Entry) -> bool:
        """Whether the tool is visible (and callable) for this caller."""
        if self.gated == "deny" and entry.labels.gated:
            return False
        mine = _matches(entry.server, self.servers) and _matches(entry.public, self.tools)
        return mine and all(v.allows(entry) for v in self.within)

    def sees(self, server: str) -> bool:
        """Whether this caller may see the server at all (its prompts and resources follow `servers` only)."""
        return _matches(server, self.servers) and all(v.sees(server) for v in self.within)

    def at(self, endpoint: str, spec: EndpointSpec) -> View:
        """This view as seen through a curated endpoint: the intersection of both."""
        narrowing = View(f"endpoint:{endpoint}", tuple(spec.servers), tuple(spec.tools))
        return View(f"{self.name}@{endpoint}", self.servers, self.tools, self.gated, self.may_add, (narrowing,))

    @property
    def endpoint(self) -> str:
        """The curated endpoint this view is seen through, or "" for `/mcp` itself."""
        return next((v.name.removeprefix("endpoint:") for v in self.within if v.name.startswith("endpoint:")), "")

    def confirms(self, entry: Entry) -> bool:
        """Whether a call of this tool needs the human's confirmation first."""
        return self.gated == "confirm" and entry.labels.gated


OPEN_VIEW = View("anonymous")


def views_for(tokens: Iterable[TokenSpec], endpoints: Mapping[str, EndpointSpec] | None = None) -> list[View]:
    """One view per token (the open view when there are no tokens), and each of them at each endpoint."""
    views = [View(t.name, tuple(t.servers), tuple(t.tools), t.gated, t.may_add) for t in tokens] or [OPEN_VIEW]
    return views + [view.at(name, spec) for name, spec in (endpoints or {}).items() for view in views]
