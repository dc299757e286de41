"""A newcomer's first command: after `make run`, the README says `.venv/bin/manifold tools`.

The shell that types it has not activated the venv, so the venv's `bin` (where `make run` installed
`mcp-server-time`) is not on PATH. The example config's `time` server must still start: a bare
command is looked up on PATH, then next to the gateway's own interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import yaml

from tests.fixtures.servers import free_port
from tests.integration.conftest import ROOT, write_config

VENV_BIN = Path(sys.executable).parent


def _newcomer_env() -> dict[str, str]:
    """A login shell's environment without the venv: PATH has only the system directories."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    if "PYTHONPATH" in os.environ:  # lets the same test run against another checkout of the gateway
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def test_manifold_tools_lists_the_example_time_server_without_the_venv_on_path(tmp_path: Path) -> None:
    example = yaml.safe_load((ROOT / "config" / "manifold.yaml").read_text())
    time_server = example["servers"]["time"]
    assert time_server["command"] == "mcp-server-time"  # the bare name the README's config uses
    config = write_config(tmp_path, {"servers": {"time": time_server}})
    env = _newcomer_env()
    assert str(VENV_BIN) not in env["PATH"].split(os.pathsep)
    assert not any((Path(d) / "mcp-server-time").exists() for d in env["PATH"].split(os.pathsep))
    assert (VENV_BIN / "mcp-server-time").is_file(), "make run installs mcp-server-time into the venv"

    result = subprocess.run(
        [str(VENV_BIN / "manifold"), "tools", "--config", str(config), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "command not found" not in result.stderr, result.stderr
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    rows = json.loads(result.stdout)
    assert {r["name"] for r in rows} >= {"time__get_current_time", "time__convert_time"}, rows
    assert {r["server"] for r in rows} == {"time"}
    assert "warning" not in result.stderr, result.stderr


def test_serve_starts_without_a_warning_from_the_sdk(tmp_path: Path) -> None:
    # The gateway serves the logging capability on purpose, for 2025-era clients: the SDK's notice that
    # 2026-07-28 deprecates it must not reach a new user's terminal.
    config = write_config(tmp_path, {"servers": {}})
    port = free_port()
    proc = subprocess.Popen(
        [str(VENV_BIN / "manifold"), "serve", "--config", str(config), "--port", str(port)],
        cwd=ROOT,
        env=_newcomer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    healthy = False
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if healthy := httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=20)
    assert healthy, output
    assert "Warning" not in output, output
