"""The sandbox's cost: the same stdio fixture started and called with and without its bubblewrap sandbox.

Both are driven directly over their pipes (no gateway in between, so only the sandbox differs), in alternating
rounds: the start until the full tool listing arrived (bench.run.direct_stdio_start), and echo at concurrency 1
and 16 (bench/stdioload.py). The sandbox is the gateway's default policy (`gateway/upstream/sandbox.py`), the
command line exactly as the gateway builds it (with its pids cgroup wrapper when the bench runs as root).
"""

from __future__ import annotations

import os
import shutil
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from bench.loadgen import run_stdio_load
from bench.mcphttp import MODERN
from bench.procs import FixtureSpec
from gateway.config.servers import SandboxSpec
from gateway.upstream.sandbox import Sandbox

if TYPE_CHECKING:
    from bench.run import Bench

ECHO = {"name": "echo", "arguments": {"text": "sandboxed?"}}


@dataclass(frozen=True)
class BoxedSpec(FixtureSpec):
    """The fixture's stdio command, run inside `argv` (a sandbox's command line ending with it)."""

    argv: tuple[str, ...] = ()

    def stdio_command(self) -> list[str]:
        return list(self.argv)


class Boxes:
    """Sandboxes made for the bench's commands; `close` removes the cgroups they made (as the gateway does when
    its server exits)."""

    def __init__(self, bwrap: str) -> None:
        self.bwrap = bwrap
        self.made: list[Sandbox] = []

    def command(self, plain: list[str]) -> list[str]:
        box = Sandbox("bench", SandboxSpec(), self.bwrap)
        self.made.append(box)
        argv, _, _ = box.wrap(plain, dict(os.environ), None, {})
        return argv

    def close(self) -> None:
        for box in self.made:
            anyio.run(box.exited, 0)
        self.made.clear()


def sandbox_phase(bench: Bench) -> None:
    """Start time and per-call latency of a sandboxed stdio server over the same server unsandboxed."""
    from bench.run import NA, Row, X, direct_stdio_start

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        bench.log("sandbox: skipped (bubblewrap is not installed)")
        bench.rows.append(Row("sandboxed stdio server", NA, NA, NA, "(info)", None, {"skipped": "no bwrap"}))
        return
    p = bench.plan
    spec = FixtureSpec(tools=p.dummy_tools)
    plain = spec.stdio_command()
    boxes = Boxes(bwrap)
    rounds = 3 if p.name == "quick" else 9
    bench.log(f"sandbox: start until listed, {rounds} alternating rounds; echo c=1 and c=16, {p.rounds} rounds")
    try:
        bare_s: list[float] = []
        boxed_s: list[float] = []
        for _ in range(rounds):
            bare_s += direct_stdio_start([spec])
            boxed_s += direct_stdio_start([BoxedSpec(tools=spec.tools, argv=tuple(boxes.command(plain)))])
            boxes.close()
        bare, boxed = statistics.median(bare_s), statistics.median(boxed_s)
        bench.rows.append(
            Row(
                "stdio server start until its tools are listed: unsandboxed (direct) vs sandboxed (gateway column)",
                f"{bare * 1000:.0f} ms",
                f"{boxed * 1000:.0f} ms",
                f"+{(boxed - bare) * 1000:.0f} ms",
                "≤ +100 ms",
                boxed - bare <= 0.1,
                {"direct_value": bare, "gateway_value": boxed, "unit": "s", "direct_rounds": bare_s, "rounds": boxed_s},
            )
        )
        for concurrency in (1, 16):
            bare_p50: list[float] = []
            boxed_p50: list[float] = []
            for _ in range(p.rounds):
                for into, command in ((bare_p50, plain), (boxed_p50, boxes.command(plain))):
                    result = run_stdio_load(
                        command, MODERN, "tools/call", ECHO, concurrency, p.duration, expect="sandboxed?"
                    )
                    bench.errors["direct"] += result.errors
                    into.append(result.p50_ms)
                boxes.close()
            a, b = statistics.median(bare_p50), statistics.median(boxed_p50)
            bench.rows.append(
                Row(
                    f"echo c={concurrency} p50 over the pipes: unsandboxed (direct) vs sandboxed (gateway column)",
                    f"{a:.3f} ms",
                    f"{b:.3f} ms",
                    f"{b / a:.2f}{X}",
                    f"≤ 1.1{X}",
                    b / a <= 1.1,
                    {"direct_value": a, "gateway_value": b, "ratio_value": b / a, "unit": "ms"},
                )
            )
    finally:
        boxes.close()
