"""OAuth credentials toward upstream servers, against a real authorization server (oidc-provider on loopback)
and a protected upstream that takes only its bearer tokens (tests/fixtures/bearer_upstream.py).

The provider has a service (`svc`: client credentials, 4-second tokens), a slower-expiring one (`svc-long`),
and a native app (`app`: public client, authorization code with PKCE, rotating refresh tokens). Each test starts
its own protected upstream and gateway, so counts start at zero; the provider's counts are read as differences.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.store.sealing import Sealer
from gateway.store.sqlite import SqliteStore
from tests.fixtures.oidc import AuthServer, OAuthClient, Protected, available, run_auth_server, run_protected_upstream
from tests.fixtures.servers import free_port
from tests.integration.conftest import ROOT, Gateway, connect, run_gateway, write_config

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not available(), reason="Node.js or tests/thirdparty's oidc-provider not installed"),
]
OAUTH_KEY = "test-oauth-key-0123456789abcdef-0123456789"
ADMIN = "admin-token-0123456789abcdef"
SHORT_TTL = 4
CLIENTS = [
    OAuthClient("svc", ttl=SHORT_TTL),
    OAuthClient("svc-long", ttl=300),
    OAuthClient(
        "app", grants=("authorization_code", "refresh_token"), redirect_uris=("http://127.0.0.1/callback",), public=True
    ),
]
PORTS = [free_port() for _ in range(12)]  # the protected upstreams' ports, known to the provider as resources


@pytest.fixture(scope="module")
def auth() -> Iterator[AuthServer]:
    with run_auth_server(CLIENTS, [f"http://127.0.0.1:{port}/mcp" for port in PORTS]) as server:
        yield server


@pytest.fixture
def protected(auth: AuthServer) -> Iterator[Protected]:
    port = PORTS.pop()
    with run_protected_upstream(auth.issuer, port) as upstream:
        yield upstream


def cc(auth: AuthServer, client: str = "svc") -> dict[str, Any]:
    """A client credentials credential; the secret comes from the environment."""
    return {
        "oauth": {
            "grant": "client_credentials",
            "issuer": auth.issuer,
            "client_id": client,
            "client_secret": "${SVC_SECRET}",
            "scopes": ["mcp"],
        }
    }


def app_credential(auth: AuthServer) -> dict[str, Any]:
    return {"oauth": {"grant": "refresh_token", "issuer": auth.issuer, "client_id": "app", "scopes": ["mcp"]}}


def gateway_config(protected: Protected, credential: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "log_level": "debug",
        "admin_token": ADMIN,
        "credentials": {"upstream": credential},
        "servers": {"prot": {"url": protected.url, "credential": "upstream", "pin": "off"}},
        **settings,
    }


def env_for(auth: AuthServer, client: str = "svc") -> dict[str, str]:
    return {"SVC_SECRET": auth.secret(client)}


def wait_up(gw: Gateway, server: str = "prot", timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = httpx2.get(
            f"{gw.base}/admin/servers/{server}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5
        ).json()
        if body.get("state") == "up":
            return body
        assert time.monotonic() < deadline, f"{server} never came up: {body}\n{gw.log()[-3000:]}"
        time.sleep(0.1)


async def call(gw: Gateway, tool: str, arguments: dict[str, Any] | None = None) -> str:
    async with connect(gw.url, "2026-07-28") as client:
        result = await client.call(tool, arguments or {})
    assert not result.is_error, result
    text: str = result.content[0].text
    return text


def secrets_absent(gw: Gateway, values: list[str]) -> None:
    """No value appears in the gateway's log, its metrics, or its admin API."""
    values = [v for v in values if v]
    assert values
    places = {
        "log": gw.log(),
        "metrics": httpx2.get(f"{gw.base}/metrics", timeout=5).text,
        "admin": httpx2.get(f"{gw.base}/admin/servers", headers={"Authorization": f"Bearer {ADMIN}"}).text,
        "admin server": httpx2.get(f"{gw.base}/admin/servers/prot", headers={"Authorization": f"Bearer {ADMIN}"}).text,
    }
    for where, text in places.items():
        for value in values:
            assert value not in text, f"a secret appears in the {where}"


async def test_a_token_at_connect_renewed_before_it_expires(
    auth: AuthServer, protected: Protected, tmp_path: Path
) -> None:
    before = auth.grants("client_credentials")
    with run_gateway(tmp_path, gateway_config(protected, cc(auth)), env=env_for(auth)) as gw:
        described = wait_up(gw)
        assert described["credential"] == "upstream" and described["credential_kind"] == "oauth:client_credentials"
        assert auth.grants("client_credentials") == before + 1, "one token at connect"
        assert await call(gw, "prot__echo", {"text": "hi"}) == "hi"
        assert auth.grants("client_credentials") == before + 1, "the token is reused while it is fresh"
        await anyio.sleep(SHORT_TTL + 0.5)
        assert await call(gw, "prot__echo", {"text": "later"}) == "later"
        assert auth.grants("client_credentials") == before + 2, "renewed once it was about to expire"
        assert protected.refused() == 0, "the upstream never saw a missing or expired token"
        assert protected.stats()["tokens"] == 2
        secrets_absent(gw, [auth.secret("svc")])


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean-path", "sdk-path"])
async def test_a_refused_token_is_renewed_once_and_the_call_sent_once_more(
    auth: AuthServer, protected: Protected, tmp_path: Path, fast_path: bool
) -> None:
    config = gateway_config(protected, cc(auth, "svc-long"), fast_path=fast_path)
    with run_gateway(tmp_path, config, env=env_for(auth, "svc-long")) as gw:
        wait_up(gw)
        before = auth.grants("client_credentials")
        protected.revoke()  # as when the upstream rotates its keys or ends the session: the token is refused
        assert await call(gw, "prot__tick") == "1", "refused (401), renewed, sent once more: it ran once"
        assert await call(gw, "prot__ticks") == "1"
        assert protected.refused("revoked") == 1
        assert auth.grants("client_credentials") == before + 1
        assert (
            'manifold_upstream_token_refusals_total{credential="upstream"} 1.0' in httpx2.get(f"{gw.base}/metrics").text
        )

        secrets_absent(gw, [auth.secret("svc-long"), *protected.tokens()])


async def test_renewal_is_single_flight_under_concurrent_calls(
    auth: AuthServer, protected: Protected, tmp_path: Path
) -> None:
    calls = 20
    with run_gateway(tmp_path, gateway_config(protected, cc(auth)), env=env_for(auth)) as gw:
        wait_up(gw)
        async with connect(gw.url, "2026-07-28") as client:

            async def burst() -> list[str]:
                answers: list[str] = []

                async def one(i: int) -> None:
                    result = await client.call("prot__echo", {"text": str(i)})
                    assert not result.is_error, result
                    answers.append(result.content[0].text)

                async with anyio.create_task_group() as tg:
                    for i in range(calls):
                        tg.start_soon(one, i)
                return answers

            protected.revoke()
            before = auth.grants("client_credentials")
            assert sorted(await burst(), key=int) == [str(i) for i in range(calls)]
            refused = protected.refused("revoked")
            # How many went out on the revoked token before the renewal depends on the machine's pace.
            assert 1 <= refused <= calls, "calls were refused (each at most once) ..."
            assert auth.grants("client_credentials") == before + 1, "... and one renewal served them all"

            # The token expires: again one renewal for the burst, or just before it for a request of the
            # gateway's own once the token is within a fifth of its lifetime of expiring; counted from before.
            before = auth.grants("client_credentials")
            await anyio.sleep(SHORT_TTL + 0.5)
            assert len(await burst()) == calls
            assert auth.grants("client_credentials") == before + 1
            assert protected.refused("expired") == 0


async def test_tokens_are_kept_sealed_in_the_store_only_with_a_key(
    auth: AuthServer, protected: Protected, tmp_path: Path
) -> None:
    for key in (None, OAUTH_KEY):
        run = tmp_path / ("keyed" if key else "plain")
        run.mkdir()
        store = run / "store.db"
        settings: dict[str, Any] = {"store": f"sqlite:///{store}"}
        if key is not None:
            settings["oauth_key"] = "${MANIFOLD_TEST_OAUTH_KEY}"
        config = gateway_config(protected, cc(auth, "svc-long"), **settings)
        with run_gateway(run, config, env={**env_for(auth, "svc-long"), "MANIFOLD_TEST_OAUTH_KEY": OAUTH_KEY}) as gw:
            wait_up(gw)
            assert await call(gw, "prot__echo", {"text": "x"}) == "x"
        records = await read_records(store)
        if key is None:
            assert records == {}, "without a key, client credentials tokens stay in the process"
            continue
        assert list(records) == ["upstream"]
        raw = store.read_bytes()
        for token in protected.tokens():
            assert token.encode() not in raw, "sealed"
        opened = Sealer(OAUTH_KEY).open(records["upstream"], "oauth upstream")
        kept = [slot["access_token"] for slot in opened["access"].values()]
        assert kept == protected.tokens()[-1:]

        # A restart takes the kept token instead of asking for another.
        before = auth.grants("client_credentials")
        with run_gateway(run, config, env={**env_for(auth, "svc-long"), "MANIFOLD_TEST_OAUTH_KEY": OAUTH_KEY}) as gw:
            wait_up(gw)
            assert await call(gw, "prot__echo", {"text": "y"}) == "y"
        assert auth.grants("client_credentials") == before


async def read_records(path: Path) -> dict[str, Any]:
    store = SqliteStore(str(path))
    await store.start()
    return (await store.records("oauth")).servers


async def test_a_refused_grant_says_why_without_the_secret(
    auth: AuthServer, protected: Protected, tmp_path: Path
) -> None:
    wrong = "not-the-secret-5f1e2d3c4b5a69788796"
    with run_gateway(tmp_path, gateway_config(protected, cc(auth)), env={"SVC_SECRET": wrong}) as gw:
        deadline = time.monotonic() + 20
        while True:
            body = httpx2.get(f"{gw.base}/admin/servers/prot", headers={"Authorization": f"Bearer {ADMIN}"}).json()
            if body["error"]:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert body["state"] != "up"
        assert "refused the client_credentials grant (invalid_client" in body["error"], body["error"]
        assert protected.stats()["accepted"] == 0
        secrets_absent(gw, [wrong])


def login(tmp_path: Path, config: dict[str, Any], env: dict[str, str]) -> str:
    """`manifold auth login prot`, with this test as the browser (following the provider's redirects, through its
    sign-in and consent, back to the command's loopback redirect); the command's output."""
    path = write_config(tmp_path, config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "auth", "login", "prot", "--config", str(path), "--timeout", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip().startswith("http"):
                break
        else:
            raise AssertionError(f"no URL to open:\n{''.join(lines)}\n{proc.stderr.read() if proc.stderr else ''}")
        url = line.strip()
        assert "code_challenge_method=S256" in url and "code_challenge=" in url
        with httpx2.Client(follow_redirects=True, timeout=10) as browser:
            page = browser.get(url)
        assert page.status_code == 200 and "Signed in" in page.text, page.text
        rest, errors = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, errors
    return "".join(lines) + rest


async def test_auth_login_then_the_gateway_refreshes_with_the_stored_token(
    auth: AuthServer, protected: Protected, tmp_path: Path
) -> None:
    store = tmp_path / "store.db"
    env = {"MANIFOLD_OAUTH_KEY": OAUTH_KEY}
    config = gateway_config(protected, app_credential(auth), store=f"sqlite:///{store}")
    codes, refreshes = auth.grants("authorization_code"), auth.grants("refresh_token")
    errors = auth.grants("refresh_token", "error")
    output = login(tmp_path, config, env)
    assert "Signed in. The refresh token of credential 'upstream' is stored, sealed" in output
    assert auth.grants("authorization_code") == codes + 1
    first = Sealer(OAUTH_KEY).open((await read_records(store))["upstream"], "oauth upstream")["refresh_token"]
    assert first not in output and first.encode() not in store.read_bytes()

    with run_gateway(tmp_path, config, env=env) as gw:
        described = wait_up(gw)
        assert described["credential_kind"] == "oauth:refresh_token"
        assert auth.grants("refresh_token") == refreshes, "the access token the login got is used first"
        assert await call(gw, "prot__echo", {"text": "as user-1"}) == "as user-1"
        protected.revoke()
        assert await call(gw, "prot__tick") == "1"
        assert auth.grants("refresh_token") == refreshes + 1
        assert auth.grants("refresh_token", "error") == errors
        rotated = Sealer(OAUTH_KEY).open((await read_records(store))["upstream"], "oauth upstream")["refresh_token"]
        assert rotated != first, "the provider rotated the refresh token and the gateway kept the new one"

        # Someone else spends the kept refresh token: the provider rotates it away from the gateway, whose next
        # refresh presents a spent token; the provider revokes the grant, and the server is down until a new login.
        spent = httpx2.post(
            f"{auth.issuer}/token",
            data={
                "grant_type": "refresh_token",
                "refresh_token": rotated,
                "client_id": "app",
                "resource": protected.url,
            },
        )
        assert spent.status_code == 200
        protected.revoke()
        async with connect(gw.url, "2026-07-28") as client:
            result = await client.call("prot__tick", {})
        assert result.is_error
        assert "invalid_grant" in result.content[0].text and "run `manifold auth login SERVER` again" in (
            result.content[0].text
        )
        deadline = time.monotonic() + 20
        while "manifold auth login" not in str(
            (body := httpx2.get(f"{gw.base}/admin/servers/prot", headers={"Authorization": f"Bearer {ADMIN}"}).json())[
                "error"
            ]
        ):
            assert time.monotonic() < deadline, body
            time.sleep(0.1)
        assert body["state"] != "up"
        login(tmp_path, config, env)
        wait_up(gw)
        assert await call(gw, "prot__ticks") == "1", "back after a new login; the refused call never ran"
        secrets_absent(gw, [first, rotated, spent.json()["refresh_token"], *protected.tokens()])


async def test_two_replicas_sharing_redis_refresh_once(
    auth: AuthServer, protected: Protected, tmp_path: Path, redis_server: Any
) -> None:
    env = {"MANIFOLD_OAUTH_KEY": OAUTH_KEY}
    config = gateway_config(protected, app_credential(auth), store=f"redis://127.0.0.1:{redis_server.port}/0")
    login(tmp_path, config, env)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    refreshes, errors = auth.grants("refresh_token"), auth.grants("refresh_token", "error")
    with run_gateway(tmp_path / "a", config, env=env) as a, run_gateway(tmp_path / "b", config, env=env) as b:
        wait_up(a)
        wait_up(b)
        assert auth.grants("refresh_token") == refreshes, "both replicas took the stored access token"
        for round in (1, 2):
            protected.revoke()
            answers: list[str] = []

            async def calls(gw: Gateway, answers: list[str] = answers) -> None:
                async with connect(gw.url, "2026-07-28") as client:

                    async def one(i: int) -> None:
                        result = await client.call("prot__echo", {"text": str(i)})
                        assert not result.is_error, result
                        answers.append(result.content[0].text)

                    async with anyio.create_task_group() as tg:
                        for i in range(10):
                            tg.start_soon(one, i)

            async with anyio.create_task_group() as tg:
                tg.start_soon(calls, a)
                tg.start_soon(calls, b)
            assert len(answers) == 20
            assert auth.grants("refresh_token") == refreshes + round, "one refresh for both replicas"
            assert auth.grants("refresh_token", "error") == errors, "the rotated refresh token was never used twice"


def test_the_cli_connects_with_the_credential_too(auth: AuthServer, protected: Protected, tmp_path: Path) -> None:
    path = write_config(tmp_path, gateway_config(protected, cc(auth)))
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "tools", "--config", str(path), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env_for(auth)},
    )
    assert result.returncode == 0, result.stderr
    assert "prot__echo" in {row["name"] for row in json.loads(result.stdout)}
    for token in protected.tokens():
        assert token not in result.stdout + result.stderr
