"""The `manifold` command: check, tools, and how settings are layered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures.forkserver import run
from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import ROOT, write_config


def manifold(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "gateway", *args], timeout=timeout, env={**os.environ, **(env or {})})


BROKEN = """
servers:
  github:
    url: ftp://example.com/mcp
  both:
    command: x
    url: http://example.com/mcp
  neither:
    args: [a]
  typo:
    comand: mcp-server-time
  globs:
    command: x
    only: ["search_[", ""]
  "bad name!":
    command: x
  slow:
    command: x
    timeout: -1
    transport: carrier-pigeon
colour: blue
"""


def test_check_reports_every_problem_with_its_place(tmp_path: Path) -> None:
    result = manifold("check", "--config", str(write_config(tmp_path, BROKEN)))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    expected = [
        "servers.github: url must start with http:// or https://",
        "servers.both: give exactly one of `command` (stdio) or `url` (HTTP)",
        "servers.neither: give exactly one of `command` (stdio) or `url` (HTTP)",
        "servers.typo.comand: unknown key",
        "servers.globs.only[0]: pattern 'search_[' has an unclosed '['",
        "servers.globs.only[1]: empty pattern",
        "servers.bad name!: bad server name",
        "servers.slow.transport: unknown transport 'carrier-pigeon'",
        "colour: unknown key",
    ]
    for fragment in expected:
        assert any(fragment in line for line in lines), f"{fragment!r} not in:\n{result.stderr}"
    assert all(line.startswith("error: ") for line in lines)


def test_check_reports_a_missing_variable_without_values(tmp_path: Path) -> None:
    config = {
        "servers": {
            "linear": {
                "url": "https://mcp.example.com/mcp",
                "headers": {"Authorization": "Bearer ${MANIFOLD_TEST_TOKEN_UNSET}", "X-Other": "${MANIFOLD_TEST_SET}"},
            }
        }
    }
    result = manifold(
        "check", "--config", str(write_config(tmp_path, config)), env={"MANIFOLD_TEST_SET": "s3cr3t-value"}
    )
    assert result.returncode == 1
    assert (
        "servers.linear.headers.Authorization: environment variable MANIFOLD_TEST_TOKEN_UNSET is not set"
        in result.stderr
    )
    assert "s3cr3t-value" not in result.stderr + result.stdout


def test_check_accepts_both_example_configs() -> None:
    for name in ("manifold.yaml", "mcp_servers.json"):
        result = manifold("check", "--config", str(ROOT / "config" / name))
        assert result.returncode == 0, result.stderr
        assert "ok (2 servers enabled" in result.stdout


OAUTH: dict[str, Any] = {
    "issuer": "https://id.example.com/realms/acme",
    "required_scopes": ["mcp"],
    "rules": [
        {"name": "ops", "when": {"groups": "ops"}, "servers": ["a"], "gated": "confirm"},
        {"name": "readers", "when": {"scope": "mcp:read"}, "tools": ["a__search_*"]},
    ],
}


def test_check_knows_the_oauth_keys_and_names_each_problem(tmp_path: Path) -> None:
    good = {"servers": {"a": {"command": "x"}}, "public_url": "https://gw.example.com", "auth": {"oauth": OAUTH}}
    result = manifold("check", "--config", str(write_config(tmp_path, good)))
    assert result.returncode == 0, result.stderr
    assert (
        "oauth: tokens from https://id.example.com/realms/acme (keys: from the issuer's metadata) for " in result.stdout
    )
    assert "https://gw.example.com/mcp" in result.stdout
    assert "oauth: 2 rules, first match wins: ops, readers" in result.stdout
    rules = [{**OAUTH["rules"][0], "gated": "sometimes"}, {"name": "all", "whenn": {}}]
    broken: dict[str, Any] = {
        "host": "0.0.0.0",
        "auth": {
            "tokens": [{"name": "all", "sha256": "0" * 64}],
            "oauth": {**OAUTH, "issuer": "http://id.example.com", "algorithms": ["RS256", "HS256"], "rules": rules},
        },
    }
    result = manifold("check", "--config", str(write_config(tmp_path, broken)))
    assert result.returncode == 1
    for fragment in (
        "auth.oauth.issuer: the issuer must use https (http only on a loopback address)",
        "auth.oauth.algorithms: HS256 is refused: only asymmetric algorithms are accepted",
        "auth.oauth.rules.0.gated: Input should be 'allow', 'deny' or 'confirm'",
        "auth.oauth.rules.1.whenn: unknown key",
    ):
        assert f"error: {fragment}" in result.stderr, f"{fragment!r} not in:\n{result.stderr}"
    clash = {**broken, "auth": {**broken["auth"], "oauth": {**OAUTH, "rules": [{"name": "all"}]}}}
    result = manifold("check", "--config", str(write_config(tmp_path, clash)))
    assert "error: auth: oauth rule names must differ from token names: all" in result.stderr, result.stderr
    no_url = {"host": "0.0.0.0", "auth": {"oauth": OAUTH}}
    result = manifold("check", "--config", str(write_config(tmp_path, no_url)))
    assert "error: public_url: auth.oauth needs the URL clients reach the gateway at" in result.stderr


def test_config_comes_from_manifold_config_env(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"servers": {"a": {"command": "x"}}, "port": "not-a-port"})
    result = manifold("check", env={"MANIFOLD_CONFIG": str(path)})
    assert result.returncode == 1
    assert "port: Input should be a valid integer" in result.stderr
    fixed = manifold("check", env={"MANIFOLD_CONFIG": str(path), "MANIFOLD_PORT": "9000"})
    assert fixed.returncode == 0, "the environment overrides the file"


def test_tools_prints_the_merged_catalog(tmp_path: Path) -> None:
    config = {"servers": {"fx": {**stdio_spec(), "only": ["echo", "write_note"]}, "dead": stdio_spec("exit-at-start")}}
    path = str(write_config(tmp_path, config))
    result = manifold("tools", "--config", path, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows == [
        {"name": "fx__echo", "server": "fx", "tool": "echo", "labels": ["read-only", "idempotent", "outside"]},
        {"name": "fx__write_note", "server": "fx", "tool": "write_note", "labels": ["destructive", "gated", "outside"]},
    ]
    assert "server 'dead' is down" in result.stderr
    table = manifold("tools", "--config", path)
    assert table.stdout.splitlines()[0].split() == ["NAME", "SERVER", "TOOL", "LABELS"]
    assert "fx__write_note" in table.stdout


def test_check_knows_the_curation_keys_and_connect_finds_override_typos(tmp_path: Path) -> None:
    bad = {"servers": {"fx": {**stdio_spec(), "pin": "sometimes", "tools": {"echo": {"colour": "red"}}}}}
    result = manifold("check", "--config", str(write_config(tmp_path, bad)))
    assert result.returncode == 1
    assert "servers.fx.pin" in result.stderr and "servers.fx.tools.echo.colour: unknown key" in result.stderr

    good = {"servers": {"fx": {**stdio_spec(), "pin": "warn", "tools": {"echo": {"name": "say"}, "ecko": {}}}}}
    path = str(write_config(tmp_path, good))
    assert manifold("check", "--config", path).returncode == 0, "without --connect nothing is started"
    connected = manifold("check", "--config", path, "--connect")
    assert connected.returncode == 1
    assert "servers.fx.tools.ecko: the server offers no tool named 'ecko'" in connected.stderr
    assert "tools.echo" not in connected.stderr


def test_check_names_each_problem_of_upstream_oauth_credentials(tmp_path: Path) -> None:
    cc = {"grant": "client_credentials", "issuer": "https://id.example.com", "client_id": "svc"}
    config: dict[str, Any] = {
        "credentials": {"cc": {"oauth": {**cc, "client_secret": "${MANIFOLD_TEST_UNSET_SECRET}"}}},
        "servers": {
            "lin": {"url": "https://mcp.example.com/mcp", "credential": "cc", "forward_headers": ["Authorization"]},
            "local": {"command": "x", "credential": "cc"},
        },
    }
    result = manifold("check", "--config", str(write_config(tmp_path, config)))
    assert result.returncode == 1
    for fragment in (
        "servers.lin.credential: 'cc' sets the Authorization header; remove it from `forward_headers`",
        "servers.local.credential: 'cc' is an OAuth credential; it applies to HTTP servers only",
        "credentials.cc.oauth.client_secret: environment variable MANIFOLD_TEST_UNSET_SECRET is not set",
    ):
        assert f"error: {fragment}" in result.stderr, f"{fragment!r} not in:\n{result.stderr}"

    person = {"grant": "refresh_token", "issuer": "https://id.example.com", "client_id": "app", "scopes": ["read"]}
    config = {
        "credentials": {"cc": {"oauth": {**cc, "client_secret": "${MANIFOLD_TEST_SECRET}"}}, "me": {"oauth": person}},
        "servers": {"lin": {"url": "https://mcp.example.com/mcp", "credential": "cc"}},
    }
    result = manifold("check", "--config", str(write_config(tmp_path, config)))
    assert result.returncode == 1
    assert "error: credentials.me.oauth.grant: refresh_token needs `oauth_key` (or MANIFOLD_OAUTH_KEY)" in result.stderr
    env = {"MANIFOLD_TEST_SECRET": "s3cr3t-value", "MANIFOLD_OAUTH_KEY": "k" * 32, "MANIFOLD_STORE": "sqlite:///x.db"}
    result = manifold("check", "--config", str(write_config(tmp_path, config)), env=env)
    assert result.returncode == 0, result.stderr
    assert (
        "upstream oauth: credential 'cc' (client_credentials): tokens from the token endpoint of "
        "https://id.example.com; tokens kept sealed in the store" in result.stdout
    )
    assert "s3cr3t-value" not in result.stdout + result.stderr
    del config["credentials"]["me"]
    result = manifold("check", "--config", str(write_config(tmp_path, config)), env={"MANIFOLD_TEST_SECRET": "s"})
    assert "access tokens kept in this process only (set oauth_key to share them through the store)" in result.stdout
