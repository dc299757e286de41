"""Who may see and call what: the configured tokens by digest, and the view of the catalog each caller gets
(pure)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.catalog.merged import Entry
from gateway.config.access import EndpointSpec, Exposure, GatedPolicy, Grant, MayAdd, OAuthRule, TokenSpec, matches_any


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
    exposure: Exposure | None = None  # the token's, else the endpoint's; None: the gateway's

    def allows(self, entry: Entry) -> bool:
        """Whether the tool is visible (and callable) for this caller."""
        if self.gated == "deny" and entry.labels.gated:
            return False
        mine = matches_any(entry.server, self.servers) and matches_any(entry.public, self.tools)
        return mine and all(v.allows(entry) for v in self.within)

    def sees(self, server: str) -> bool:
        """Whether this caller may see the server at all (its prompts and resources follow `servers` only)."""
        return matches_any(server, self.servers) and all(v.sees(server) for v in self.within)

    def at(self, endpoint: str, spec: EndpointSpec) -> View:
        """This view as seen through a curated endpoint: the intersection of both."""
        narrowing = View(f"endpoint:{endpoint}", tuple(spec.servers), tuple(spec.tools))
        exposure = self.exposure or spec.exposure
        return View(
            f"{self.name}@{endpoint}", self.servers, self.tools, self.gated, self.may_add, (narrowing,), exposure
        )

    @property
    def endpoint(self) -> str:
        """The curated endpoint this view is seen through, or "" for `/mcp` itself."""
        return next((v.name.removeprefix("endpoint:") for v in self.within if v.name.startswith("endpoint:")), "")

    def confirms(self, entry: Entry) -> bool:
        """Whether a call of this tool needs the human's confirmation first."""
        return self.gated == "confirm" and entry.labels.gated


def view_of(grant: Grant) -> View:
    """The view a token or an OAuth access rule grants."""
    return View(
        grant.name, tuple(grant.servers), tuple(grant.tools), grant.gated, grant.may_add, exposure=grant.exposure
    )


OPEN_VIEW = View("anonymous")


def views_for(
    tokens: Iterable[TokenSpec],
    endpoints: Mapping[str, EndpointSpec] | None = None,
    rules: Iterable[OAuthRule] = (),
) -> list[View]:
    """One view per token and per OAuth rule (the open view when there are neither), and each of them at each
    endpoint."""
    views = [view_of(grant) for grant in (*tokens, *rules)]
    views = views or [OPEN_VIEW]
    return views + [view.at(name, spec) for name, spec in (endpoints or {}).items() for view in views]
