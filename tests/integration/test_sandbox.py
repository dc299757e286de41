"""Sandboxed stdio servers (bubblewrap): a hostile server's attempts fail inside its sandbox while the gateway and
its other servers keep serving; real servers work within their grants; a limit that kills a server is logged and
counted, and the server comes back; without bubblewrap a sandboxed server does not start (never unsandboxed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.corpus import CORPUS, INSTALL_WAIT, installing, wait_installed
from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import ROOT, Gateway, connect, run_gateway, upstream_pids, wait_until
from tests.integration.test_operations import scrape, value

pytestmark = pytest.mark.anyio

HOSTILE = ROOT / "tests" / "fixtures" / "hostile_upstream.py"
MODERN, LEGACY = "2026-07-28", "2025-11-25"
SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- planted-for-the-sandbox-test"
MAX_PROCESSES = 32


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@dataclass
class Scene:
    gw: Gateway
    home: Path  # the gateway's HOME, with a planted key
    granted: Path  # the hostile server's `write` grant
    outside: Path  # a directory of the host it was not granted
    listener: socket.socket  # a port on the host's loopback


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    tmp = tmp_path_factory.mktemp("sandbox")
    home, granted, outside = tmp / "home", tmp / "granted", tmp / "outside"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    granted.mkdir()
    outside.mkdir()
    hostile = {"write": [str(granted)], "processes": MAX_PROCESSES}
    config = {
        "servers": {
            "hostile": {"command": sys.executable, "args": [str(HOSTILE)], "sandbox": hostile},
            "spinner": {"command": sys.executable, "args": [str(HOSTILE)], "sandbox": {"cpu_time": 2}},
            "fx": stdio_spec(),
        }
    }
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        with run_gateway(tmp, config, env={"HOME": str(home)}) as gw:
            yield Scene(gw, home, granted, outside, listener)


async def test_each_hostile_attempt_fails_inside_the_sandbox_and_the_rest_keeps_serving(scene: Scene) -> None:
    secret = scene.home / ".ssh" / "id_rsa"
    assert secret.read_text() == SECRET  # it is there, for the gateway's user
    async with connect(scene.gw.url, LEGACY) as client:
        await client.wait_for(lambda n: {"hostile__echo", "fx__echo"} <= set(n))

        async def attempt(tool: str, **arguments: Any) -> str:
            result = await client.call(f"hostile__{tool}", arguments)
            assert result.is_error, f"{tool} {arguments} worked inside the sandbox: {text(result)}"
            return text(result)

        where = json.loads(text(await client.call("hostile__environment", {})))
        assert where["home"] == "/home/sandbox" and where["cwd"] == "/home/sandbox"
        assert text(await client.call("hostile__list_dir", {"path": "/home/sandbox"})) == ""  # an empty HOME
        # 1. the operator's key
        said = await attempt("read_file", path=str(secret))
        assert "No such file or directory" in said and SECRET not in said
        assert "No such file" in await attempt("list_dir", path=str(scene.home))
        # 2. writing outside its grant: an invisible directory, its own (read-only) program, the system
        assert "No such file or directory" in await attempt("write_file", path=str(scene.outside / "dropped"))
        assert not (scene.outside / "dropped").exists()
        assert "Read-only file system" in await attempt("write_file", path=str(HOSTILE.parent / "dropped"))
        assert not (HOSTILE.parent / "dropped").exists()
        assert "Read-only file system" in await attempt("write_file", path="/usr/dropped")
        wrote = await client.call("hostile__write_file", {"path": str(scene.granted / "kept"), "text": "granted"})
        assert not wrote.is_error and (scene.granted / "kept").read_text() == "granted"
        # 3. the host's loopback, 4. a public address: no route out of its network namespace
        port = scene.listener.getsockname()[1]
        assert "Connection refused" in await attempt("connect", host="127.0.0.1", port=port)
        with pytest.raises(BlockingIOError):
            scene.listener.accept()  # nothing reached the host's port
        assert "Network is unreachable" in await attempt("connect", host="1.1.1.1", port=443)
        # 5. forking without bound
        said = await attempt("fork_bomb", limit=400)
        assert said.startswith("failed: OSError: fork refused after")
        assert int(said.split("after ")[1].split(":")[0]) < MAX_PROCESSES
        # 6. 4 GiB (the default memory limit is 2 GiB)
        assert "MemoryError" in await attempt("allocate", gib=4)
        # the same server's harmless tool, and another server, still serve
        assert text(await client.call("hostile__echo", {"text": "still here"})) == "still here"
        assert text(await client.call("fx__echo", {"text": "meanwhile"})) == "meanwhile"
    assert httpx2.get(f"{scene.gw.base}/healthz").status_code == 200
    assert len(upstream_pids(scene.gw, "hostile")) == 1  # none of that killed it


async def test_a_limit_that_kills_a_server_is_logged_counted_and_it_restarts(scene: Scene) -> None:
    async with connect(scene.gw.url, MODERN) as client:
        await client.wait_for(lambda n: "spinner__spin" in n)
        result = await client.call("spinner__spin", {"seconds": 30})  # its cpu_time is 2 s
        assert result.is_error

        def hit() -> list[dict[str, Any]]:
            return [e for e in scene.gw.log_events() if e.get("event") == "sandbox limit hit"]

        await wait_until(lambda: bool(hit()), 15, "the limit hit in the log")
        assert hit()[0]["server"] == "spinner" and hit()[0]["limit"] == "cpu_time"
        samples = scrape(f"{scene.gw.base}/metrics")
        assert value(samples, "manifold_sandbox_limit_hits_total", server="spinner", limit="cpu_time") == 1
        assert text(await client.call("fx__echo", {"text": "unaffected"})) == "unaffected"
        await client.wait_for(lambda n: "spinner__echo" in n)
        assert text(await client.call("spinner__echo", {"text": "back"})) == "back"
    delays = [
        e["delay_s"]
        for e in scene.gw.log_events()
        if e.get("event") == "upstream reconnect scheduled" and e.get("server") == "spinner"
    ]
    assert delays and delays[0] > 0  # restarted with backoff, as any server that died
    assert len(upstream_pids(scene.gw, "spinner")) == 2


def test_without_bubblewrap_a_sandboxed_server_does_not_start(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty)}  # no bwrap on it (the servers' commands are absolute)
    config = {
        "servers": {
            "boxed": {"command": sys.executable, "args": [str(HOSTILE)]},
            "open": {"command": sys.executable, "args": [str(HOSTILE)], "sandbox": "off"},
        }
    }
    with run_gateway(tmp_path, config, env=env) as gw:

        def states() -> dict[str, dict[str, Any]]:
            return {s["name"]: s for s in httpx2.get(f"{gw.base}/readyz").json()["servers"]}

        deadline = time.monotonic() + 15
        while states()["open"]["state"] != "up" or states()["boxed"]["state"] == "connecting":
            assert time.monotonic() < deadline, states()
            time.sleep(0.1)
        boxed = states()["boxed"]
        assert boxed["state"] == "down"
        assert "bubblewrap is not installed" in boxed["error"] and "sandbox: off" in boxed["error"]
        assert upstream_pids(gw, "boxed") == []  # never started, not even unsandboxed
    checked = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(tmp_path / "manifold.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert checked.returncode == 1
    assert "error: servers boxed are sandboxed, but bubblewrap is not installed" in checked.stderr
    assert "warning: server 'open' runs unsandboxed" in checked.stderr


MODULES = CORPUS / "node_modules" / "@modelcontextprotocol"
GIT_SERVER = CORPUS / ".venvs" / "mcp2" / "bin" / "mcp-server-git"
THIRDPARTY = ROOT / "tests" / "thirdparty"


@pytest.mark.skipif(not installing(), reason="the corpus is not installed (make test installs it)")
@pytest.mark.timeout(INSTALL_WAIT + 120)  # it may wait for the corpus install first
async def test_real_servers_work_within_their_grants_and_nowhere_else(tmp_path: Path) -> None:
    wait_installed()  # `make test` installs it while the other tests run
    files, graphs, repo, elsewhere = tmp_path / "files", tmp_path / "graphs", tmp_path / "repo", tmp_path / "elsewhere"
    for folder in (files, graphs, repo, elsewhere):
        folder.mkdir()
    (elsewhere / "secret.txt").write_text(SECRET)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README").write_text("sandboxed\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit"], check=True)
    filesystem = MODULES / "server-filesystem" / "dist" / "index.js"
    memory = MODULES / "server-memory" / "dist" / "index.js"
    config = {
        "servers": {
            # allowed by the server everywhere (/), granted by its sandbox only `files`
            "fs": {"command": "node", "args": [str(filesystem), str(files), "/"], "sandbox": {"write": [str(files)]}},
            "memory": {
                "command": "node",
                "args": [str(memory)],
                "env": {"MEMORY_FILE_PATH": str(graphs / "memory.jsonl")},
                "sandbox": {"write": [str(graphs)]},
            },
            "git": {"command": str(GIT_SERVER), "args": ["--repository", str(repo)], "sandbox": {"write": [str(repo)]}},
            "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},  # a virtualenv's script
            "pytime": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},  # Python's launcher
            # npx finds the package installed in its working directory (no network)
            "npxmemory": {
                "command": "npx",
                "args": ["mcp-server-memory"],
                "cwd": str(THIRDPARTY),
                "startup_timeout": 60,
            },
        }
    }
    with run_gateway(tmp_path, config) as gw:
        async with connect(gw.url, LEGACY) as client:
            wanted = {"fs__write_file", "memory__create_entities", "git__git_log", "time__get_current_time"}
            wanted |= {"pytime__get_current_time", "npxmemory__read_graph"}
            await client.wait_for(lambda n: wanted <= set(n), timeout=60)

            async def call(tool: str, **arguments: Any) -> Any:
                return await client.call(tool, arguments)

            wrote = await call("fs__write_file", path=str(files / "note.txt"), content="inside")
            assert not wrote.is_error, text(wrote)
            assert (files / "note.txt").read_text() == "inside"
            assert text(await call("fs__read_text_file", path=str(files / "note.txt"))) == "inside"
            outside = await call("fs__read_text_file", path=str(elsewhere / "secret.txt"))
            assert outside.is_error and SECRET not in text(outside)
            refused = await call("fs__write_file", path=str(elsewhere / "dropped.txt"), content="outside")
            assert refused.is_error and not (elsewhere / "dropped.txt").exists()

            entity = {"name": "Sandbox", "entityType": "test", "observations": ["kept in its granted file"]}
            created = await call("memory__create_entities", entities=[entity])
            assert not created.is_error, text(created)
            assert "Sandbox" in (graphs / "memory.jsonl").read_text()

            log = await call("git__git_log", repo_path=str(repo))
            assert "first commit" in text(log), text(log)
            (repo / "README").write_text("changed inside the grant\n")
            assert "README" in text(await call("git__git_status", repo_path=str(repo)))

            for tool in ("time__get_current_time", "pytime__get_current_time"):
                assert '"timezone": "UTC"' in text(await call(tool, timezone="UTC"))
            assert not (await call("npxmemory__read_graph")).is_error
    assert not [e for e in gw.log_events() if e.get("event") == "upstream state" and e.get("state") == "down"]
