"""`python -m bench.replicas`: throughput through HAProxy with one and three replicas sharing Redis, and what the
shared store adds to a call.

Four targets in one run, each behind its own HAProxy (round robin, no affinity) and each serving the same stdio
echo fixture with the default settings: one gateway without a store, one with `store: redis://...`, and three
with it. wrk sends `tools/call` at a fixed concurrency, 2026-era (sessionless) and 2025-era (sessions opened
through the proxy, so each replica serves requests of sessions others opened), in alternating rounds; each row is
the median over rounds. A 2-core machine cannot show three replicas scaling (they share the cores with wrk,
HAProxy and Redis); the rows say what each costs in calls per second and gateway CPU per call.

    python -m bench.replicas [--seconds 8] [--rounds 2] [--concurrency 16]

The figures land on stdout as a Markdown table (and in bench/results/replicas.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench.loadgen import Workload, ensure_wrk, run_load
from bench.mcphttp import LEGACY, MODERN, Connection, Endpoint, call_tool, open_session
from bench.procs import BENCH_DIR, PYTHON, REPO, FixtureSpec, free_port

ERAS = {"2026-07-28 (sessionless)": MODERN, "2025-11-25 (sessions)": LEGACY}


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up") from None
            time.sleep(0.1)


@contextmanager
def _process(args: list[str], port: int, what: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_port(port, proc, what)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _gateway(stack: ExitStack, workdir: Path, store: str | None) -> tuple[int, int]:
    """A gateway (pid, port) serving the echo fixture, with `store` when given."""
    config: dict[str, Any] = {"servers": {"echo": FixtureSpec().stdio_server()}}
    if store is not None:
        config["store"] = store
    port = free_port()
    path = workdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [PYTHON, "-m", "gateway", "serve", "--config", str(path), "--port", str(port), "--log-format", "json"]
    proc = stack.enter_context(_process(args, port, "a gateway", workdir / f"gateway-{port}.log"))
    return proc.pid, port


def shipped_haproxy(port: int, servers: list[str]) -> str:
    """The HAProxy config the project ships (`deploy/replicas/haproxy.cfg`), listening on loopback `port` in front
    of `servers` (`server` lines) instead of the compose service's replicas."""
    shipped = (REPO / "deploy" / "replicas" / "haproxy.cfg").read_text()
    resolvers = shipped[shipped.index("resolvers ") : shipped.index("defaults\n")]
    template = next(line for line in shipped.splitlines() if line.strip().startswith("server-template "))
    assert "  bind :8080\n" in shipped
    return (
        shipped.replace(resolvers, "")
        .replace("  bind :8080\n", f"  bind 127.0.0.1:{port}\n")
        .replace(template, "\n".join(servers))
    )


def _haproxy(stack: ExitStack, workdir: Path, ports: list[int]) -> str:
    """HAProxy as shipped in front of `ports` (round robin, no affinity); its URL."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise RuntimeError("haproxy is not installed: run `make system-deps` (the Debian package haproxy)")
    port = free_port()
    config = workdir / f"haproxy-{port}.cfg"
    config.write_text(shipped_haproxy(port, [f"  server g{i} 127.0.0.1:{p}" for i, p in enumerate(ports)]))
    stack.enter_context(_process([haproxy, "-f", str(config)], port, "haproxy", workdir / f"haproxy-{port}.log"))
    return f"http://127.0.0.1:{port}/mcp"


def _ready(url: str) -> None:
    conn = Connection(Endpoint.parse(url))
    session = open_session(conn, MODERN)
    deadline = time.monotonic() + 60
    for _ in range(20):  # every replica behind the proxy answers (round robin)
        while True:
            try:
                call_tool(conn, session, "echo__echo", {"text": "hello"})
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    conn.close()


def _workload(url: str, era: str, concurrency: int) -> Workload:
    endpoint = Endpoint.parse(url)
    conn = Connection(endpoint)
    sessions = [open_session(conn, era) for _ in range(concurrency if era == LEGACY else 1)]
    conn.close()
    return Workload(endpoint, sessions, "tools/call", {"name": "echo__echo", "arguments": {"text": "hello"}})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8, help="seconds per measurement")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    p.add_argument("--concurrency", type=int, default=16, help="wrk connections")
    args = p.parse_args()
    wrk = ensure_wrk()
    redis = shutil.which("redis-server")
    if redis is None:
        raise RuntimeError("redis-server is not installed: run `make system-deps` (the Debian package redis-server)")
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        redis_port = free_port()
        redis_args = [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        stack.enter_context(_process(redis_args, redis_port, "redis-server", workdir / "redis.log"))
        store = f"redis://127.0.0.1:{redis_port}/0"
        bare = _gateway(stack, workdir, None)
        shared = [_gateway(stack, workdir, store) for _ in range(3)]
        targets = {
            "1 replica, no store": ([bare[0]], _haproxy(stack, workdir, [bare[1]])),
            "1 replica, Redis": ([shared[0][0]], _haproxy(stack, workdir, [shared[0][1]])),
            "3 replicas, Redis": ([pid for pid, _ in shared], _haproxy(stack, workdir, [port for _, port in shared])),
        }
        for _, url in targets.values():
            _ready(url)
        loads = {
            (target, era_name): _workload(url, era, args.concurrency)
            for target, (_, url) in targets.items()
            for era_name, era in ERAS.items()
        }
        for _ in range(args.rounds):
            for (target, era_name), workload in loads.items():
                pids = targets[target][0]
                watch = {f"gateway{i}": pid for i, pid in enumerate(pids)}
                result = run_load(wrk, workload, args.concurrency, args.seconds, watch=watch)
                if result.errors:
                    raise RuntimeError(f"{target}, {era_name}: {result.errors} errors: {result.error_detail}")
                cpu = sum(result.cpu_ms_per_call.values())
                runs.setdefault((target, era_name), []).append(
                    {"calls_per_s": result.calls_per_s, "p50_ms": result.p50_ms, "cpu_ms": cpu}
                )
    rows: list[dict[str, Any]] = []
    head = f"target ({args.concurrency} connections through HAProxy)"
    print(f"| {head} | era | calls/s | p50 (ms) | gateway CPU/call (µs) |")
    print("|---|---|---|---|---|")
    for (target, era_name), measured in runs.items():
        row = {key: statistics.median(m[key] for m in measured) for key in ("calls_per_s", "p50_ms", "cpu_ms")}
        rows.append({"target": target, "era": era_name, **row})
        print(
            f"| {target} | {era_name} | {row['calls_per_s']:.0f} | {row['p50_ms']:.2f} | {row['cpu_ms'] * 1000:.0f} |"
        )
    by = {(r["target"], r["era"]): r for r in rows}
    for era_name in ERAS:
        bare_row, redis_row = by[("1 replica, no store", era_name)], by[("1 replica, Redis", era_name)]
        added = (redis_row["cpu_ms"] - bare_row["cpu_ms"]) * 1000
        print(f"\nThe shared store adds {added:.0f} µs of gateway CPU per call, {era_name}.", end="")
    print(f"\n\n{args.rounds} rounds of {args.seconds:g} s per target and era; {os.cpu_count()} cores.")
    out = BENCH_DIR / "results" / "replicas.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": args.seconds, "rounds": args.rounds, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
