"""OAuth access tokens: the `auth.oauth` config, access rules, and the checks of a JWT against published keys."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from gateway.config.access import AuthConfig, EndpointSpec, OAuthConfig, scopes_of
from gateway.config.servers import ConfigError
from gateway.config.settings import build_settings
from gateway.downstream.oauth import Keys, Refusal, ResourceServer
from gateway.policy.access import views_for
from gateway.protocol.oauthmeta import metadata_urls

pytestmark = pytest.mark.anyio
ISSUER = "https://as.example.com"
RESOURCE = "https://gw.example.com/mcp"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ED_KEY = ed25519.Ed25519PrivateKey.generate()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def public_jwk(key: Any, kid: str, alg: str | None = None) -> dict[str, Any]:
    algorithm: Any = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else None
    if isinstance(key, ec.EllipticCurvePrivateKey):
        algorithm = jwt.algorithms.ECAlgorithm
    if isinstance(key, ed25519.Ed25519PrivateKey):
        algorithm = jwt.algorithms.OKPAlgorithm
    assert algorithm is not None
    jwk: dict[str, Any] = json.loads(algorithm.to_jwk(key.public_key()))
    jwk["kid"] = kid
    if alg:
        jwk["alg"] = alg
    return jwk


class Published:
    """A stand-in for the issuer: its metadata and JWKS, and a count of fetches."""

    def __init__(self, *jwks: dict[str, Any]) -> None:
        self.jwks = list(jwks)
        self.fetched: list[str] = []

    async def __call__(self, url: str) -> Any:
        self.fetched.append(url)
        if url.endswith("/.well-known/oauth-authorization-server"):
            return {"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"}
        assert url == f"{ISSUER}/jwks"
        return {"keys": self.jwks}

    @property
    def key_fetches(self) -> int:
        return sum(1 for u in self.fetched if u.endswith("/jwks"))


def oauth(**extra: Any) -> OAuthConfig:
    rules = extra.pop("rules", [{"name": "ops", "when": {"groups": "ops"}}, {"name": "anyone"}])
    return OAuthConfig.model_validate({"issuer": ISSUER, "rules": rules, **extra})


def server(published: Published, **extra: Any) -> ResourceServer:
    config = oauth(**extra)
    return ResourceServer(config, RESOURCE, frozenset({"reader"}), Keys(config, fetch=published))


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "iat": now, "exp": now + 300, "scope": "mcp", **extra}


def sign(payload: dict[str, Any], key: Any = RSA_KEY, alg: str = "RS256", **headers: Any) -> bytes:
    headers = {"kid": "k1", "typ": "at+jwt", **headers}
    return jwt.encode(payload, key, algorithm=alg, headers={k: v for k, v in headers.items() if v is not None}).encode()


async def refused(rs: ResourceServer, token: bytes, endpoint: str | None = None) -> Refusal:
    with pytest.raises(Refusal) as info:
        await rs.authenticate(token, endpoint)
    assert token.decode() not in info.value.reason
    return info.value


# -- config


def test_only_asymmetric_algorithms_are_accepted() -> None:
    for bad, words in (("HS256", "asymmetric"), ("none", "never"), ("XX1", "unknown")):
        with pytest.raises(ValueError, match=words):
            oauth(algorithms=["RS256", bad])
    assert oauth().algorithms[:3] == ["RS256", "RS384", "RS512"]


def test_the_issuer_must_be_https_except_on_loopback() -> None:
    with pytest.raises(ValueError, match="https"):
        OAuthConfig.model_validate({"issuer": "http://as.example.com", "rules": [{"name": "r"}]})
    assert OAuthConfig.model_validate({"issuer": "http://127.0.0.1:9000", "rules": [{"name": "r"}]})


def test_rules_are_required_unique_and_apart_from_token_names() -> None:
    with pytest.raises(ValueError, match="at least one rule"):
        oauth(rules=[])
    with pytest.raises(ValueError, match="unique"):
        oauth(rules=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="differ from token names: ops"):
        AuthConfig.model_validate(
            {"tokens": [{"name": "ops", "sha256": "0" * 64}], "oauth": {"issuer": ISSUER, "rules": [{"name": "ops"}]}}
        )


def test_settings_name_each_problem_with_its_place() -> None:
    bad = {"auth": {"oauth": {"issuer": ISSUER, "rules": [{"name": "ops", "gated": "maybe"}], "clock_skw": 5}}}
    with pytest.raises(ConfigError) as info:
        build_settings({}, bad)
    assert "auth.oauth.clock_skw: unknown key" in info.value.problems
    assert any(p.startswith("auth.oauth.rules.0.gated: Input should be") for p in info.value.problems)


def test_a_non_loopback_gateway_needs_its_public_url() -> None:
    config = {"auth": {"oauth": {"issuer": ISSUER, "rules": [{"name": "r"}]}}, "host": "0.0.0.0"}
    with pytest.raises(ConfigError) as info:
        build_settings({}, config)
    assert info.value.problems[0].startswith("public_url: auth.oauth needs the URL clients reach the gateway at")
    settings = build_settings({}, {**config, "public_url": "https://gw.example.com/"})
    assert settings.resource_url == "https://gw.example.com/mcp"
    assert build_settings({}, {"port": 9000}).resource_url == "http://127.0.0.1:9000/mcp"


def test_rules_match_claims_and_the_first_match_wins() -> None:
    config = oauth(
        rules=[
            {"name": "admins", "when": {"scope": "mcp:admin"}},
            {"name": "ops", "when": {"groups": ["ops", "sre"], "email_verified": True}},
            {"name": "bot", "when": {"sub": "ci-bot", "realm_access.roles": "robot"}},
            {"name": "anyone"},
        ]
    )

    def rule(**c: Any) -> str:
        found = config.rule_for(c)
        assert found is not None
        return found.name

    assert rule(scope="mcp mcp:admin", groups=["ops"]) == "admins", "first match wins"
    assert rule(scp=["mcp:admin"]) == "admins", "scp (a list) counts as scopes"
    assert rule(groups=["sre"], email_verified=True) == "ops", "a list of values: any of them"
    assert rule(groups="ops", email_verified=False) == "anyone", "every key must match"
    assert rule(sub="ci-bot", realm_access={"roles": ["robot"]}) == "bot", "a dotted key reaches a nested claim"
    assert rule(sub="ci-bot") == "anyone"
    assert config.supported_scopes == ["mcp:admin"]
    assert oauth(required_scopes=["mcp"], scopes_supported=["mcp", "x"]).supported_scopes == ["mcp", "x"]
    assert scopes_of({"scope": "a b", "scp": "c"}) == {"a", "b", "c"}
    assert [v.name for v in views_for([], {"e": EndpointSpec()}, config.rules)] == [
        *["admins", "ops", "bot", "anyone"],
        *["admins@e", "ops@e", "bot@e", "anyone@e"],
    ]


# -- tokens


async def test_a_valid_token_names_its_rule_and_subject() -> None:
    published = Published(public_jwk(RSA_KEY, "k1"))
    rs = server(published)
    principal = await rs.authenticate(sign(claims(groups=["ops"])), None)
    assert (principal.rule.name, principal.subject) == ("ops", "alice")
    assert published.fetched == [f"{ISSUER}/.well-known/oauth-authorization-server", f"{ISSUER}/jwks"]
    assert (await rs.authenticate(sign(claims(sub="bob")), None)).rule.name == "anyone"


@pytest.mark.parametrize(("key", "alg"), [(EC_KEY, "ES256"), (ED_KEY, "EdDSA"), (RSA_KEY, "PS256"), (RSA_KEY, "RS512")])
async def test_each_asymmetric_algorithm_verifies(key: Any, alg: str) -> None:
    rs = server(Published(public_jwk(key, "k1")))
    assert (await rs.authenticate(sign(claims(), key, alg), None)).subject == "alice"


async def test_typ_at_jwt_and_plain_jwt_are_accepted_and_other_types_refused() -> None:
    rs = server(Published(public_jwk(RSA_KEY, "k1")))
    for typ in ("at+jwt", "application/at+jwt", "JWT", None):
        assert await rs.authenticate(sign(claims(), typ=typ), None)
    assert (await refused(rs, sign(claims(), typ="dpop+jwt"))).outcome == "type"


async def test_claims_are_checked() -> None:
    rs = server(Published(public_jwk(RSA_KEY, "k1")))
    now = int(time.time())
    cases = {
        "expired": claims(exp=now - 120),
        "not_yet_valid": claims(nbf=now + 600),
        "issuer": claims(iss="https://evil.example.com"),
        "audience": claims(aud="https://other.example.com/mcp"),
        "claims": {k: v for k, v in claims().items() if k != "sub"},
    }
    assert (await refused(rs, sign(claims(aud=[{"odd": 1}, 7])))).outcome == "audience"
    for outcome, payload in cases.items():
        refusal = await refused(rs, sign(payload))
        assert (refusal.status, refusal.error, refusal.outcome) == (401, "invalid_token", outcome)
    assert await rs.authenticate(sign(claims(exp=now - 30)), None), "within the clock skew (60 s)"
    assert (await refused(rs, sign(claims(aud="https://other.example.com/mcp")))).reason == (
        f"the token is for another resource (its audience is not {RESOURCE})"
    )


async def test_an_endpoint_takes_tokens_for_itself_or_for_the_whole_gateway() -> None:
    rs = server(Published(public_jwk(RSA_KEY, "k1")))
    reader = sign(claims(aud=f"{RESOURCE}/reader"))
    assert await rs.authenticate(reader, "reader")
    assert await rs.authenticate(sign(claims()), "reader")
    assert (await refused(rs, reader, None)).outcome == "audience", "a token for /mcp/reader is not one for /mcp"
    configured = server(Published(public_jwk(RSA_KEY, "k1")), audience="api://manifold")
    assert await configured.authenticate(sign(claims(aud=["x", "api://manifold"])), None)
    assert await configured.authenticate(sign(claims()), None), "the gateway's own URL is always its audience"
    assert await configured.authenticate(sign(claims()), "reader"), "... and good at every endpoint"
    assert (await refused(configured, sign(claims(aud=f"{RESOURCE}/other")), "reader")).outcome == "audience"
    assert (await refused(configured, sign(claims(aud="api://other")))).outcome == "audience"


async def test_forged_tokens_are_refused() -> None:
    jwk = public_jwk(RSA_KEY, "k1")
    rs = server(Published(jwk))
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"at+jwt","kid":"k1"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=")
    assert (await refused(rs, header + b"." + body + b".")).outcome == "algorithm"
    # HMAC keyed with the published public key: the classic algorithm confusion
    pem = RSA_KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    hmac_header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"at+jwt","kid":"k1"}').rstrip(b"=")
    mac = hmac.new(pem, hmac_header + b"." + body, hashlib.sha256).digest()
    forged = hmac_header + b"." + body + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")
    assert (await refused(rs, forged)).outcome == "algorithm"
    assert (await refused(rs, sign(claims(), OTHER_RSA_KEY))).outcome == "signature"
    assert (await refused(rs, sign(claims())[:-4] + b"AAAA")).outcome == "signature"
    for junk in (b"not-a-jwt", b"a.b.c", b"e30.e30.e30"):
        assert (await refused(rs, junk)).outcome in ("malformed", "algorithm")


async def test_a_malformed_jose_header_is_refused_as_invalid_and_counted() -> None:
    seen: list[str] = []
    rs = server(Published(public_jwk(RSA_KEY, "k1")))
    rs.on_outcome = seen.append
    body = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=")
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "an empty crit": ({"crit": []}, "critical extensions (crit)"),
        "a crit naming a claim": ({"crit": ["exp"], "exp": 1}, "critical extensions (crit)"),
        "a crit that is no list": ({"crit": "b64"}, "critical extensions (crit)"),
        "a numeric kid": ({"kid": 7}, "kid header is not a string"),
        "a null kid": ({"kid": None}, "kid header is not a string"),
        "a list kid": ({"kid": ["k1"]}, "kid header is not a string"),
    }
    for case, (extra, words) in cases.items():
        header = {"alg": "RS256", "typ": "at+jwt", "kid": "k1", **extra}
        encoded = base64.urlsafe_b64encode(json.dumps(header).encode()).rstrip(b"=")
        refusal = await refused(rs, encoded + b"." + body + b".c2lnbmF0dXJl")
        assert (refusal.status, refusal.error, refusal.outcome) == (401, "invalid_token", "malformed"), case
        assert words in refusal.reason and "exp" not in refusal.reason, case
    assert seen == ["malformed"] * len(cases)


async def test_keys_and_tokens_without_a_kid_are_tried_by_algorithm() -> None:
    unnamed = {k: v for k, v in public_jwk(RSA_KEY, "k1").items() if k != "kid"}
    rs = server(Published(unnamed, public_jwk(OTHER_RSA_KEY, "k2"), public_jwk(EC_KEY, "k3")))
    assert (await rs.authenticate(sign(claims(), kid="any"), None)).subject == "alice", "kid-less published key"
    assert (await rs.authenticate(sign(claims(sub="bob"), OTHER_RSA_KEY, kid=None), None)).subject == "bob"
    assert (await rs.authenticate(sign(claims(sub="eve"), EC_KEY, "ES256", kid=None), None)).subject == "eve"
    assert (await refused(rs, sign(claims(sub="x"), ED_KEY, "EdDSA", kid=None))).outcome == "unknown_key"


def test_an_oauth_gateway_may_bind_a_public_address() -> None:
    from gateway.cli.serve import Unsafe, check_exposure

    public = {"host": "0.0.0.0", "public_url": "https://gw.example.com"}
    check_exposure(build_settings({}, {**public, "auth": {"oauth": {"issuer": ISSUER, "rules": [{"name": "r"}]}}}))
    with pytest.raises(Unsafe, match=r"auth\.oauth"):
        check_exposure(build_settings({}, public))


async def test_an_rsa_key_limited_to_one_algorithm_verifies_no_other() -> None:
    rs = server(Published(public_jwk(RSA_KEY, "k1", alg="RS256")))
    assert (await refused(rs, sign(claims(), alg="PS256"))).outcome == "unknown_key"
    assert await rs.authenticate(sign(claims()), None)


async def test_an_unknown_kid_fetches_the_keys_again_at_most_once_per_interval(monkeypatch: Any) -> None:
    published = Published(public_jwk(RSA_KEY, "k1"))
    rs = server(published)
    clock = [1000.0]
    monkeypatch.setattr("gateway.downstream.oauth.time.monotonic", lambda: clock[0])
    assert await rs.authenticate(sign(claims()), None)
    assert published.key_fetches == 1
    published.jwks = [public_jwk(OTHER_RSA_KEY, "k2")]  # the issuer rotated its key
    clock[0] += 1
    for i in range(50):  # a flood of made-up key ids right after a fetch: no fetch at all
        assert (await refused(rs, sign(claims(), kid=f"random-{i}"))).outcome == "unknown_key"
    assert published.key_fetches == 1
    clock[0] += 30  # the default jwks_refetch_interval
    assert (await rs.authenticate(sign(claims(sub="bob"), OTHER_RSA_KEY, kid="k2"), None)).subject == "bob"
    assert published.key_fetches == 2, "the new key's first token fetched the keys once"
    for i in range(50):
        await refused(rs, sign(claims(), kid=f"again-{i}"))
    assert published.key_fetches == 2


async def test_scopes_and_rules_decide_access_with_403() -> None:
    rs = server(
        Published(public_jwk(RSA_KEY, "k1")),
        required_scopes=["mcp"],
        rules=[{"name": "ops", "when": {"groups": "ops"}}],
    )
    refusal = await refused(rs, sign(claims(scope="other", groups=["ops"])))
    assert (refusal.status, refusal.error, refusal.scope) == (403, "insufficient_scope", "mcp")
    refusal = await refused(rs, sign(claims(groups=["dev"])))
    assert (refusal.status, refusal.error, refusal.outcome) == (403, "insufficient_scope", "no_rule")
    challenge = rs.challenge(None, refusal).decode()
    assert challenge.startswith(
        'Bearer resource_metadata="https://gw.example.com/.well-known/oauth-protected-resource/mcp"'
    )
    assert 'error="insufficient_scope"' in challenge and 'scope="mcp"' in challenge


async def test_keys_that_cannot_be_fetched_give_503_not_401() -> None:
    async def down(url: str) -> Any:
        raise OSError("connection refused")

    config = oauth()
    rs = ResourceServer(config, RESOURCE, keys=Keys(config, fetch=down))
    refusal = await refused(rs, sign(claims()))
    assert (refusal.status, refusal.outcome) == (503, "no_keys")


async def test_a_checked_token_is_remembered_until_it_expires(monkeypatch: Any) -> None:
    rs = server(Published(public_jwk(RSA_KEY, "k1")))
    token = sign(claims(exp=int(time.time()) + 2))
    assert await rs.authenticate(token, None)
    monkeypatch.setattr("gateway.downstream.oauth.jwt.decode", lambda *a, **k: pytest.fail("not remembered"))
    assert (await rs.authenticate(token, None)).subject == "alice"
    real = time.time
    monkeypatch.setattr("gateway.downstream.oauth.time.time", lambda: real() + 120)
    assert (await refused(rs, token)).outcome == "expired"


def test_metadata_documents() -> None:
    rs = ResourceServer(oauth(required_scopes=["mcp"]), RESOURCE, frozenset({"reader"}))
    assert rs.metadata(None) == {
        "resource": RESOURCE,
        "authorization_servers": [ISSUER],
        "bearer_methods_supported": ["header"],
        "resource_name": "Manifold MCP gateway",
        "scopes_supported": ["mcp"],
    }
    assert rs.metadata("reader")["resource"] == f"{RESOURCE}/reader"
    assert rs.metadata_url("reader") == "https://gw.example.com/.well-known/oauth-protected-resource/mcp/reader"
    assert rs.metadata_url("unknown") == "https://gw.example.com/.well-known/oauth-protected-resource/mcp"


def test_metadata_is_looked_for_where_rfc_8414_then_openid_put_it() -> None:
    assert metadata_urls("https://id.example.com/realms/acme/") == [
        "https://id.example.com/.well-known/oauth-authorization-server/realms/acme",
        "https://id.example.com/realms/acme/.well-known/openid-configuration",
    ]
    assert metadata_urls("http://127.0.0.1:9000") == [
        "http://127.0.0.1:9000/.well-known/oauth-authorization-server",
        "http://127.0.0.1:9000/.well-known/openid-configuration",
    ]
