"""The load generator for a stdio server called directly: a fixture over its pipes, at a fixed concurrency.

wrk speaks HTTP only, so the stdio rows' direct baseline is this driver: it starts the server, opens it in
the era asked for (2025-11-25: `initialize`; 2026-07-28: `server/discover`, then every request carries the
`_meta` envelope, as mcphttp.Session builds it), warms up, then keeps `--concurrency` requests in flight for
`--duration` seconds, one JSON line per request, as the gateway's own stdio channel does. Every answer is
checked (a result, not an error, and the echoed text when `--expect` is given). It prints one `BENCHJSON`
line: calls, latency percentiles, errors, its own CPU and the server's CPU over the measured window.

Run: ``python bench/stdioload.py --era E --concurrency C --duration S --params JSON [--expect TEXT] -- CMD...``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.mcphttp import CLIENT_INFO, LEGACY, META_CAPABILITIES, META_CLIENT_INFO, META_VERSION

Json = dict[str, Any]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process from /proc (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Driver:
    """One server process and the requests in flight to it."""

    def __init__(self, proc: asyncio.subprocess.Process, era: str) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc, self.era = proc, era
        self.writer, self.reader = proc.stdin, proc.stdout
        self.pending: dict[int, asyncio.Future[Json]] = {}
        self.next_id = 1
        self.meta: Json = {}

    async def read_loop(self) -> None:
        while line := await self.reader.readline():
            message = orjson.loads(line)
            request_id = message.get("id") if isinstance(message, dict) else None
            future = self.pending.pop(request_id, None) if isinstance(request_id, int) else None
            if future is not None and not future.done():
                future.set_result(message)
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the server closed its stdout"))

    async def request(self, method: str, params: Json | None) -> Json:
        request_id = self.next_id
        self.next_id += 1
        body: Json = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None or self.meta:
            body["params"] = {**(params or {}), **({"_meta": self.meta} if self.meta else {})}
        future: asyncio.Future[Json] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self.writer.write(orjson.dumps(body) + b"\n")
        return await future

    async def open(self) -> None:
        if self.era == LEGACY:
            params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": CLIENT_INFO}
            reply = await self.request("initialize", params)
            if "result" not in reply:
                raise RuntimeError(f"initialize failed: {reply}")
            self.writer.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            return
        self.meta = {META_VERSION: self.era, META_CLIENT_INFO: CLIENT_INFO, META_CAPABILITIES: {}}
        reply = await self.request("server/discover", None)
        if self.era not in reply.get("result", {}).get("supportedVersions", []):
            raise RuntimeError(f"server/discover: {self.era} not supported: {reply}")


def good(reply: Json, expect: str | None) -> bool:
    result = reply.get("result")
    if not isinstance(result, dict) or result.get("isError"):
        return False
    if expect is None:
        return True
    content = result.get("content") or [{}]
    return isinstance(content[0], dict) and content[0].get("text") == expect


async def run(args: argparse.Namespace) -> Json:
    proc = await asyncio.create_subprocess_exec(
        *args.command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        limit=64 * 1024 * 1024,
    )
    driver = Driver(proc, args.era)
    reading = asyncio.get_running_loop().create_task(driver.read_loop())
    params = json.loads(args.params)
    latencies: list[float] = []
    errors = 0
    measuring = False
    stop_at = 0.0

    async def worker() -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            reply = await driver.request(args.method, params)
            if measuring:
                latencies.append(time.perf_counter() - started)
                errors += not good(reply, args.expect)

    try:
        await asyncio.wait_for(driver.open(), 30)
        stop_at = time.monotonic() + args.warmup
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        measuring = True
        cpu0, up0, t0 = own_cpu(), cpu_seconds(proc.pid), time.perf_counter()
        stop_at = time.monotonic() + args.duration
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        seconds = time.perf_counter() - t0
        cpu, up = own_cpu() - cpu0, cpu_seconds(proc.pid) - up0
    finally:
        reading.cancel()
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
    ms = sorted(x * 1000 for x in latencies) or [0.0]
    return {
        "calls": len(latencies),
        "duration_s": seconds,
        "p50": statistics.median(ms),
        "p90": ms[min(len(ms) - 1, int(len(ms) * 0.9))],
        "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "max": ms[-1],
        "mean": statistics.fmean(ms),
        "errors": errors,
        "driver_cpu_s": cpu,
        "upstream_cpu_s": up,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--era", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--method", default="tools/call")
    parser.add_argument("--params", required=True, help="the request's params, as JSON")
    parser.add_argument("--expect", help="the text every answer must echo")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        import uvloop

        result = uvloop.run(run(args))
    except ImportError:  # pragma: no cover - the bench venv has uvloop
        result = asyncio.run(run(args))
    print("BENCHJSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
