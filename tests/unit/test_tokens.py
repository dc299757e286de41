"""Upstream access tokens against a fake token endpoint: what is sent, what an answer means, renewal
(single-flight, after a refusal, from what another replica kept), rotated refresh tokens never lost."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx2
import pytest

from gateway.config.credentials import OAuthParams
from gateway.protocol.errors import NoToken
from gateway.store import StoreError
from gateway.store.memory import MemoryStore
from gateway.upstream.tokens import BearerAuth, Token, Tokens

pytestmark = pytest.mark.anyio
KEY = "unit-test-oauth-key-0123456789abcdef"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def params(**changes: Any) -> OAuthParams:
    base: dict[str, Any] = {
        "credential": "svc",
        "grant": "client_credentials",
        "client_id": "my client",
        "client_secret": "s3cret:+/",
        "issuer": None,
        "token_url": "https://as.example/token",
        "authorization_url": None,
        "scopes": ("read", "write"),
        "resource": "https://mcp.example/mcp",
        "method": "client_secret_basic",
        "redirect_uri": None,
    }
    return OAuthParams(**{**base, **changes})


class Endpoint:
    """A fake token endpoint: records each request's form and headers; answers from `answers` (or a fresh token)."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]] | None = None, delay: float = 0.0) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, str]]] = []
        self.answers = answers or []
        self.delay = delay
        self.issued = 0

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        form = {k: v[0] for k, v in parse_qs((await request.aread()).decode()).items()}
        self.requests.append((form, dict(request.headers)))
        if self.delay:
            await anyio.sleep(self.delay)
        if self.answers:
            status, body = self.answers.pop(0)
            return httpx2.Response(status, json=body)
        self.issued += 1
        body = {"access_token": f"at-{self.issued}", "token_type": "Bearer", "expires_in": 300}
        if form.get("grant_type") == "refresh_token":
            body["refresh_token"] = f"rt-{self.issued}"
        return httpx2.Response(200, json=body)

    def tokens(self, store: Any = None, key: str | None = None) -> Tokens:
        return Tokens(store, key, transport=httpx2.MockTransport(self))


def test_a_token_is_renewed_a_fifth_of_its_life_before_it_ends():
    token = Token("t", issued=1000.0, expires=1010.0)
    assert token.fresh(1007.9) and not token.fresh(1008.0)
    long = Token("t", issued=0.0, expires=3600.0)
    assert long.fresh(3539.0) and not long.fresh(3540.0), "at most a minute early"
    assert "t" not in repr(Token("secret-value", 0, 1))


async def test_what_a_client_credentials_request_carries():
    endpoint = Endpoint()
    assert await endpoint.tokens().source(params()).token() == "at-1"
    form, headers = endpoint.requests[0]
    assert form == {"grant_type": "client_credentials", "scope": "read write", "resource": "https://mcp.example/mcp"}
    user, secret = base64.b64decode(headers["authorization"].removeprefix("Basic ")).decode().split(":")
    assert (user, secret) == ("my%20client", "s3cret%3A%2B%2F"), "each part form-encoded first (RFC 6749 2.3.1)"

    endpoint = Endpoint()
    await endpoint.tokens().source(params(method="client_secret_post", resource=None, scopes=())).token()
    form, headers = endpoint.requests[0]
    assert form == {"grant_type": "client_credentials", "client_id": "my client", "client_secret": "s3cret:+/"}
    assert "authorization" not in headers


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (400, {"error": "invalid_client", "error_description": "bad\nsecret"}, "(invalid_client: bad?secret)"),
        (503, {}, "answered HTTP 503"),
        (200, {"token_type": "Bearer"}, "has no access_token"),
        (200, {"access_token": "x", "token_type": "DPoP"}, "only Bearer tokens are used"),
    ],
)
async def test_a_failed_grant_says_why(status: int, body: dict[str, Any], why: str):
    endpoint = Endpoint([(status, body)])
    with pytest.raises(NoToken) as info:
        await endpoint.tokens().source(params()).token()
    assert why in str(info.value)
    assert "s3cret" not in str(info.value)


async def test_without_expires_in_a_token_is_taken_to_last_an_hour():
    endpoint = Endpoint([(200, {"access_token": "x", "token_type": "bearer"})])
    source = endpoint.tokens().source(params())
    await source.token()
    assert source._current is not None and round(source._current.expires - source._current.issued) == 3600


@pytest.mark.parametrize("kept", [False, True], ids=["in-process", "kept-in-store"])
async def test_renewal_is_single_flight(kept: bool):
    endpoint = Endpoint(delay=0.05)
    tokens = endpoint.tokens(MemoryStore(), KEY if kept else None)
    source = tokens.source(params())
    got: list[str] = []

    async def one() -> None:
        got.append(await source.token())

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(one)
    assert got == ["at-1"] * 10 and len(endpoint.requests) == 1

    got.clear()

    async def refused() -> None:
        got.append(await source.refused("at-1"))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(refused)
    assert got == ["at-2"] * 10 and len(endpoint.requests) == 2, "ten refusals of one token: one renewal"
    assert await source.refused("at-1") == "at-2", "a refusal of a token already replaced renews nothing"
    assert len(endpoint.requests) == 2


async def test_a_replica_takes_what_another_kept():
    store, endpoint = MemoryStore(), Endpoint()
    one = endpoint.tokens(store, KEY).source(params())
    other = endpoint.tokens(store, KEY).source(params())  # another process sharing the store
    assert await one.token() == "at-1"
    assert await other.token() == "at-1" and len(endpoint.requests) == 1
    assert await one.refused("at-1") == "at-2"
    assert await other.refused("at-1") == "at-2", "renewed by the other replica: taken, not asked again"
    assert len(endpoint.requests) == 2
    assert "at-2" not in json.dumps((await store.records("oauth")).servers), "sealed"


async def test_refresh_tokens_rotate_and_are_never_lost():
    store, endpoint = MemoryStore(), Endpoint()
    tokens = endpoint.tokens(store, KEY)
    source = tokens.source(params(grant="refresh_token", client_secret=None, method="none"))
    with pytest.raises(NoToken, match="has no refresh token yet: run `manifold auth login SERVER`"):
        await source.token()
    await tokens.write("svc", {"refresh_token": "rt-0"})
    assert await source.token() == "at-1"
    form, _ = endpoint.requests[-1]
    assert form["refresh_token"] == "rt-0" and form["client_id"] == "my client"
    assert (await tokens.read("svc"))["refresh_token"] == "rt-1", "the rotated one is kept"

    failing = {"on": True}
    put = store.put_record

    async def flaky_put(*args: Any, **kwargs: Any) -> bool:
        if failing["on"]:
            raise StoreError("store down")
        return await put(*args, **kwargs)

    store.put_record = flaky_put  # type: ignore[method-assign]
    assert await source.refused("at-1") == "at-2", "the grant succeeded: its token is used"
    assert tokens.unsaved["svc"]["refresh_token"] == "rt-2", "held in the process while the store is down"
    failing["on"] = False
    assert await source.refused("at-2") == "at-3"
    assert endpoint.requests[-1][0]["refresh_token"] == "rt-2", "the unsaved rotation was used, not the stale rt-1"
    assert (await tokens.read("svc"))["refresh_token"] == "rt-3" and not tokens.unsaved


async def test_invalid_grant_says_to_log_in_again():
    endpoint = Endpoint([(400, {"error": "invalid_grant", "error_description": "grant request is invalid"})])
    tokens = endpoint.tokens(MemoryStore(), KEY)
    await tokens.write("svc", {"refresh_token": "rt-0"})
    with pytest.raises(NoToken, match=r"invalid_grant.*run `manifold auth login SERVER` again"):
        await tokens.source(params(grant="refresh_token")).token()


async def test_refresh_tokens_need_a_key():
    with pytest.raises(NoToken, match="kept only with `oauth_key` set"):
        await Endpoint().tokens().source(params(grant="refresh_token")).token()


async def test_the_sdk_path_renews_once_on_a_401_and_sends_once_more():
    endpoint = Endpoint()
    source = endpoint.tokens().source(params())
    seen: list[str] = []
    refuse = {"times": 1}

    def upstream(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers["authorization"])
        if refuse["times"] > 0:
            refuse["times"] -= 1
            return httpx2.Response(401)
        return httpx2.Response(200, json={"ok": True})

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(upstream), auth=BearerAuth(source)) as http:
        assert (await http.post("https://mcp.example/mcp", json={})).status_code == 200
        assert seen == ["Bearer at-1", "Bearer at-2"]
        refuse["times"] = 5
        assert (await http.post("https://mcp.example/mcp", json={})).status_code == 401, "once more, not forever"
        assert seen[2:] == ["Bearer at-2", "Bearer at-3"]
