"""Processes of the benchmark: fixture upstreams, the gateway, and what /proc says about them."""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
FIXTURE = BENCH_DIR / "fixture.py"
PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of one process (its threads included, its children not), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int | None:
    """VmRSS of one process in KiB (its own, children excluded), or None if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def native_modules(pid: int, names: tuple[str, ...] = ("uvloop", "httptools", "orjson")) -> dict[str, bool]:
    """Which of some compiled modules a process has loaded (from /proc/PID/maps)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return {}
    return {n: f"/{n}/" in maps or f"/{n}." in maps for n in names}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def machine_info() -> dict[str, Any]:
    """What the run ran on."""
    model = "?"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
    load = ""
    with suppress(OSError):
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": load,
    }


def package_versions(names: list[str]) -> dict[str, str]:
    """Installed versions of some distributions ("-" when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = "-"
    return out


class Proc:
    """A child process in its own process group, its stderr in a log file."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, cwd: Path = REPO) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM the group, SIGKILL it after `grace` seconds, reap."""
        if self.alive():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # the group: stdio upstreams and anything they started
        with suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the whole group at once (for fixtures, which hold no state worth a clean exit)."""
        self.stop(grace=0.0)


def wait_port(proc: Proc, port: int, timeout: float) -> None:
    """Block until `port` accepts TCP connections; raise with the log tail if the process dies first."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) before listening:\n{proc.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} did not listen on {port} within {timeout} s:\n{proc.log_tail()}")
        time.sleep(0.02)


@dataclass(frozen=True)
class FixtureSpec:
    """A fixture upstream: which kind of server (fixture.py's --kind), how many dummy tools, how echo behaves."""

    tools: int = 10
    sleep_ms: float = 0.0
    result_bytes: int = 0
    kind: str = "lowlevel"  # "lowlevel" (the SDK's low-level Server) or "mcpserver" (its high-level MCPServer)
    stateless: bool = False  # over HTTP: the SDK's stateless mode (stateless_http=True, JSON answers, no sessions)

    def args(self) -> list[str]:
        out = ["--kind", self.kind, "--tools", str(self.tools)]
        if self.sleep_ms:
            out += ["--sleep-ms", f"{self.sleep_ms:g}"]
        if self.result_bytes:
            out += ["--result-bytes", str(self.result_bytes)]
        return out

    def stdio_command(self) -> list[str]:
        return [PYTHON, str(FIXTURE), "--transport", "stdio", *self.args()]

    def stdio_server(self) -> dict[str, Any]:
        """A gateway config entry running this fixture over stdio."""
        return {"command": PYTHON, "args": [str(FIXTURE), "--transport", "stdio", *self.args()]}


@dataclass
class HttpFixture:
    """A running HTTP fixture."""

    name: str
    spec: FixtureSpec
    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


def start_http_fixture(name: str, spec: FixtureSpec, workdir: Path) -> HttpFixture:
    """Start a fixture over streamable HTTP and wait until it listens."""
    port = free_port()
    cmd = [PYTHON, str(FIXTURE), "--transport", "http", "--port", str(port), "--name", name, *spec.args()]
    if spec.stateless:
        cmd.append("--stateless")
    proc = Proc(f"fixture {name}", cmd, workdir / f"fixture-{name}.log")
    wait_port(proc, port, 20)
    return HttpFixture(name, spec, port, proc)


@dataclass
class Served:
    """A process serving MCP at http://127.0.0.1:PORT/mcp."""

    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Gateway(Served):
    """A running gateway process."""

    config_path: Path


def write_gateway_config(servers: dict[str, dict[str, Any]], path: Path) -> Path:
    """Write a gateway YAML config with these servers."""
    path.write_text(yaml.safe_dump({"servers": servers}, sort_keys=False))
    return path


def start_gateway(servers: dict[str, dict[str, Any]], workdir: Path, tag: str, tree: Path = REPO) -> Gateway:
    """Start `python -m gateway serve` on a fresh port with a generated config (it answers before upstreams).

    Logging is the default (info, JSON lines off a terminal) into a file, as users run it. `tree`: the directory
    whose `gateway` package runs (another checkout's, for an A/B of two trees; `python -m` puts it first)."""
    config = write_gateway_config(servers, workdir / f"gateway-{tag}.yaml")
    port = free_port()
    cmd = [PYTHON, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    proc = Proc(f"gateway {tag}", cmd, workdir / f"gateway-{tag}.log", cwd=tree)
    return Gateway(port, proc, config)
