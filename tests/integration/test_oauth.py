"""The gateway as an OAuth resource server, against a real authorization server (oidc-provider on loopback).

One provider and one gateway serve the module: the provider's clients stand for subjects of different rules
(alice and bob: group `ops`; carol: scope `mcp:admin`; dave: group `dev`, no rule; eve: no `mcp` scope;
frank and gina: group `limited`, rate-limited each), and a static API token is configured alongside.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from mcp import Client, MCPError
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from tests.fixtures.oidc import AuthServer, OAuthClient, available, run_auth_server
from tests.fixtures.servers import free_port, stdio_spec
from tests.integration.conftest import ERAS, ROOT, Gateway, connect, initialize_body, run_gateway

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not available(), reason="Node.js or tests/thirdparty's oidc-provider not installed"),
]
ACCEPT = "application/json, text/event-stream"
STATIC = "static-token-0123456789abcdef"
CONFORMANCE = ROOT / "tests" / "fixtures" / "conformance_server.py"
TASKS = "io.modelcontextprotocol/tasks"
CLIENTS = [
    OAuthClient("alice", scope="mcp", groups=("ops",)),
    OAuthClient("bob", scope="mcp", groups=("ops",)),
    OAuthClient("carol", scope="mcp mcp:admin"),
    OAuthClient("dave", scope="mcp", groups=("dev",)),
    OAuthClient("eve", scope="other", groups=("ops",)),
    OAuthClient("frank", scope="mcp", groups=("limited",)),
    OAuthClient("gina", scope="mcp", groups=("limited",)),
]
OPS_TOOLS = ["fx__add", "fx__echo", "fx__whoami"]
USED: list[str] = []  # every token the module presents, to look for in the log at the end


class Setup:
    def __init__(self, auth: AuthServer, gw: Gateway, resource: str, elsewhere: str) -> None:
        self.auth, self.gw, self.resource, self.elsewhere = auth, gw, resource, elsewhere

    def token(self, client: str, resource: str | None = None) -> str:
        token = self.auth.token(client, resource or self.resource)
        USED.append(token)
        return token

    def craft(self, claims: dict[str, Any], **headers: Any) -> str:
        """A token signed with the provider's own current key."""
        jwk = self.auth.signing_key()
        now = int(time.time())
        payload = {"iss": self.auth.issuer, "aud": self.resource, "sub": "mallory", "iat": now, "exp": now + 300}
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        header = {"kid": jwk["kid"], "typ": "at+jwt", **headers}
        token = jwt.encode(payload, jwt.PyJWK(jwk).key, algorithm="RS256", headers=header)
        USED.append(token)
        return token


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    elsewhere = f"http://127.0.0.1:{free_port()}/mcp"
    with run_auth_server(CLIENTS, [resource, elsewhere]) as auth:
        config = {
            "log_level": "debug",
            "auth": {
                "tokens": [{"name": "static", "token": "${T_STATIC}", "servers": ["other"]}],
                "oauth": {
                    "issuer": auth.issuer,
                    "required_scopes": ["mcp"],
                    "jwks_refetch_interval": 2,
                    "rules": [
                        {"name": "admin", "when": {"scope": "mcp:admin"}},
                        {
                            "name": "ops",
                            "when": {"groups": "ops"},
                            "servers": ["fx", "conf"],
                            "tools": [*OPS_TOOLS, "conf__slow_compute"],
                        },
                        {"name": "limited", "when": {"groups": "limited"}, "rate": 0.2, "burst": 2},
                    ],
                },
            },
            "endpoints": {"reader": {"servers": ["fx"], "tools": ["fx__echo"]}},
            "servers": {
                "fx": {**stdio_spec(), "required": True},
                "other": {**stdio_spec(), "required": True},
                "conf": {
                    "command": sys.executable,
                    "args": [str(CONFORMANCE), "--transport", "stdio"],
                    "required": True,
                },
            },
        }
        tmp = tmp_path_factory.mktemp("oauth")
        with run_gateway(tmp, config, env={"T_STATIC": STATIC}, port=port) as gw:
            deadline = time.monotonic() + 30
            while httpx2.get(f"{gw.base}/readyz", timeout=2).status_code != 200:
                assert time.monotonic() < deadline, gw.log()
                time.sleep(0.1)
            yield Setup(auth, gw, resource, elsewhere)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> httpx2.Response:
    head = {"Accept": ACCEPT, "Content-Type": "application/json", **(headers or {})}
    return httpx2.post(url, content=json.dumps(body), headers=head, timeout=30)


def reheader(token: str, **changes: Any) -> str:
    """`token` with its JOSE header changed (its signature no longer matches; the header is refused first)."""
    header = {**jwt.get_unverified_header(token), **changes}
    encoded = base64.urlsafe_b64encode(json.dumps(header).encode()).rstrip(b"=").decode()
    return encoded + token[token.index(".") :]


def challenge(response: httpx2.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer ...` header."""
    value = response.headers["www-authenticate"]
    assert value.startswith("Bearer ")
    params = {}
    for part in value[len("Bearer ") :].split('", '):
        key, _, text = part.partition("=")
        params[key.strip()] = text.strip('"')
    return params


@pytest.mark.parametrize("era", ERAS)
async def test_provider_tokens_are_accepted_and_scoped_by_the_first_matching_rule(setup: Setup, era: str) -> None:
    url = setup.gw.url
    async with (
        connect(url, era, headers=bearer(setup.token("alice"))) as alice,
        connect(url, era, headers=bearer(setup.token("carol"))) as carol,
        connect(url, era, headers=bearer(STATIC)) as static,
    ):
        assert sorted(n for n in await alice.tool_names() if n.startswith("fx__")) == OPS_TOOLS
        assert not any(n.startswith("other__") for n in await alice.tool_names())
        assert (await alice.call("fx__echo", {"text": "hi"})).content[0].text == "hi"
        with pytest.raises(MCPError, match="Unknown tool"):
            await alice.call("other__echo", {"text": "no"})
        carol_names = await carol.tool_names()
        assert "other__echo" in carol_names and "fx__write_note" in carol_names, "admin: every tool"
        assert {n.split("__")[0] for n in await static.tool_names()} == {"other"}, "static tokens still work"


async def test_refused_tokens_get_401_naming_the_problem(setup: Setup) -> None:
    url = setup.gw.url
    body = initialize_body()
    missing = post(url, body)
    assert missing.status_code == 401
    assert challenge(missing) == {"resource_metadata": f"{setup.gw.base}/.well-known/oauth-protected-resource/mcp"}, (
        "no token: where to get one, no error"
    )
    jwk = setup.auth.signing_key()
    pem = (
        jwt.PyJWK(jwk)
        .key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    now = int(time.time())
    claims = {"iss": setup.auth.issuer, "aud": setup.resource, "sub": "mallory", "exp": now + 300, "scope": "mcp"}
    unsigned = [
        base64.urlsafe_b64encode(json.dumps(p).encode()).rstrip(b"=").decode()
        for p in ({"alg": "none", "typ": "at+jwt", "kid": jwk["kid"]}, claims)
    ]
    hs_header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": jwk["kid"]}).encode()).rstrip(b"=")
    hs_input = hs_header + b"." + unsigned[1].encode()
    hs_mac = base64.urlsafe_b64encode(hmac.new(pem, hs_input, hashlib.sha256).digest()).rstrip(b"=")
    good = setup.token("alice")
    tampered = good[:-6] + ("AAAAAA" if not good.endswith("AAAAAA") else "BBBBBB")
    cases = {
        "for another resource": (setup.token("alice", setup.elsewhere), "the token is for another resource"),
        "for an endpoint only": (setup.token("alice", f"{setup.resource}/reader"), "the token is for another resource"),
        "another issuer": (setup.craft({"iss": "http://127.0.0.1:1"}), "the token was not issued by"),
        "expired": (setup.craft({"exp": now - 3600, "iat": now - 7200}), "the token has expired"),
        "bad signature": (tampered, "the token's signature does not verify"),
        "alg none": (".".join(unsigned) + ".", "the token's signature algorithm is not accepted"),
        "HMAC with the public key": (
            (hs_input + b"." + hs_mac).decode(),
            "the token's signature algorithm is not accepted",
        ),
        "no sub": (setup.craft({"sub": None}), "the token has no sub claim"),
        "a refresh-token type": (setup.craft({}, typ="rt+jwt"), "the token's type is not an access token"),
        "not a JWT": ("opaque-0123456789", "the token is not a JWT"),
        "an empty crit": (setup.craft({}, crit=[]), "the token's header lists critical extensions (crit)"),
        "an unsupported crit": (setup.craft({}, crit=["exp"]), "the token's header lists critical extensions (crit)"),
        "a kid that is not a string": (reheader(setup.craft({}), kid=7), "the token's kid header is not a string"),
        "over max_token_bytes": ("x" * 20_000, "the token is longer than 16384 bytes"),
    }
    for case, (token, reason) in cases.items():
        USED.append(token)
        response = post(url, body, bearer(token))
        assert response.status_code == 401, (case, response.text)
        params = challenge(response)
        assert params["error"] == "invalid_token", case
        assert params["error_description"].startswith(reason), (case, params)
        assert params["resource_metadata"].endswith("/.well-known/oauth-protected-resource/mcp")
        error = response.json()["error"]
        assert error["code"] == -32001 and reason in error["message"], case
        for part in token.split("."):
            assert len(part) < 8 or part not in response.text, f"{case}: the answer echoes the token"
    assert post(url, body, bearer(good)).status_code == 200


async def test_with_an_audience_set_a_token_for_the_gateway_is_good_at_every_endpoint(
    setup: Setup, tmp_path: Path
) -> None:
    """A second gateway, at `elsewhere` (the provider mints tokens for it), with a fixed `audience` configured:
    tokens for its `/mcp` and for that audience are good at `/mcp` and at `/mcp/reader` alike."""
    port = urlsplit(setup.elsewhere).port
    config = {
        "auth": {"oauth": {"issuer": setup.auth.issuer, "audience": ["api://manifold"], "rules": [{"name": "any"}]}},
        "endpoints": {"reader": {"servers": ["fx"], "tools": ["fx__echo"]}},
        "servers": {"fx": {**stdio_spec(), "required": True}},
    }
    with run_gateway(tmp_path, config, port=port) as gw:
        whole, fixed = setup.token("alice", setup.elsewhere), setup.craft({"aud": "api://manifold"})
        reader = setup.token("alice", f"{setup.elsewhere}/reader")
        for url in (gw.url, f"{gw.url}/reader"):
            for name, token in (("for <public_url>/mcp", whole), ("for the configured audience", fixed)):
                response = post(url, initialize_body(), bearer(token))
                assert response.status_code == 200, (url, name, response.text)
        assert post(f"{gw.url}/reader", initialize_body(), bearer(reader)).status_code == 200
        for url, token in ((gw.url, reader), (f"{gw.url}/reader", setup.token("alice"))):
            refused = post(url, initialize_body(), bearer(token))
            assert refused.status_code == 401, (url, refused.text)
            assert challenge(refused)["error_description"].startswith("the token is for another resource")


async def test_a_missing_scope_or_rule_gets_403(setup: Setup) -> None:
    no_scope = post(setup.gw.url, initialize_body(), bearer(setup.token("eve")))
    assert no_scope.status_code == 403
    assert challenge(no_scope)["error"] == "insufficient_scope" and challenge(no_scope)["scope"] == "mcp"
    no_rule = post(setup.gw.url, initialize_body(), bearer(setup.token("dave")))
    assert no_rule.status_code == 403
    assert challenge(no_rule)["error_description"] == "no access rule of this gateway matches the token"


async def test_protected_resource_metadata_is_served(setup: Setup) -> None:
    base = setup.gw.base
    expected = {
        "resource": setup.resource,
        "authorization_servers": [setup.auth.issuer],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["mcp", "mcp:admin"],
        "resource_name": "Manifold MCP gateway",
    }
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        response = httpx2.get(base + path)
        assert response.status_code == 200 and response.json() == expected
        assert response.headers["access-control-allow-origin"] == "*"
    reader = httpx2.get(f"{base}/.well-known/oauth-protected-resource/mcp/reader").json()
    assert reader["resource"] == f"{setup.resource}/reader"
    assert httpx2.get(f"{base}/.well-known/oauth-protected-resource/mcp/nowhere").status_code == 404
    at_reader = post(f"{setup.gw.url}/reader", initialize_body())
    assert challenge(at_reader)["resource_metadata"] == f"{base}/.well-known/oauth-protected-resource/mcp/reader"


async def test_a_rule_s_rate_applies_to_each_subject_alone(setup: Setup) -> None:
    frank, gina = setup.token("frank"), setup.token("gina")
    answers = [post(setup.gw.url, initialize_body(), bearer(frank)).status_code for _ in range(3)]
    assert answers == [200, 200, 429]
    limited = post(setup.gw.url, initialize_body(), bearer(frank))
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["message"] == "Too many requests for this subject"
    assert post(setup.gw.url, initialize_body(), bearer(gina)).status_code == 200, "another subject has its own"


class Memory:
    """Token storage for the SDK's OAuth client, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        USED.append(tokens.access_token)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@pytest.mark.parametrize("era", ERAS)
async def test_the_sdk_client_discovers_the_provider_from_the_401_and_gets_a_token(setup: Setup, era: str) -> None:
    """401 -> resource metadata -> the provider's metadata -> its token endpoint (client credentials, with the
    resource indicator) -> the call; all by the SDK's own OAuth client."""
    for url, tools in ((setup.gw.url, OPS_TOOLS), (f"{setup.gw.url}/reader", ["fx__echo"])):
        storage = Memory()
        auth = ClientCredentialsOAuthProvider(
            url, storage, "alice", setup.auth.secret("alice"), issuer=setup.auth.issuer
        )
        async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=era if era != "2025-11-25" else "legacy", cache=None) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                assert sorted(n for n in names if n.startswith("fx__")) == tools
                result = await client.call_tool("fx__echo", {"text": "through discovery"})
                assert result.content[0].text == "through discovery"  # type: ignore[union-attr]
        assert storage.tokens is not None
        claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
        assert claims["aud"] == url and claims["sub"] == "alice", "the token was asked for this resource"


async def test_a_session_stays_bound_to_its_subject(setup: Setup) -> None:
    alice, bob = setup.token("alice"), setup.token("bob")
    opened = post(setup.gw.url, initialize_body(), bearer(alice))
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert post(setup.gw.url, listing, {**bearer(bob), **session}).status_code == 404, "same rule, other subject"
    assert post(setup.gw.url, listing, {**bearer(STATIC), **session}).status_code == 404
    assert post(setup.gw.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {**bearer(alice), **session})
    assert post(setup.gw.url, listing, {**bearer(alice), **session}).status_code == 200
    fresh = setup.token("alice")  # a new token of the same subject keeps the session
    assert post(setup.gw.url, listing, {**bearer(fresh), **session}).status_code == 200


def _modern(token: str, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
    }
    headers = {**bearer(token), "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    return {"body": body, "headers": headers}


async def test_a_2026_task_stays_its_subjects(setup: Setup) -> None:
    alice, bob = setup.token("alice"), setup.token("bob")

    def send(token: str, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
        request = _modern(token, method, params, name)
        response = post(setup.gw.url, request["body"], request["headers"])
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            datas = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
            answer: dict[str, Any] = next(a for a in map(json.loads, filter(None, datas)) if a.get("id") == 1)
            return answer
        answer = response.json()
        return answer

    created = send(
        alice, "tools/call", {"name": "conf__slow_compute", "arguments": {"seconds": 0.2}}, "conf__slow_compute"
    )
    assert "result" in created, created
    task_id = created["result"]["taskId"]
    assert task_id.startswith("manifold-"), created
    refused = send(bob, "tasks/get", {"taskId": task_id}, task_id)
    assert "Unknown task" in refused["error"]["message"], "same rule, another subject: not its task"
    with anyio.fail_after(20):
        while (state := send(alice, "tasks/get", {"taskId": task_id}, task_id)["result"])["status"] == "working":
            await anyio.sleep(0.1)
    assert state["taskId"] == task_id and state["status"] == "completed", state


async def test_a_rotated_key_is_fetched_once_and_made_up_key_ids_do_not_hammer_the_provider(setup: Setup) -> None:
    before = setup.token("alice")
    unused_old = setup.token("bob")
    assert post(setup.gw.url, initialize_body(), bearer(before)).status_code == 200
    setup.auth.rotate()
    await anyio.sleep(2.1)  # past jwks_refetch_interval since any earlier fetch
    fetches = setup.auth.stats()["jwks_fetches"]
    after = setup.token("alice")
    assert post(setup.gw.url, initialize_body(), bearer(after)).status_code == 200, "the new key was fetched"
    assert setup.auth.stats()["jwks_fetches"] == fetches + 1
    started = time.monotonic()
    for _ in range(40):
        response = post(
            setup.gw.url, initialize_body(), bearer(setup.craft({"sub": "alice"}, kid=secrets.token_hex(8)))
        )
        assert challenge(response)["error_description"] == "the token is signed with a key the issuer does not publish"
    windows = int((time.monotonic() - started) / 2) + 1
    assert setup.auth.stats()["jwks_fetches"] <= fetches + 1 + windows, "at most one fetch per 2 s"
    refused = post(setup.gw.url, initialize_body(), bearer(unused_old))
    assert challenge(refused)["error_description"] == "the token is signed with a key the issuer does not publish"


async def test_no_token_reaches_the_log_or_the_metrics(setup: Setup) -> None:
    """Runs last: every token the module presented (valid, forged, or minted by the SDK's client) is looked
    for in the gateway's debug log and in /metrics."""
    assert len(USED) > 20
    log = setup.gw.log()
    assert "Exception in ASGI application" not in log and "Traceback" not in log, "no request ended in a 500"
    events = setup.gw.log_events()
    assert sum(e.get("event") == "authorization server keys fetched" for e in events) >= 2, "at start, and rotated"
    refusals = [e for e in events if e.get("event") == "access token refused"]
    assert {"expired", "signature", "algorithm", "unknown_key", "no_rule"} <= {e["outcome"] for e in refusals}
    metrics = httpx2.get(f"{setup.gw.base}/metrics").text
    assert 'manifold_oauth_tokens_total{outcome="accepted"}' in metrics
    assert 'manifold_oauth_tokens_total{outcome="audience"}' in metrics
    assert 'manifold_oauth_tokens_total{outcome="too_long"} 1.0' in metrics, "counted like other refusals"
    for token in USED:
        for part in token.split(".")[1:]:
            if len(part) >= 8:
                assert part not in log and part not in metrics
