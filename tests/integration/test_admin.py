"""Runtime servers: the admin API, its CLI, SQLite and Redis stores across restarts and replicas, reload."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.forkserver import run
from tests.fixtures.servers import run_http_fixture, stdio_spec
from tests.integration.conftest import (
    Gateway,
    RedisServer,
    connect,
    group_alive,
    run_gateway,
    upstream_pids,
    wait_until,
)

pytestmark = pytest.mark.anyio

TOKEN = "admin-test-token-1f2e3d"
SECRET = "cred-5ecret-abcdef-98765"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def admin_config(**extra: Any) -> dict[str, Any]:
    return {
        "admin_token": "${MANIFOLD_TEST_ADMIN}",
        "runtime": {"egress": {"allow": ["127.0.0.0/8"]}},
        "credentials": {"tok": {"headers": {"Authorization": "Bearer ${MANIFOLD_TEST_CRED}"}}},
        "servers": {"fx": stdio_spec()},
        **extra,
    }


ENV = {"MANIFOLD_TEST_ADMIN": TOKEN, "MANIFOLD_TEST_CRED": SECRET}


def api(gw: Gateway, method: str, path: str, **kwargs: Any) -> httpx2.Response:
    return httpx2.request(method, f"{gw.base}{path}", headers=kwargs.pop("headers", AUTH), timeout=30, **kwargs)


def server_state(gw: Gateway, name: str) -> str | None:
    response = api(gw, "GET", f"/admin/servers/{name}")
    return response.json()["state"] if response.status_code == 200 else None


async def test_admin_api_add_list_get_remove(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web, run_gateway(tmp_path, admin_config(), env=ENV) as gw:
        added = api(gw, "POST", "/admin/servers", json={"name": "web", "url": web.url, "credential": "tok"})
        assert added.status_code == 201, added.text
        assert added.json()["name"] == "web" and added.json()["source"] == "runtime"
        await wait_until(lambda: server_state(gw, "web") == "up", what="web up")

        listing = api(gw, "GET", "/admin/servers").json()["servers"]
        assert [s["name"] for s in listing] == ["fx", "web"]
        assert {s["name"]: s["source"] for s in listing} == {"fx": "config", "web": "runtime"}
        one = api(gw, "GET", "/admin/servers/web").json()
        assert one["transport"] == "http" and one["credential"] == "tok"
        assert {"name": "web__echo", "tool": "echo", "labels": ["read-only", "idempotent", "outside"]} in one[
            "tool_list"
        ]

        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "web__whoami" in n)
            seen = json.loads((await client.call("web__whoami")).content[0].text)
            assert seen["headers"]["authorization"] == f"Bearer {SECRET}", "the named credential is used"

            removed = api(gw, "DELETE", "/admin/servers/web")
            assert removed.status_code == 200 and removed.json() == {"removed": "web"}
            await client.wait_for(lambda n: not [x for x in n if x.startswith("web__")])
        assert api(gw, "GET", "/admin/servers/web").status_code == 404

        everything = "\n".join(
            [gw.log(), api(gw, "GET", "/admin/servers").text, httpx2.get(f"{gw.base}/readyz").text, added.text]
        )
        assert SECRET not in everything and TOKEN not in everything


async def test_admin_api_errors(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web, run_gateway(tmp_path, admin_config(), env=ENV) as gw:
        assert api(gw, "GET", "/admin/servers", headers={}).status_code == 401
        wrong = api(gw, "GET", "/admin/servers", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
        assert wrong.json()["error"] == "missing or wrong admin token"

        assert api(gw, "POST", "/admin/servers", json={"name": "fx", "url": web.url}).status_code == 409
        assert api(gw, "DELETE", "/admin/servers/fx").status_code == 409
        assert api(gw, "DELETE", "/admin/servers/nosuch").status_code == 404
        assert api(gw, "GET", "/admin/servers/nosuch").status_code == 404
        bad_json = api(
            gw, "POST", "/admin/servers", content=b"{not json", headers={**AUTH, "content-type": "application/json"}
        )
        assert bad_json.status_code == 400

        invalid = api(
            gw,
            "POST",
            "/admin/servers",
            json={"name": "bad name", "url": "ftp://x", "timeout": -1, "colour": "blue", "headers": {"A": "b"}},
        )
        assert invalid.status_code == 422
        errors = invalid.json()["errors"]
        for fragment in ("bad server name", "server.colour: unknown key", "headers: runtime servers carry no secrets"):
            assert any(fragment in e for e in errors), (fragment, errors)

        placeholder = api(gw, "POST", "/admin/servers", json={"name": "leak", "url": "https://example.com/${HOME}"})
        assert placeholder.status_code == 422 and "taken as data" in placeholder.text
        stdio = api(gw, "POST", "/admin/servers", json={"name": "cmd", "command": "sh"})
        assert stdio.status_code == 422 and "must use HTTP(S)" in stdio.text
        metadata = api(gw, "POST", "/admin/servers", json={"name": "meta", "url": "http://169.254.169.254/mcp"})
        assert metadata.status_code == 422 and "link-local" in metadata.text
        unknown_cred = api(gw, "POST", "/admin/servers", json={"name": "c", "url": web.url, "credential": "nope"})
        assert unknown_cred.status_code == 422 and "no credential named 'nope'" in unknown_cred.text
        assert [s["name"] for s in api(gw, "GET", "/admin/servers").json()["servers"]] == ["fx"]


def test_admin_api_is_off_without_a_token(tmp_path: Path) -> None:
    with run_gateway(tmp_path, {"servers": {"fx": stdio_spec()}}) as gw:
        assert api(gw, "GET", "/admin/servers").status_code == 404


async def test_removing_a_stdio_runtime_server_stops_its_process_group(tmp_path: Path) -> None:
    config = {**admin_config(), "runtime": {"stdio": True}}
    with run_gateway(tmp_path, config, env=ENV) as gw:
        added = api(gw, "POST", "/admin/servers", json={"name": "local", **stdio_spec()})
        assert added.status_code == 201, added.text
        await wait_until(lambda: server_state(gw, "local") == "up", what="local up")
        (pid,) = upstream_pids(gw, "local")
        assert group_alive(pid)
        assert api(gw, "DELETE", "/admin/servers/local").status_code == 200
        assert not group_alive(pid), "the process group is gone when the call returns"


def manifold(*args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "gateway", *args], env={**os.environ, "MANIFOLD_ADMIN_TOKEN": TOKEN})


async def test_servers_cli(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web, run_gateway(tmp_path, admin_config(), env=ENV) as gw:
        added = manifold(
            "servers", "--url", gw.base, "add", "web", "--server-url", web.url, "--options", '{"only": ["echo"]}'
        )
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout)["name"] == "web"
        await wait_until(lambda: server_state(gw, "web") == "up", what="web up")
        listed = manifold("servers", "--url", gw.base, "list")
        assert listed.returncode == 0
        rows = [line.split() for line in listed.stdout.splitlines()]
        assert rows[1][:4] == ["web", "runtime", "http", "up"] and rows[1][4] == "1"
        again = manifold("servers", "--url", gw.base, "add", "web", "--server-url", web.url)
        assert again.returncode == 1 and "already exists" in again.stderr
        assert manifold("servers", "--url", gw.base, "remove", "web").returncode == 0
        assert "web" not in manifold("servers", "--url", gw.base, "list").stdout


async def test_sqlite_store_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "state" / "servers.db"
    config = admin_config(store=f"sqlite:///{db}")
    with run_http_fixture(name="web") as web:
        with run_gateway(tmp_path, config, env=ENV) as gw:
            assert api(gw, "POST", "/admin/servers", json={"name": "web", "url": web.url}).status_code == 201
        with run_gateway(tmp_path, config, env=ENV) as gw:
            async with connect(gw.url, "2025-11-25") as client:
                await client.wait_for(lambda n: "web__echo" in n)
            assert api(gw, "GET", "/admin/servers/web").json()["source"] == "runtime"
            assert api(gw, "DELETE", "/admin/servers/web").status_code == 200
        with run_gateway(tmp_path, config, env=ENV) as gw:
            assert api(gw, "GET", "/admin/servers/web").status_code == 404


def names_on(gw: Gateway) -> list[str]:
    return [s["name"] for s in api(gw, "GET", "/admin/servers").json()["servers"]]


async def test_two_replicas_share_runtime_servers_through_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    config = admin_config(store=f"redis://127.0.0.1:{redis_server.port}/0", reconcile_interval=30)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        run_http_fixture(name="web") as web,
        run_http_fixture(name="api") as web2,
        run_gateway(tmp_path / "a", config, env=ENV) as a,
        run_gateway(tmp_path / "b", config, env=ENV) as b,
    ):
        started = time.monotonic()
        assert api(a, "POST", "/admin/servers", json={"name": "web", "url": web.url}).status_code == 201
        async with connect(b.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "web__echo" in n, timeout=5)
            assert time.monotonic() - started < 2.5, "a server added on one replica is up on the other within ~2 s"
            assert (await client.call("web__echo", {"text": "via b"})).content[0].text == "via b"
        assert api(a, "POST", "/admin/servers", json={"name": "web", "url": web.url}).status_code == 409

        assert api(b, "DELETE", "/admin/servers/web").status_code == 200
        await wait_until(lambda: "web" not in names_on(a), 3, "removal to reach replica a")

        api(a, "POST", "/admin/servers", json={"name": "api", "url": web2.url})
        await wait_until(lambda: server_state(b, "api") == "up", 5, "api on b")
        redis_server.stop()
        async with connect(a.url, "2025-11-25") as client:
            assert (await client.call("api__echo", {"text": "still"})).content[0].text == "still"
        await wait_until(lambda: httpx2.get(f"{a.base}/readyz").json().get("degraded") is True, 10, "a degraded")
        down = api(a, "POST", "/admin/servers", json={"name": "later", "url": web.url})
        assert down.status_code == 503 and "store is unavailable" in down.text
        assert server_state(b, "api") == "up", "b keeps serving while Redis is down"

        redis_server.start()
        await wait_until(lambda: httpx2.get(f"{a.base}/readyz").json().get("degraded") is None, 15, "a recovered")
        assert api(a, "POST", "/admin/servers", json={"name": "later", "url": web.url}).status_code == 201
        await wait_until(lambda: server_state(b, "later") == "up", 10, "later on b after Redis returned")
        assert names_on(a) == names_on(b) == ["api", "fx", "later"]


async def test_reload_restarts_only_changed_servers(tmp_path: Path) -> None:
    config = {"servers": {"fx": stdio_spec(), "other": stdio_spec()}}
    with run_gateway(tmp_path, config) as gw:
        config_path = tmp_path / "manifold.yaml"
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "fx__echo" in n and "other__slow" in n)
            fx_before, other_before = upstream_pids(gw, "fx"), upstream_pids(gw, "other")
            result: dict[str, Any] = {}

            async def slow() -> None:
                result["slow"] = await client.call("other__slow", {"seconds": 2})

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await anyio.sleep(0.3)
                changed = {"servers": {"fx": {**stdio_spec(), "deny": ["echo"]}, "other": stdio_spec()}}
                config_path.write_text(yaml.safe_dump(changed))
                gw.proc.send_signal(signal.SIGHUP)
                await client.wait_for(lambda n: "fx__echo" not in n and "fx__add" in n)
            assert result["slow"].content[0].text == "slept", "an in-flight call on another server is unaffected"
            assert upstream_pids(gw, "other") == other_before
            assert len(upstream_pids(gw, "fx")) == len(fx_before) + 1

            config_path.write_text("servers:\n  fx: {comand: oops}\n")
            gw.proc.send_signal(signal.SIGHUP)
            await wait_until(lambda: "config reload refused" in gw.log(), 10, "refusal logged")
            assert "fx__add" in await client.tool_names(), "an invalid file changes nothing"


def scrape_series(gw: Gateway) -> list[tuple[str, dict[str, str]]]:
    """Every sample of `/metrics` as (name, labels), parsed with prometheus-client's own parser."""
    text = httpx2.get(f"{gw.base}/metrics", timeout=10).text
    return [(s.name, dict(s.labels)) for family in text_string_to_metric_families(text) for s in family.samples]


ROW_TEXT = "ROW-TEXT-must-not-be-logged-5b7e"


def corrupt_rows(kind: str, target: str, good_url: str) -> None:
    """Write rows behind the store's back: `web` is good; the others are not JSON, not an object, not UTF-8."""
    rows: dict[str, bytes] = {
        "web": json.dumps({"url": good_url}).encode(),
        "broken": b'{"url": "https://' + ROW_TEXT.encode(),
        "listed": json.dumps([ROW_TEXT]).encode(),
        "binary": b'{"url": "\xff' + ROW_TEXT.encode() + b'"}',
    }
    if kind == "sqlite":
        connection = sqlite3.connect(target)
        with connection:
            connection.execute("CREATE TABLE servers (name TEXT PRIMARY KEY, options TEXT NOT NULL)")
            connection.executemany("INSERT INTO servers VALUES (?, ?)", list(rows.items()))
        connection.close()
    else:
        client = redis.Redis.from_url(target)
        for name, raw in rows.items():
            client.hset("manifold:servers", name, raw)
        client.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_corrupt_store_rows_are_skipped_and_reported(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        target = str(tmp_path / "servers.db")
        store = f"sqlite:///{target}"
    else:
        target = store = f"redis://127.0.0.1:{request.getfixturevalue('redis_server').port}/0"
    with run_http_fixture(name="web") as web:
        corrupt_rows(kind, target, web.url)
        with run_gateway(tmp_path, admin_config(store=store), env=ENV) as gw:
            async with connect(gw.url, "2026-07-28") as client:
                await client.wait_for(lambda n: "web__echo" in n and "fx__echo" in n)
                assert (await client.call("web__echo", {"text": "served"})).content[0].text == "served"
            assert names_on(gw) == ["fx", "web"]
            ready = httpx2.get(f"{gw.base}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            assert ready.json()["store"]["bad_rows"] == ["binary", "broken", "listed"]
            assert ready.json()["store"]["ok"] is True and "degraded" not in ready.json()
            bad = sorted(labels["server"] for name, labels in scrape_series(gw) if name == "manifold_store_bad_rows")
            assert bad == ["binary", "broken", "listed"]
            skipped = [e for e in gw.log_events() if e.get("event") == "stored server row cannot be read; skipped"]
            assert sorted(e["server"] for e in skipped) == ["binary", "broken", "listed"]
            assert ROW_TEXT not in gw.log() and ROW_TEXT not in ready.text

            # Removed by hand, the rows are no longer reported after the next reconcile.
            if kind == "sqlite":
                connection = sqlite3.connect(target)
                with connection:
                    connection.execute("DELETE FROM servers WHERE name != 'web'")
                connection.close()
            else:
                stored = redis.Redis.from_url(target)
                stored.hdel("manifold:servers", "broken", "listed", "binary")
                stored.close()
            assert api(gw, "POST", "/admin/reconcile").status_code == 200
            assert httpx2.get(f"{gw.base}/readyz", timeout=10).json()["store"]["bad_rows"] == []
            assert not [s for s in scrape_series(gw) if s[0] == "manifold_store_bad_rows"]


async def test_a_removed_runtime_server_leaves_no_metric_series(tmp_path: Path) -> None:
    with run_http_fixture(name="web") as web, run_gateway(tmp_path, admin_config(), env=ENV) as gw:
        assert api(gw, "POST", "/admin/servers", json={"name": "web", "url": web.url}).status_code == 201
        async with connect(gw.url, "2025-11-25") as client:
            await client.wait_for(lambda n: "web__echo" in n and "fx__echo" in n)
            await client.call("web__echo", {"text": "counted"})
            await client.call("web__fail", {"reason": "counted too"})
            await client.call("fx__echo", {"text": "kept"})
        names = {name for name, labels in scrape_series(gw) if labels.get("server") == "web"}
        assert {
            "manifold_upstream_up",
            "manifold_upstream_tools",
            "manifold_upstream_connects_total",
            "manifold_tools_changes_total",
            "manifold_tool_calls_total",
            "manifold_tool_call_duration_seconds_count",
            "manifold_tool_call_retries_total",
        } <= names

        assert api(gw, "DELETE", "/admin/servers/web").status_code == 200
        left = [(name, labels) for name, labels in scrape_series(gw) if labels.get("server") == "web"]
        assert left == [], left
        kept = [labels for name, labels in scrape_series(gw) if name == "manifold_tool_calls_total"]
        assert {"server": "fx", "tool": "fx__echo", "outcome": "ok", "endpoint": ""} in kept, (
            "other servers' series stay"
        )

        # The same name added again starts from zero.
        assert api(gw, "POST", "/admin/servers", json={"name": "web", "url": web.url}).status_code == 201
        await wait_until(lambda: server_state(gw, "web") == "up", what="web up again")
        assert not [s for s in scrape_series(gw) if s[0] == "manifold_tool_calls_total" and s[1]["server"] == "web"]


def post_unending_chunked_body(gw: Gateway, total: int, timeout: float = 15) -> tuple[bytes, int]:
    """POST /admin/servers with a chunked body of `total` bytes whose final chunk never comes; return what the
    gateway answered meanwhile (b"" if nothing) and how much had been sent when the answer arrived."""
    port = int(gw.base.rsplit(":", 1)[1])
    head = (
        f"POST /admin/servers HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b'{"name": "big", "pad": "' + b"x" * 65000
    pending, sent, answer = head, 0, b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setblocking(False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and b"\r\n\r\n" not in answer:
            if not pending and sent < total:
                pending, sent = b"%x\r\n%s\r\n" % (len(piece), piece), sent + len(piece)
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 0.2)
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
            elif writable:
                pending = pending[sock.send(pending) :]
    return answer, sent


async def test_an_oversized_admin_body_is_refused_while_it_arrives(tmp_path: Path) -> None:
    with run_gateway(tmp_path, admin_config(), env=ENV) as gw:
        answer, _ = post_unending_chunked_body(gw, total=8 * 1024 * 1024)
        assert answer.startswith(b"HTTP/1.1 413"), f"answered before the body ended: {answer[:200]!r}"

        declared = httpx2.post(
            f"{gw.base}/admin/servers",
            headers={**AUTH, "content-type": "application/json"},
            content=b"{" + b" " * (65 * 1024) + b"}",
            timeout=30,
        )
        assert declared.status_code == 413 and "over 65536 bytes" in declared.json()["error"]

        def several_megabytes() -> Iterator[bytes]:
            yield b'{"name": "big", "pad": "'
            for _ in range(64):
                yield b"y" * 65536
            yield b'"}'

        chunked = httpx2.post(
            f"{gw.base}/admin/servers",
            headers={**AUTH, "content-type": "application/json"},
            content=several_megabytes(),
            timeout=30,
        )
        assert chunked.status_code == 413

        assert httpx2.get(f"{gw.base}/healthz", timeout=10).status_code == 200
        assert names_on(gw) == ["fx"]
        async with connect(gw.url, "2026-07-28") as client:
            await client.wait_for(lambda n: "fx__echo" in n)
        small = api(gw, "POST", "/admin/servers", json={"name": "nope", "command": "sh"})
        assert small.status_code == 422, "a normal-sized body is still read and judged"
