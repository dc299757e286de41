"""The load generator: a Python handshake (mcphttp.py) feeding wrk, whose Lua script (mcp.lua) runs the hot loop.

`run_load` drives one prepared JSON-RPC request at a fixed concurrency for a fixed duration and returns
calls/s, latency percentiles, errors, and the CPU that wrk itself used (from its rusage), so the generator's
own cost per call is known. It can also sample the CPU and RSS of other processes over the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.mcphttp import Endpoint, Session
from bench.procs import cpu_seconds, rss_kib

LUA_SCRIPT = Path(__file__).resolve().with_name("mcp.lua")
STDIO_DRIVER = Path(__file__).resolve().with_name("stdioload.py")
ID_DIGITS = 10  # mcp.lua numbers requests from 1_000_000_000, so every body has the same length


def ensure_wrk() -> str:
    """The path of wrk, installing the Debian package first when it is missing."""
    path = shutil.which("wrk")
    if path:
        return path
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise RuntimeError("wrk is not installed and cannot be installed here: run `apt-get install -y wrk` as root")
    print("bench: wrk not found; installing the Debian package (apt-get update && apt-get install -y wrk)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([apt, "install", "-y", "-qq", "wrk"], check=True, env=env, stdout=subprocess.DEVNULL)
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("apt-get installed wrk but it is not on PATH")
    return path


def wrk_version(wrk: str) -> str:
    """wrk's version line."""
    out = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    text = out.stdout or out.stderr
    return text.splitlines()[0].split(" Copyright")[0].strip() if text else "?"


@dataclass
class Workload:
    """One prepared request: where it goes, what every session sends, and how a good answer looks."""

    endpoint: Endpoint
    sessions: Sequence[Session]
    method: str
    params: dict[str, Any] | None
    expect: str = '"result":'
    min_bytes: int = 0
    check_body: bool = True  # False: no per-answer Lua body checks, errors from statuses and bytes (mcp.lua)

    def lua_params(self) -> str:
        """The parameter file for mcp.lua: one request head per session, and the body around the id."""
        if not self.sessions:
            raise ValueError("a workload needs at least one session")
        template = self.sessions[0].body(0, self.method, self.params)
        del template["id"]
        rest = json.dumps(template, separators=(",", ":"))
        assert rest.startswith("{")
        prefix = '{"id":'
        suffix = "," + rest[1:]
        length = len(prefix.encode()) + ID_DIGITS + len(suffix.encode())
        heads = []
        for s in self.sessions:
            headers = {"Host": self.endpoint.host_header, **s.request_headers(self.method, self.params)}
            lines = [f"POST {self.endpoint.path} HTTP/1.1"]
            lines += [f"{k}: {v}" for k, v in headers.items()]
            lines += [f"Content-Length: {length}", "", ""]
            heads.append("\r\n".join(lines))
        return (
            "return {\n"
            f"  heads = {{{', '.join(_lua_str(h) for h in heads)}}},\n"
            f"  prefix = {_lua_str(prefix)},\n"
            f"  suffix = {_lua_str(suffix)},\n"
            f"  expect = {_lua_str(self.expect)},\n"
            f"  min_bytes = {int(self.min_bytes)},\n"
            f"  check_body = {'true' if self.check_body else 'false'},\n"
            "}\n"
        )


def _lua_str(s: str) -> str:
    """A Lua string literal for any text (every byte outside printable ASCII escaped)."""
    out = []
    for b in s.encode():
        c = chr(b)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= b < 127:
            out.append(c)
        else:
            out.append(f"\\{b:03d}")
    return '"' + "".join(out) + '"'


@dataclass
class LoadResult:
    """What one wrk run measured (latencies in ms)."""

    concurrency: int
    duration_s: float
    calls: int
    calls_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    errors: int
    error_detail: dict[str, int]
    generator_cpu_s: float
    generator_cpu_us_per_call: float
    cpu_ms_per_call: dict[str, float] = field(default_factory=dict)  # watched processes
    rss_max_kib: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Sampler(threading.Thread):
    """Samples VmRSS of some processes every `interval` seconds and keeps the maximum."""

    def __init__(self, pids: Mapping[str, int], interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pids = dict(pids)
        self.interval = interval
        self.max_kib: dict[str, int] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._sample()
            self._stop_event.wait(self.interval)

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            kib = rss_kib(pid)
            if kib is not None:
                self.max_kib[name] = max(self.max_kib.get(name, 0), kib)

    def stop(self) -> dict[str, int]:
        self._stop_event.set()
        self.join()
        self._sample()
        return self.max_kib


def run_load(
    wrk: str,
    workload: Workload,
    concurrency: int,
    duration_s: float,
    *,
    watch: Mapping[str, int] | None = None,
    timeout_s: float = 10.0,
    threads: int = 1,
) -> LoadResult:
    """Run wrk once and return its figures; `watch` names processes whose CPU and peak RSS to record."""
    watch = dict(watch or {})
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="mcp-bench-", delete=False) as f:
        f.write(workload.lua_params())
        params_file = f.name
    try:
        cmd = [
            wrk,
            f"-t{max(1, min(threads, concurrency))}",
            f"-c{concurrency}",
            f"-d{max(1, round(duration_s))}s",  # wrk takes whole seconds
            f"--timeout={timeout_s:g}s",
            "-s",
            str(LUA_SCRIPT),
            workload.endpoint.url,
        ]
        env = {**os.environ, "MCP_BENCH_PARAMS": params_file}
        cpu_before = {name: cpu_seconds(pid) for name, pid in watch.items()}
        sampler = _Sampler(watch)
        sampler.start()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = _read_all(proc)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        rss = sampler.stop()
        cpu_after = {name: cpu_seconds(pid) for name, pid in watch.items()}
    finally:
        os.unlink(params_file)
    line = next((ln for ln in out.splitlines() if ln.startswith("BENCHJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}): {err.strip()[:500]} {out.strip()[-500:]}")
    d = json.loads(line[len("BENCHJSON ") :])
    calls = int(d["requests"])
    seconds = d["duration_us"] / 1e6
    detail = {k: int(d[k]) for k in ("bad_status", "bad_rpc", "bad_tool", "bad_short")}
    detail |= {k: int(d[k]) for k in ("connect", "read", "write", "timeout")}
    detail["missing_answers"] = max(0, calls - int(d["answers"]))
    errors = sum(v for k, v in detail.items())
    gen_cpu = usage.ru_utime + usage.ru_stime
    cpu_per_call = {}
    for name in watch:
        before, after = cpu_before.get(name), cpu_after.get(name)
        if before is not None and after is not None and calls:
            cpu_per_call[name] = round((after - before) * 1000 / calls, 4)
    return LoadResult(
        concurrency=concurrency,
        duration_s=round(seconds, 3),
        calls=calls,
        calls_per_s=round(calls / seconds, 1) if seconds else 0.0,
        p50_ms=d["p50"] / 1000,
        p90_ms=d["p90"] / 1000,
        p99_ms=d["p99"] / 1000,
        max_ms=d["lat_max"] / 1000,
        mean_ms=round(d["lat_mean"] / 1000, 3),
        errors=errors,
        error_detail={k: v for k, v in detail.items() if v},
        generator_cpu_s=round(gen_cpu, 3),
        generator_cpu_us_per_call=round(gen_cpu * 1e6 / calls, 2) if calls else 0.0,
        cpu_ms_per_call=cpu_per_call,
        rss_max_kib=rss,
    )


def run_stdio_load(
    command: Sequence[str],
    era: str,
    method: str,
    params: dict[str, Any] | None,
    concurrency: int,
    duration_s: float,
    *,
    expect: str | None = None,
    warmup_s: float = 0.3,
) -> LoadResult:
    """Drive a stdio server called directly (stdioload.py starts it, and reports its CPU as "upstream")."""
    cmd = [sys.executable, str(STDIO_DRIVER), "--era", era, "--concurrency", str(concurrency)]
    cmd += ["--duration", f"{duration_s:g}", "--warmup", f"{warmup_s:g}", "--method", method]
    cmd += ["--params", json.dumps(params or {}), *(["--expect", expect] if expect is not None else []), "--"]
    proc = subprocess.run([*cmd, *command], capture_output=True, text=True, check=False, timeout=duration_s + 60)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"stdioload failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    d = json.loads(line[len("BENCHJSON ") :])
    calls, seconds, errors = int(d["calls"]), float(d["duration_s"]), int(d["errors"])
    return LoadResult(
        concurrency=concurrency,
        duration_s=round(seconds, 3),
        calls=calls,
        calls_per_s=round(calls / seconds, 1) if seconds else 0.0,
        p50_ms=d["p50"],
        p90_ms=d["p90"],
        p99_ms=d["p99"],
        max_ms=d["max"],
        mean_ms=round(d["mean"], 3),
        errors=errors,
        error_detail={"bad_answer": errors} if errors else {},
        generator_cpu_s=round(d["driver_cpu_s"], 3),
        generator_cpu_us_per_call=round(d["driver_cpu_s"] * 1e6 / calls, 2) if calls else 0.0,
        cpu_ms_per_call={"upstream": round(d["upstream_cpu_s"] * 1000 / calls, 4)} if calls else {},
    )


def _read_all(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    """Read stdout and stderr to their ends without reaping the process (its rusage is wanted)."""
    assert proc.stdout is not None and proc.stderr is not None
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    t = threading.Thread(target=drain, args=("err", proc.stderr), daemon=True)
    t.start()
    chunks["out"] = proc.stdout.read()
    t.join()
    return chunks["out"].decode(errors="replace"), chunks.get("err", b"").decode(errors="replace")


def wait_quiet(seconds: float) -> None:
    """Sleep a moment between runs (lets sockets close and the previous run's work finish)."""
    time.sleep(seconds)
