"""Workers, the pure parts and the registry's bookkeeping: the URL a worker dials, the name it offers, who may
offer what, the listing two workers must agree on, and a pool that lives exactly as long as its workers."""

from __future__ import annotations

import json

import anyio
import mcp.types as types
import pytest

from gateway.cli.worker import TOKEN_ENV, child_environment, derive_name, too_big_answer, workers_url
from gateway.config.access import AuthConfig, TokenSpec
from gateway.config.servers import ConfigError, ServerSpec, parse_config
from gateway.config.settings import WorkerSettings, build_settings
from gateway.core.registry import NameTaken, Registry
from gateway.upstream.transports.websocket import CONFLICT, MAX_REASON_BYTES, Refusal
from gateway.upstream.workerpool import WorkerPool, same_tools


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:8080", "ws://127.0.0.1:8080/workers?name=time"),
        ("https://gw.example/", "wss://gw.example/workers?name=time"),
        ("https://gw.example/mcp", "wss://gw.example/workers?name=time"),
        ("wss://gw.example/base/workers", "wss://gw.example/base/workers?name=time"),
        ("http://gw.example/base", "ws://gw.example/base/workers?name=time"),
    ],
)
def test_the_url_a_worker_dials(given: str, expected: str) -> None:
    assert workers_url(given, "time") == expected


@pytest.mark.parametrize("given", ["ftp://gw.example", "gw.example:8080", "http://"])
def test_a_url_that_is_no_gateway_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="--connect"):
        workers_url(given, "time")


def test_the_name_offered_comes_from_the_command() -> None:
    assert derive_name("mcp-server-time") == "mcp-server-time"
    assert derive_name("/usr/local/bin/mcp-server-git") == "mcp-server-git"
    assert derive_name("./my server.sh") == "my_server"
    for launcher in ("python3", "python3.11", "/usr/bin/node", "npx", "uvx"):
        with pytest.raises(ValueError, match="--name"):
            derive_name(launcher)


def test_the_server_does_not_inherit_the_workers_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    monkeypatch.setenv("GITHUB_TOKEN", "kept")
    env = child_environment()
    assert TOKEN_ENV not in env
    assert env["GITHUB_TOKEN"] == "kept"


def test_an_answer_over_the_limit_becomes_an_error_answer() -> None:
    response = types.jsonrpc_message_adapter.validate_python({"jsonrpc": "2.0", "id": 7, "result": {}})
    answer = too_big_answer(response, 9000, 4096)
    assert answer is not None
    body = json.loads(answer)
    assert body["id"] == 7 and "9000 bytes" in body["error"]["message"]
    notification = types.jsonrpc_message_adapter.validate_python({"jsonrpc": "2.0", "method": "notifications/x"})
    assert too_big_answer(notification, 9000, 4096) is None


def test_may_offer_matches_names_and_globs_and_defaults_to_none() -> None:
    laptop = TokenSpec.model_validate({"name": "laptop", "token": "t", "may_offer": ["time", "ci-*"]})
    assert laptop.may_offer_name("time") and laptop.may_offer_name("ci-build-7")
    assert not laptop.may_offer_name("timer") and not laptop.may_offer_name("github")
    assert not laptop.trusted_worker
    agent = TokenSpec.model_validate({"name": "agent", "token": "t"})
    assert not agent.may_offer_name("time")


def test_token_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="may_offer"):
        AuthConfig.model_validate({"tokens": [{"name": "x", "token": "t", "may_offer": "time"}]})


def test_worker_settings_have_defaults_and_limits() -> None:
    settings = build_settings({}, {"workers": {"max_tools": 10}})
    assert settings.workers.max_tools == 10
    assert settings.workers.heartbeat_interval + settings.workers.heartbeat_timeout <= 10
    with pytest.raises(ConfigError, match=r"workers\.heartbeat_timeout"):
        build_settings({}, {"workers": {"heartbeat_timeout": 0}})
    with pytest.raises(ConfigError, match=r"workers\.nope"):
        build_settings({}, {"workers": {"nope": 1}})
    assert WorkerSettings().max_tools == 500


def test_a_config_file_cannot_declare_a_worker_server() -> None:
    with pytest.raises(ConfigError, match="unknown transport 'worker'"):
        parse_config({"servers": {"w": {"transport": "worker"}}})


def test_listings_agree_whatever_their_order() -> None:
    a, b = {"name": "a", "inputSchema": {}}, {"name": "b", "inputSchema": {}}
    assert same_tools((a, b), (b, a))
    assert not same_tools((a, b), (a,))
    assert not same_tools((a,), ({"name": "a", "inputSchema": {}, "description": "new"},))


def test_a_close_reason_fits_a_close_frame() -> None:
    refusal = Refusal(CONFLICT, "é" * 200, "listing")
    assert len(refusal.frame_reason.encode()) <= MAX_REASON_BYTES
    assert refusal.frame_reason == "é" * (MAX_REASON_BYTES // 2)


def worker_spec(name: str, *, trusted: bool = False) -> ServerSpec:
    return ServerSpec.model_validate({"name": name, "transport": "worker", "trusted": trusted})


@pytest.mark.anyio
async def test_a_pool_lives_while_a_worker_holds_it_and_never_takes_another_servers_name() -> None:
    configured = ServerSpec.model_validate({"name": "github", "command": "true", "prefix": "gh", "disabled": True})
    registry = Registry([configured])
    with anyio.fail_after(20):
        async with registry.running():
            for taken in ("github", "gh"):  # a server's name, or its prefix
                with pytest.raises(NameTaken):
                    async with registry.worker_pool(worker_spec(taken)):
                        pass
            async with registry.worker_pool(worker_spec("laptop")) as pool:
                assert isinstance(pool, WorkerPool)
                assert registry.upstreams["laptop"] is pool
                assert pool.source == "worker" and pool.spec.kind == "worker" and pool.spec.pin_mode == "hold"
                async with registry.worker_pool(worker_spec("laptop")) as same:
                    assert same is pool
                with pytest.raises(Refusal) as refused:
                    async with registry.worker_pool(worker_spec("laptop", trusted=True)):
                        pass
                assert refused.value.kind == "trust"
                assert pool.status()["workers"] == 0
            assert "laptop" not in registry.upstreams, "the pool leaves with its last worker"
            assert registry.upstreams["github"].source == "config"


@pytest.mark.anyio
async def test_departed_names_are_forgotten_after_a_while_or_beyond_the_bound() -> None:
    import time

    from gateway.store.memory import MemoryStore
    from gateway.upstream.departures import KIND, Departures

    store = MemoryStore()
    forgotten: list[str] = []
    live = {"busy"}

    async def forget(name: str) -> None:
        forgotten.append(name)

    departures = Departures(store, forget, live.__contains__, forget_after=50, keep=2)
    now = time.time()
    for name, ago in (("old", 100), ("busy", 90), ("recent", 10)):
        await store.put_record(KIND, name, {"at": now - ago})
    assert await departures.sweep() == ["old"]
    assert sorted((await store.records(KIND)).servers) == ["recent"], "a live name is no longer departed"
    await departures.left("a")
    await departures.left("b")
    assert forgotten == ["old", "recent"], "beyond `keep`, the longest gone is forgotten"
    await departures.back("a")
    assert sorted((await store.records(KIND)).servers) == ["b"]
