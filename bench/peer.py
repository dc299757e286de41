"""The peer column: FastMCP's proxy (bench/peer_fastmcp.py) in its own virtual environment, bench/.peer-venv.

The venv is made on first use (`python -m venv`, then `pip install` of the pinned FastMCP with pip's own
configuration) and kept; it is made again when the pins change. uvloop and httptools are installed beside it
at the versions the benchmark itself runs with, so the peer runs on the same event loop and HTTP parser as the
gateway and the fixtures. Nothing here raises for a peer that cannot be had: callers get a reason instead, and
the benchmark shows a dash with it.
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.mcphttp import Connection, Endpoint, McpError, open_session
from bench.procs import BENCH_DIR, Proc, Served, free_port, package_versions, wait_port

FASTMCP_VERSION = "4.1.6"
PEER_NAME = "FastMCP proxy"
PEER_VENV = BENCH_DIR / ".peer-venv"
PEER_SCRIPT = BENCH_DIR / "peer_fastmcp.py"
MARKER = "bench-requirements.txt"  # inside the venv: what was installed, so a changed pin reinstalls
INSTALL_TIMEOUT_S = 900


def requirements() -> list[str]:
    """The peer venv's pins: FastMCP, and the benchmark's own uvloop and httptools versions."""
    own = package_versions(["uvloop", "httptools"])
    return [f"fastmcp=={FASTMCP_VERSION}", *(f"{n}=={v}" for n, v in own.items() if v != "-")]


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_peer_venv(log: Callable[[str], None] = print, venv: Path = PEER_VENV) -> tuple[Path | None, str]:
    """The peer venv's Python, made on first use; or None and the reason it could not be made."""
    wanted = "\n".join(requirements()) + "\n"
    python = _python(venv)
    marker = venv / MARKER
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python, ""
    log(f"peer: making {venv} with {', '.join(requirements())} (once; takes a minute or two)")
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *requirements()],
    ]
    for cmd in steps:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"{cmd[2] if len(cmd) > 2 else cmd[0]} failed: {exc}"
        if out.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = " ".join((out.stderr or out.stdout).strip().splitlines()[-2:])[:300]
            return None, f"`{' '.join(cmd[2:4])}` exited {out.returncode}: {tail}"
    check = subprocess.run([str(python), "-c", "import fastmcp.server"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        return None, f"fastmcp does not import: {check.stderr.strip().splitlines()[-1:]}"
    marker.write_text(wanted)
    return python, ""


def peer_version(python: Path) -> str:
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import fastmcp, mcp, importlib.metadata as m; print(fastmcp.__version__, m.version('mcp'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


@dataclass
class Peer(Served):
    """A running peer proxy in front of one upstream."""

    name: str


def start_peer(python: Path, name: str, upstream: str | list[str], workdir: Path, timeout: float = 60.0) -> Peer:
    """Start the peer in front of an upstream URL or stdio command; return once it answers a handshake.

    Raises (with the log tail) when it does not: the caller turns that into a reason.
    """
    port = free_port()
    cmd = [str(python), str(PEER_SCRIPT), "--port", str(port)]
    cmd += ["--url", upstream] if isinstance(upstream, str) else ["--", *upstream]
    proc = Proc(f"peer {name}", cmd, workdir / f"peer-{name}.log")
    try:
        wait_port(proc, port, timeout)
        deadline = time.monotonic() + timeout
        conn = Connection(Endpoint.parse(f"http://127.0.0.1:{port}/mcp"), timeout=30)
        while True:
            try:
                open_session(conn, "2025-11-25")
                conn.close()
                return Peer(port, proc, name)
            except (OSError, McpError, http.client.HTTPException) as exc:
                if not proc.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"peer {name} did not answer: {exc}\n{proc.log_tail(5)}") from exc
                time.sleep(0.1)
    except BaseException:
        proc.kill()
        raise
