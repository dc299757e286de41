"""`python -m bench.tracing`: what tracing costs a call. Three gateways in front of the same stdio echo fixture:
tracing off, on with every trace sampled (`always_on`), and on with 1 % sampled (`traceidratio` 0.01), exporting to
a real OTLP/HTTP receiver in this process (tests/fixtures/otlp_receiver.py). Sequential 2026-era `tools/call`s
(the shortcut), in alternating rounds; each row is the median over rounds of the gateway's CPU per call (user +
system, its threads included: the exporter's thread too) and the wall time per call.

    python -m bench.tracing [--calls 2000] [--rounds 5]

The figures land on stdout as a Markdown table (and bench/results/tracing.json). `make bench` runs it after
bench/run.py's phases (which start every gateway with the default environment, tracing off).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.mcphttp import MODERN, Connection, Endpoint, call_tool, open_session
from bench.procs import BENCH_DIR, PYTHON, REPO, FixtureSpec, cpu_seconds, free_port
from tests.fixtures.otlp_receiver import OtlpReceiver

MODES: dict[str, dict[str, str]] = {
    "off": {},
    "on, 100 % sampled": {"OTEL_TRACES_SAMPLER": "always_on"},
    "on, 1 % sampled": {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
}


def _start(
    mode: str, env: dict[str, str], receiver: OtlpReceiver, workdir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    config = workdir / f"gateway-{len(os.listdir(workdir))}.yaml"
    config.write_text(yaml.safe_dump({"sandbox": "off", "servers": {"echo": FixtureSpec().stdio_server()}}))
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if env or mode != "off":
        full.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **env})
    log = (workdir / f"{config.stem}.log").open("wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "gateway", "serve", "--config", str(config), "--port", str(port), "--log-format", "json"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway ({mode}) did not come up; see {log.name}") from None
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}/mcp"


def _round(url: str, pid: int, calls: int) -> tuple[float, float]:
    """CPU seconds of the gateway and wall seconds, per call, over `calls` sequential calls."""
    conn = Connection(Endpoint.parse(url))
    session = open_session(conn, MODERN)
    for _ in range(50):  # warm the connection and the lanes
        call_tool(conn, session, "echo__echo", {"text": "hello"})
    cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(calls):
        call_tool(conn, session, "echo__echo", {"text": "hello"})
    wall, cpu1 = time.perf_counter() - wall0, cpu_seconds(pid)
    conn.close()
    assert cpu0 is not None and cpu1 is not None
    return (cpu1 - cpu0) / calls, wall / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per round and mode")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    args = p.parse_args()
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    with OtlpReceiver() as receiver, tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        gateways = {mode: _start(mode, env, receiver, Path(tmp)) for mode, env in MODES.items()}
        try:
            for url_pid in gateways.values():  # every gateway has its server up before the first round
                conn = Connection(Endpoint.parse(url_pid[1]))
                session = open_session(conn, MODERN)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        call_tool(conn, session, "echo__echo", {"text": "hello"})
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                conn.close()
            for _ in range(args.rounds):
                for mode, (proc, url) in gateways.items():
                    results[mode].append(_round(url, proc.pid, args.calls))
            time.sleep(6)  # the exporters' last batches
        finally:
            for proc, _ in gateways.values():
                proc.terminate()
            for proc, _ in gateways.values():
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        spans = len(receiver.snapshot())
    off_cpu = statistics.median(c for c, _ in results["off"])
    rows: list[dict[str, Any]] = []
    print("| tracing | gateway CPU per call (µs) | vs off | wall per call (µs) |")
    print("|---|---|---|---|")
    for mode, runs in results.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        rows.append({"mode": mode, "cpu_us": cpu * 1e6, "wall_us": wall * 1e6, "vs_off": cpu / off_cpu})
        print(f"| {mode} | {cpu * 1e6:.0f} | {cpu / off_cpu:.2f}x | {wall * 1e6:.0f} |")
    print(f"\n{args.rounds} rounds of {args.calls} calls per mode; {spans} spans received.")
    out = BENCH_DIR / "results" / "tracing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"calls": args.calls, "rounds": args.rounds, "spans": spans, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
