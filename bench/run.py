"""Run the whole benchmark: every figure as a ratio to calling the same fixture directly, in alternating rounds.

`python -m bench` (full run, about 15-16 minutes on 2 cores, more with both fixture modes), `python -m bench
--quick` (smoke run, a few minutes; its figures are not worth comparing), `python -m bench --profile` (py-spy on
the gateway during the echo c=16 scenarios). Results go to bench/results/latest.json and latest.md.

The gateway runs with its default configuration (no per-server limits set). The calls phase runs over the lean
low-level fixture and over the same tools written on the SDK's `MCPServer` (fixture.py --kind), each compared
with that fixture called directly; with `--fixture-mode stateless` (or `both`, the default) it also runs over
the low-level fixture in the SDK's stateless mode (`stateless_http=True, json_response=True`, no
`Mcp-Session-Id`; the same server over stdio), whose 2025-era clients do `initialize` and go on without a
session. Beside the gateway, the peer column measures FastMCP's proxy (bench/peer.py, peer_fastmcp.py) in front
of the same fixtures in the same rounds; `--no-peer` leaves it out. `--upstream-protocol V` sets `protocol: V` on
every server of the calls phase's gateway (an A/B of what the gateway speaks upstream; not the default config).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.loadgen import LoadResult, Workload, ensure_wrk, run_load, run_stdio_load, wrk_version
from bench.mcphttp import (
    ACCEPT,
    CLIENT_INFO,
    ERAS,
    LEGACY,
    META_CAPABILITIES,
    META_CLIENT_INFO,
    META_VERSION,
    MODERN,
    Connection,
    Endpoint,
    McpError,
    Session,
    call_tool,
    close_session,
    list_tool_names,
    open_session,
)
from bench.peer import PEER_NAME, Peer, ensure_peer_venv, peer_version, start_peer
from bench.procs import (
    BENCH_DIR,
    PYTHON,
    REPO,
    FixtureSpec,
    Gateway,
    HttpFixture,
    Proc,
    cpu_seconds,
    machine_info,
    native_modules,
    package_versions,
    rss_kib,
    start_gateway,
    start_http_fixture,
    wait_port,
)
from bench.sandbox import sandbox_phase
from bench.search import markdown as search_markdown
from bench.search import search_phase

RESULTS = BENCH_DIR / "results"
# A small stdlib-only stdio server: the conversations row measures the gateway, not Python's start-up.
SCRIPTED = REPO / "tests" / "fixtures" / "scripted_upstream.py"
ECHO_TEXT = "hello"
MIB = 1024 * 1024
X = "\N{MULTIPLICATION SIGN}"
NA = "\N{EN DASH}"  # not applicable
KINDS = ("lowlevel", "mcpserver")  # fixture.py --kind: the lean low-level Server, the high-level MCPServer
FIXTURE_MODES = ("stateful", "stateless")  # the HTTP fixtures' session mode (fixture.py --stateless)
# Targets, the same for every kind of upstream.
ECHO_C1_ADDED_MS = 0.3
ECHO_HTTP_C16 = 0.9
ECHO_STDIO_C16 = 0.9
SLOW_C64 = 0.95
BIG_C4 = 0.8
LIST_RATIO = 1.2


@dataclass(frozen=True)
class Plan:
    """How long and how often to measure."""

    name: str
    duration: float  # seconds per measured run
    warmup: float  # seconds of one unmeasured run per target before the rounds
    rounds: int  # alternating rounds per scenario
    list_duration: float
    startup_rounds: int
    sessions: int
    dummy_tools: int  # N dummy tools of each call fixture
    upstreams: int = 20
    tools_per_upstream: int = 50
    big_list_tools_per_upstream: int = 500  # the 10,000-tool listing: `upstreams` fixtures of this many tools


# Three rounds (four before the MCPServer and peer targets came in) keep a full run near 15-16 minutes.
FULL = Plan("full", duration=2, warmup=1, rounds=3, list_duration=2, startup_rounds=3, sessions=1000, dummy_tools=10)
QUICK = Plan("quick", duration=1, warmup=1, rounds=1, list_duration=1, startup_rounds=1, sessions=1000, dummy_tools=10)


@dataclass
class Target:
    """One thing to load: the direct fixture or the gateway, and the tool (or listing) to drive."""

    key: str  # "direct", "gateway ..." or "peer ..."
    endpoint: Endpoint
    method: str
    params: dict[str, Any] | None
    watch: dict[str, int]
    expect: str = '"result":'
    check: Callable[[dict[str, Any]], None] | None = None
    check_body: bool = True  # False: measured runs skip wrk's per-answer body checks (see mcp.lua)
    workload: Workload | None = None
    checked_workload: Workload | None = None  # every answer's body checked: the warm-up's
    sessions: list[Session] = field(default_factory=list)
    stdio: list[str] | None = None  # a stdio server called directly: its command, driven by stdioload.py
    expect_text: str | None = None  # the text every stdio answer must echo
    era: str = ""
    stateless: bool = False  # the endpoint issues no Mcp-Session-Id (a stateless fixture called directly)

    @property
    def is_direct(self) -> bool:
        return self.key == "direct"

    @property
    def role(self) -> str:
        """ "direct", "gateway" or "peer": whose error count a run adds to."""
        return self.key.split(" ", 1)[0]

    @property
    def optional(self) -> bool:
        """A peer target may fail without failing the run: it is dropped from the scenario with a reason."""
        return self.role == "peer"


@dataclass
class Row:
    """One line of the results table."""

    scenario: str
    direct: str
    gateway: str
    ratio: str
    target: str
    met: bool | None  # None: informational
    data: dict[str, Any] = field(default_factory=dict)
    peer: str = NA  # the peer's figure in the ratio column's terms, or NA with the reason

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "direct": self.direct,
            "gateway": self.gateway,
            "ratio": self.ratio,
            "peer": self.peer,
            "target": self.target,
            "met": self.met,
            **self.data,
        }


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def _cell_text(text: str, limit: int = 90) -> str:
    """Text fit for one markdown table cell: one line, no pipes, at most `limit` characters."""
    flat = " ".join(text.replace("|", "/").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"


def check_echo(expected_len: int | None = None) -> Callable[[dict[str, Any]], None]:
    """A check of a tools/call result: no error, one text part (of a given length, or the echoed text)."""

    def check(result: dict[str, Any]) -> None:
        if result.get("isError"):
            raise McpError(f"isError result: {str(result)[:300]}")
        text = result["content"][0]["text"]
        if expected_len is not None and len(text) != expected_len:
            raise McpError(f"result text has {len(text)} characters, not {expected_len}")
        if expected_len is None and text != ECHO_TEXT:
            raise McpError(f"echo answered {text[:100]!r}")

    return check


def check_listing(expected: int) -> Callable[[dict[str, Any]], None]:
    def check(result: dict[str, Any]) -> None:
        n = len(result.get("tools", []))
        if n != expected or result.get("nextCursor"):
            raise McpError(f"tools/list gave {n} tools (cursor {result.get('nextCursor')!r}), expected {expected}")

    return check


def _added_rss_row(
    label: str, with_kib: float, idle_kib: float, target: str, limit_mib: float | None, extra: dict[str, Any]
) -> Row:
    """A row for the gateway's RSS over its idle figure (met when within `limit_mib`; None: for information)."""
    added = (with_kib - idle_kib) / 1024
    return Row(
        label,
        NA,
        f"{with_kib / 1024:.1f} MiB",
        f"+{added:.1f} MiB",
        target,
        added <= limit_mib if limit_mib is not None else None,
        {"gateway_value": with_kib / 1024, "added_mib": added, "unit": "MiB", **extra},
    )


class Bench:
    """Owns every process it starts and every figure it measures."""

    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        log: Callable[[str], None] = print,
        peer: bool = True,
        fixture_modes: tuple[str, ...] = FIXTURE_MODES,
        upstream_protocol: str | None = None,
        gateway_tree: Path = REPO,
    ) -> None:
        self.plan = plan
        self.gateway_tree = gateway_tree  # whose `gateway` package runs (--gateway-tree)
        self.fixture_modes = fixture_modes
        self.upstream_protocol = upstream_protocol  # `protocol:` on every calls-phase server (None: the default)
        self.out_dir = out_dir
        self.log = log
        self.wrk = ensure_wrk()
        self.workdir = Path(tempfile.mkdtemp(prefix="manifold-bench-"))
        self.procs: list[Proc] = []
        self.runs: list[dict[str, Any]] = []
        self.rows: list[Row] = []
        self.extra: dict[str, Any] = {}
        self.errors = {"direct": 0, "gateway": 0, "peer": 0}
        self.peer_wanted = peer
        self.peer_python: Path | None = None
        self.peer_reason = "" if peer else "left out (--no-peer)"
        self.peer_ready = False  # ensure_peer() has run
        self.dropped: dict[str, str] = {}  # optional targets the last alternate() dropped, and why
        self.calls = 0
        self.generator_cpu_s = 0.0
        self.t0 = time.monotonic()
        self.versions_at_start = self.versions()

    def versions(self) -> dict[str, str]:
        return {
            "wrk": wrk_version(self.wrk),
            **package_versions(["mcp", "mcp-types", "uvicorn", "starlette", "anyio", "uvloop", "httptools", "orjson"]),
        }

    # --- processes -------------------------------------------------------------------------------

    def ensure_peer(self) -> Path | None:
        """The peer venv's Python (made on first use), or None with self.peer_reason set."""
        if self.peer_wanted and not self.peer_ready:
            self.peer_ready = True
            self.peer_python, reason = ensure_peer_venv(self.log)
            if self.peer_python is None:
                self.peer_reason = f"not installed: {reason}"
                self.log(f"peer: {self.peer_reason}")
            else:
                self.extra["peer"] = {"name": PEER_NAME, "fastmcp_and_mcp": peer_version(self.peer_python)}
        return self.peer_python

    def peer(self, name: str, upstream: str | list[str]) -> Peer | str:
        """A running peer in front of an upstream URL or stdio command, or the reason there is none."""
        python = self.ensure_peer()
        if python is None:
            return self.peer_reason
        try:
            p = start_peer(python, name, upstream, self.workdir)
        except (RuntimeError, TimeoutError, OSError) as exc:
            reason = f"did not start: {str(exc).splitlines()[0][:200]}"
            self.log(f"peer {name}: {reason}")
            self.extra.setdefault("peer_failures", []).append({"peer": name, "reason": str(exc)[:2000]})
            return reason
        self.procs.append(p.proc)
        return p

    def fixture(self, name: str, spec: FixtureSpec) -> HttpFixture:
        fx = start_http_fixture(name, spec, self.workdir)
        self.procs.append(fx.proc)
        # the fixture is ready once it answers a handshake
        deadline = time.monotonic() + 20
        while True:
            try:
                open_session(Connection(Endpoint.parse(fx.url), timeout=5), MODERN)
                return fx
            except (OSError, McpError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def gateway(self, servers: dict[str, dict[str, Any]], tag: str) -> Gateway:
        gw = start_gateway(servers, self.workdir, tag, self.gateway_tree)
        self.procs.append(gw.proc)
        return gw

    def stop(self, proc: Proc, grace: float = 2.0) -> None:
        proc.stop(grace)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc, grace=1.0)

    def wait_tools(self, gw: Gateway, expected: set[str], timeout: float = 60.0) -> float:
        """Wait until tools/list has every expected tool; return the seconds since the gateway was started.

        Polling tools/list itself would cost the gateway CPU while it starts (a 1000-tool listing takes it
        tens of ms), so this polls the cheap /readyz until every server is up with its tools, and only
        then confirms with tools/list (falling back to polling tools/list every 0.1 s if /readyz says
        nothing usable).
        """
        deadline = time.monotonic() + timeout
        wait_port(gw.proc, gw.port, timeout)
        conn = Connection(Endpoint.parse(gw.url), timeout=10)
        session: Session | None = None
        last: set[str] = set()
        while True:
            if not gw.proc.alive():
                raise RuntimeError(f"the gateway exited:\n{gw.proc.log_tail()}")
            if time.monotonic() > deadline:
                missing = sorted(expected - last)
                raise TimeoutError(f"gateway lacks {len(missing)} tools after {timeout} s, e.g. {missing[:5]}")
            servers_up = readyz_all_up(gw.port)
            if servers_up is False:
                time.sleep(0.01)
                continue
            try:
                session = session or open_session(conn, MODERN)
                last = set(list_tool_names(conn, session))
                if expected <= last:
                    elapsed = time.monotonic() - gw.proc.started
                    conn.close()
                    return elapsed
            except (OSError, McpError, http.client.HTTPException):
                pass
            time.sleep(0.01 if servers_up else 0.1)

    # --- load ------------------------------------------------------------------------------------

    def prepare(self, target: Target, era: str, concurrency: int) -> None:
        """Handshake (one 2025-era session per connection; 2026 needs none), check one answer, build the workload.
        A stdio target opens its server itself on every run and checks every answer."""
        target.era = era
        if target.stdio is not None:
            return
        conn = Connection(target.endpoint)
        n = concurrency if era == LEGACY else 1
        target.sessions = [open_session(conn, era, stateless=target.stateless) for _ in range(n)]
        session = target.sessions[0]
        request_id = conn.next_id()
        reply = conn.post(session, session.body(request_id, target.method, target.params))
        if reply.status != 200:
            raise McpError(f"{target.key}: HTTP {reply.status}: {reply.body[:300]!r}")
        result = reply.response(request_id)
        if target.check is not None:
            target.check(result)
        conn.close()
        target.checked_workload = Workload(
            target.endpoint,
            target.sessions,
            target.method,
            target.params,
            expect=target.expect,
            min_bytes=int(len(reply.body) * 0.9),
        )
        target.workload = target.checked_workload
        if not target.check_body:
            # the check answer's id is shorter than the hot loop's 10 digits: never longer by more than 20 bytes
            target.workload = Workload(
                target.endpoint,
                target.sessions,
                target.method,
                target.params,
                expect=target.expect,
                min_bytes=len(reply.body) - 20,
                check_body=False,
            )

    def release(self, target: Target) -> None:
        if target.stdio is not None:
            return
        conn = Connection(target.endpoint)
        for s in target.sessions:
            close_session(conn, s)
        conn.close()
        target.sessions = []

    def load(self, target: Target, concurrency: int, duration: float, checked: bool = False) -> LoadResult:
        if target.stdio is not None:
            result = run_stdio_load(
                target.stdio, target.era, target.method, target.params, concurrency, duration, expect=target.expect_text
            )
        else:
            workload = target.checked_workload if checked else target.workload
            assert workload is not None
            result = run_load(self.wrk, workload, concurrency, duration, watch=target.watch)
            self.calls += result.calls  # wrk's own cost per call, reported under the table
            self.generator_cpu_s += result.generator_cpu_s
        self.errors[target.role] += result.errors
        if result.errors:
            self.log(f"    ! {target.key}: {result.errors} errors {result.error_detail}")
        time.sleep(0.1)  # lets sockets close; settle() waits at least another interval
        waited = settle(target.watch.values())
        if waited > 2:
            self.log(f"    ({target.key} worked {waited:.1f} s on after the run ended)")
        return result

    def alternate(
        self, scenario: str, era: str, targets: list[Target], concurrency: int, duration: float | None = None
    ) -> dict[str, list[LoadResult]]:
        """Warm each target up, then run the targets in turn, round after round; every run is kept."""
        duration = duration or self.plan.duration
        self.dropped = {}
        ready: list[Target] = []
        try:
            for t in targets:
                try:
                    self.prepare(t, era, concurrency)
                except (OSError, McpError, http.client.HTTPException, KeyError, TypeError) as exc:
                    if not t.optional:
                        raise
                    self.dropped[t.key] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    self.log(f"    ! {t.key} left out of {scenario} ({era}): {self.dropped[t.key]}")
                    continue
                ready.append(t)
        except BaseException:
            for t in ready:
                self.release(t)
            raise
        targets = list(ready)
        out: dict[str, list[LoadResult]] = {t.key: [] for t in targets}

        def drop(t: Target, exc: Exception) -> None:
            """An optional target whose load failed (wrk could not run against it) leaves the scenario."""
            if not t.optional:
                raise exc
            self.dropped[t.key] = f"{type(exc).__name__}: {str(exc)[:200]}"
            self.log(f"    ! {t.key} left out of {scenario} ({era}): {self.dropped[t.key]}")
            targets.remove(t)
            out.pop(t.key, None)

        try:
            for t in list(targets):  # the warm-up checks every answer's body, whatever the measured runs do
                try:
                    self.load(t, concurrency, self.plan.warmup, checked=True)
                except RuntimeError as exc:
                    drop(t, exc)
            for r in range(self.plan.rounds):
                for t in list(targets):
                    try:
                        res = self.load(t, concurrency, duration)
                    except RuntimeError as exc:
                        drop(t, exc)
                        continue
                    out[t.key].append(res)
                    self.runs.append({"scenario": scenario, "era": era, "target": t.key, "round": r, **res.to_json()})
                    self.log(
                        f"  {scenario:<26} {era} {t.key:<15} round {r + 1}: {res.calls_per_s:8.1f} calls/s  "
                        f"p50 {res.p50_ms:7.2f} ms  p99 {res.p99_ms:7.2f} ms  errors {res.errors}"
                    )
            return out
        finally:
            for t in ready:
                try:
                    self.release(t)
                except (OSError, http.client.HTTPException):
                    if not t.optional:
                        raise

    # --- scenarios -------------------------------------------------------------------------------

    def calls_phase(self) -> None:
        """For each kind of fixture: echo at c=1 and c=16 via HTTP and stdio upstreams, the 50 ms tool at c=64,
        the 1 MiB result at c=4, in both eras; the gateway and the peer each compared with the fixture called
        directly in the same rounds. In the stateless fixture mode, the low-level fixture in the SDK's stateless
        HTTP mode."""
        if "stateful" in self.fixture_modes:
            for kind in KINDS:
                self.calls_for(kind)
        if "stateless" in self.fixture_modes:
            self.calls_for("lowlevel", stateless=True)

    def calls_for(self, kind: str, stateless: bool = False) -> None:
        n = self.plan.dummy_tools
        specs = {
            "h": FixtureSpec(tools=n, kind=kind, stateless=stateless),
            "slow": FixtureSpec(tools=n, sleep_ms=50, kind=kind, stateless=stateless),
            "big": FixtureSpec(tools=n, result_bytes=MIB, kind=kind, stateless=stateless),
        }
        lean = kind == "lowlevel" and not stateless  # the stateful low-level fixture: the first table's rows
        tag = "-stateless" if stateless else "" if lean else "-mcpserver"
        self.log(f"calls ({kind}{' stateless' if stateless else ''} fixtures): starting fixtures, gateway and peers")
        fx = {name: self.fixture(f"{'echo' if name == 'h' else name}{tag}", spec) for name, spec in specs.items()}
        servers: dict[str, dict[str, Any]] = {
            "h": {"url": fx["h"].url},
            "s": specs["h"].stdio_server(),
            "slow": {"url": fx["slow"].url},
            "big": {"url": fx["big"].url},
            # the same fixture, spoken to in the handshake era: the `protocol` option, for servers of large results
            "big25": {"url": fx["big"].url, "protocol": LEGACY},
        }
        if self.upstream_protocol is not None:
            for name in ("h", "s", "slow", "big"):
                servers[name]["protocol"] = self.upstream_protocol
        gw = self.gateway(servers, f"calls{tag}")
        self.wait_tools(gw, {"h__echo", "s__echo", "slow__echo", "big__echo", "big25__echo"})
        upstreams: dict[str, str | list[str]] = {
            "h": fx["h"].url,
            "s": specs["h"].stdio_command(),
            "slow": fx["slow"].url,
            "big": fx["big"].url,
        }
        peers = {name: self.peer(f"{name}{tag}", up) for name, up in upstreams.items()} if self.peer_wanted else {}
        time.sleep(1.0)
        native = self.extra.setdefault("native_modules", {})
        native["gateway"] = native_modules(gw.pid)
        native[f"fixture ({kind})"] = native_modules(fx["h"].proc.pid)
        for p in peers.values():
            if isinstance(p, Peer):
                native["peer"] = native_modules(p.pid)
        stdio_pid = _child_pid(gw.pid)
        if lean:
            self.extra["rss_calls_gateway_idle_kib"] = rss_kib(gw.pid)
        gw_ep = Endpoint.parse(gw.url)

        def large(server: str) -> bool:
            """Whether the server is the 1 MiB fixture (under either name): wrk checks none of its bodies in the
            measured runs (the warm-up checks every one)."""
            return server in ("big", "big25")

        def direct(name: str, check: Callable[[dict[str, Any]], None]) -> Target:
            ep = Endpoint.parse(fx[name].url)
            params = {"name": "echo", "arguments": {"text": ECHO_TEXT}}
            watch = {"upstream": fx[name].proc.pid}
            return Target(
                "direct", ep, "tools/call", params, watch, check=check, check_body=not large(name), stateless=stateless
            )

        def direct_stdio() -> Target:
            """The stdio fixture called directly over its pipes: the baseline of the stdio rows."""
            params = {"name": "echo", "arguments": {"text": ECHO_TEXT}}
            return Target(
                "direct stdio", gw_ep, "tools/call", params, {}, stdio=specs["h"].stdio_command(), expect_text=ECHO_TEXT
            )

        def via(key: str, server: str, upstream_pid: int | None, check: Callable[[dict[str, Any]], None]) -> Target:
            params = {"name": f"{server}__echo", "arguments": {"text": ECHO_TEXT}}
            watch = {"gateway": gw.pid} | ({"upstream": upstream_pid} if upstream_pid else {})
            return Target(key, gw_ep, "tools/call", params, watch, check=check, check_body=not large(server))

        def via_peer(key: str, server: str, check: Callable[[dict[str, Any]], None]) -> list[Target]:
            """The peer's target in front of `server` (it proxies that one upstream: tools keep their names)."""
            p = peers.get(server)
            if not isinstance(p, Peer):
                return []
            params = {"name": "echo", "arguments": {"text": ECHO_TEXT}}
            # the peer's stdio upstream is its child (started on its first request); an HTTP one is the fixture
            upstream_pid = fx[server].proc.pid if server in fx else _child_pid(p.pid)
            watch = {"gateway": p.pid} | ({"upstream": upstream_pid} if upstream_pid else {})
            return [
                Target(
                    key, Endpoint.parse(p.url), "tools/call", params, watch, check=check, check_body=not large(server)
                )
            ]

        def missing(server: str) -> str | None:
            p = peers.get(server, self.peer_reason or "not measured")
            return p if isinstance(p, str) else None

        scenario = "" if lean else "stateless " if stateless else "MCPServer "
        up = "upstream" if lean else "stateless upstream" if stateless else "MCPServer upstream"
        rss_load: list[int] = []
        for era in ERAS:
            for c in (1, 16):
                targets = [
                    direct("h", check_echo()),
                    direct_stdio(),
                    via("gateway http", "h", fx["h"].proc.pid, check_echo()),
                    via("gateway stdio", "s", stdio_pid, check_echo()),
                    *via_peer("peer http", "h", check_echo()),
                    *via_peer("peer stdio", "s", check_echo()),
                ]
                res = self.alternate(f"{scenario}echo c={c}", era, targets, c)
                if c == 16 and lean:
                    rss_load += [
                        r.rss_max_kib.get("gateway", 0) for k in res if k.startswith("gateway") for r in res[k]
                    ]
                self.echo_rows(era, c, res, up, {"HTTP": missing("h"), "stdio": missing("s")}, stateless)
            res = self.alternate(
                f"{scenario}50 ms tool c=64",
                era,
                [
                    direct("slow", check_echo()),
                    via("gateway", "slow", fx["slow"].proc.pid, check_echo()),
                    *via_peer("peer", "slow", check_echo()),
                ],
                64,
            )
            on = "" if lean else f", {up}"
            self.throughput_row(f"50 ms tool{on}, c=64, calls/s ({era})", res, "gateway", SLOW_C64, missing("slow"))
            res = self.alternate(
                f"{scenario}1 MiB result c=4",
                era,
                [
                    direct("big", check_echo(MIB)),
                    via("gateway", "big", fx["big"].proc.pid, check_echo(MIB)),
                    via("gateway 2025 upstream", "big25", fx["big"].proc.pid, check_echo(MIB)),
                    *via_peer("peer", "big", check_echo(MIB)),
                ],
                4,
            )
            self.throughput_row(f"1 MiB result{on}, c=4, calls/s ({era})", res, "gateway", BIG_C4, missing("big"))
            self.throughput_row(
                f"1 MiB result{on}, c=4, upstream spoken to in {LEGACY} (`protocol` option), calls/s ({era})",
                res,
                "gateway 2025 upstream",
                BIG_C4,
                "the same peer as the row above",
                peer_key="-",
            )
        if lean:
            self.extra["rss_calls_gateway_under_load_max_kib"] = max(rss_load, default=0)
        self.stop(gw.proc)
        for p in peers.values():
            if isinstance(p, Peer):
                self.stop(p.proc, grace=1.0)
        for f in fx.values():
            self.stop(f.proc, grace=0)

    def peer_cell(
        self,
        res: dict[str, list[LoadResult]],
        key: str,
        missing: str | None,
        added: bool = False,
        direct_key: str = "direct",
    ) -> tuple[str, dict[str, Any]]:
        """The peer column of a row: its ratio to direct (or, with `added`, its added p50), or why there is none."""
        runs = res.get(key)
        if not runs:
            reason = self.dropped.get(key) or missing or "not measured"
            return f"{NA} ({_cell_text(reason)})", {"peer_missing": reason}
        errors = sum(r.errors for r in runs)
        note = f", {errors} errors" if errors else ""
        if not any(r.calls for r in runs):
            # No answer within a run of D seconds at concurrency c: every answer took over D seconds, so by
            # Little's law the peer's throughput is under c / D.
            window = min(r.duration_s for r in runs)
            text = f"no answer within {window:.0f} s{note}"
            if added:
                return f"{NA} ({text})", {"peer_no_answer": True}
            bound = runs[0].concurrency / window / median(r.calls_per_s for r in res[direct_key])
            return f"< {bound:.2g}{X} ({text})", {"peer_no_answer": True, "peer_ratio_below": bound}
        if added:
            value = median(p.p50_ms - d.p50_ms for d, p in zip(res[direct_key], runs, strict=True))
            p50 = median(r.p50_ms for r in runs)
            return f"+{value:.2f} ms ({p50:.2f} ms{note})", {"peer_added_ms": value, "peer_value": p50}
        ratio = median(
            p.calls_per_s / d.calls_per_s for d, p in zip(res[direct_key], runs, strict=True) if d.calls_per_s
        )
        calls = median(r.calls_per_s for r in runs)
        shown = f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"  # two significant digits for a tiny ratio
        return f"{shown}{X} ({calls:.0f}/s{note})", {"peer_ratio": ratio, "peer_value": calls}

    def echo_rows(
        self,
        era: str,
        c: int,
        res: dict[str, list[LoadResult]],
        up: str,
        missing: dict[str, str | None],
        stateless: bool = False,
    ) -> None:
        for key, label in (("gateway http", "HTTP"), ("gateway stdio", "stdio")):
            peer_key = key.replace("gateway", "peer")
            # the stdio hop is compared with the same stdio server called directly; the HTTP fixture stays in the data
            direct_key = "direct" if label == "HTTP" else "direct stdio"
            if c == 16:
                goal = ECHO_HTTP_C16 if label == "HTTP" else ECHO_STDIO_C16
                scenario = f"echo via {label} {up}, c=16, calls/s ({era})"
                if stateless and label == "stdio":
                    # as the second benchmark judges it: the hop over stdio against the stateless HTTP fixture direct,
                    # the same server called over its pipes beside it
                    scenario = f"echo via {label} upstream, c=16, against the stateless HTTP fixture, calls/s ({era})"
                    self.throughput_row(
                        scenario, res, key, goal, missing[label], peer_key, "direct", ("direct stdio", "over its pipes")
                    )
                    continue
                self.throughput_row(scenario, res, key, goal, missing[label], peer_key, direct_key)
            else:
                d = [r.p50_ms for r in res[direct_key]]
                g = [r.p50_ms for r in res[key]]
                added = median(gv - dv for dv, gv in zip(d, g, strict=True))
                peer, peer_data = self.peer_cell(res, peer_key, missing[label], added=True, direct_key=direct_key)
                if direct_key != "direct":
                    http = [r.p50_ms for r in res["direct"]]
                    peer_data["added_ms_to_http_fixture"] = median(gv - hv for hv, gv in zip(http, g, strict=True))
                    shown = f"+{added:.2f} ms (+{peer_data['added_ms_to_http_fixture']:.2f} ms over the HTTP fixture)"
                else:
                    shown = f"+{added:.2f} ms"
                self.rows.append(
                    Row(
                        f"echo via {label} {up}, c=1, p50 latency ({era})",
                        f"{median(d):.2f} ms",
                        f"{median(g):.2f} ms",
                        shown,
                        f"≤ +{ECHO_C1_ADDED_MS:g} ms",
                        added <= ECHO_C1_ADDED_MS,
                        {
                            "direct_value": median(d),
                            "gateway_value": median(g),
                            "added_ms": added,
                            "unit": "ms",
                            **peer_data,
                        },
                        peer,
                    )
                )

    def throughput_row(
        self,
        scenario: str,
        res: dict[str, list[LoadResult]],
        key: str,
        goal: float,
        peer_missing: str | None = None,
        peer_key: str = "peer",
        direct_key: str = "direct",
        aside: tuple[str, str] | None = None,
    ) -> None:
        """A calls/s row: the median per-round ratio of `key` to `direct_key`; `aside` (a key and its label) adds
        the ratio to another baseline in brackets (by default, the HTTP fixture's when the row's is not)."""
        d = [r.calls_per_s for r in res[direct_key]]
        g = [r.calls_per_s for r in res[key]]
        ratio = median(gv / dv for dv, gv in zip(d, g, strict=True) if dv)
        peer, peer_data = self.peer_cell(res, peer_key, peer_missing, direct_key=direct_key)
        shown = f"{ratio:.2f}{X}"
        if aside is None and direct_key != "direct":
            aside = ("direct", "the HTTP fixture")
        if aside is not None:
            other = [r.calls_per_s for r in res[aside[0]]]
            to_other = median(gv / hv for hv, gv in zip(other, g, strict=True) if hv)
            peer_data["ratio_to_http_fixture" if aside[0] == "direct" else f"ratio_to_{aside[0]}"] = to_other
            shown += f" ({to_other:.2f}{X} of {aside[1] if aside[0] == 'direct' else f'the server {aside[1]}'})"
        self.rows.append(
            Row(
                scenario,
                f"{median(d):.0f}",
                f"{median(g):.0f}",
                shown,
                f"≥ {goal:g}{X}",
                ratio >= goal,
                {
                    "direct_value": median(d),
                    "gateway_value": median(g),
                    "ratio_value": ratio,
                    "unit": "calls/s",
                    **peer_data,
                },
                peer,
            )
        )

    def twenty_phase(self) -> None:
        """Startup with 20 stdio upstreams, idle RSS, 1000 sessions, tools/list of 1000 and of 10,000 merged tools."""
        p = self.plan
        spec, servers, expected = stdio_fleet("u", p.upstreams, p.tools_per_upstream, startup_timeout=60)
        total = len(expected)

        self.log(f"startup: {p.upstreams} stdio upstreams of {p.tools_per_upstream} tools, {p.startup_rounds} rounds")
        single = [direct_stdio_start([spec])[0] for _ in range(p.startup_rounds)]
        direct_s: list[float] = []
        gateway_s: list[float] = []
        gw: Gateway | None = None
        for r in range(p.startup_rounds):
            times = direct_stdio_start([spec] * p.upstreams)
            direct_s.append(max(times))
            if gw is not None:
                self.stop(gw.proc)
            gw = self.gateway(servers, f"twenty-{r}")
            gateway_s.append(self.wait_tools(gw, expected, timeout=120))
            self.log(f"  round {r + 1}: direct (20 at once) {direct_s[-1]:.2f} s, gateway {gateway_s[-1]:.2f} s")
        assert gw is not None
        ratio = median(g / d for d, g in zip(direct_s, gateway_s, strict=True))
        self.rows.append(
            Row(
                f"startup, {p.upstreams} stdio upstreams, until all {total} tools listed",
                f"{median(direct_s):.2f} s",
                f"{median(gateway_s):.2f} s",
                f"{ratio:.2f}{X}",
                f"≤ 1.3{X}",
                ratio <= 1.3,
                {
                    "direct_value": median(direct_s),
                    "gateway_value": median(gateway_s),
                    "ratio_value": ratio,
                    "unit": "s",
                    "direct_rounds": direct_s,
                    "gateway_rounds": gateway_s,
                    "single_upstream_alone_s": median(single),
                },
            )
        )

        time.sleep(2.0)
        idle = rss_median(gw.pid)
        self.rows.append(
            Row(
                f"RSS idle, {p.upstreams} stdio upstreams (gateway process only)",
                NA,
                f"{idle / 1024:.1f} MiB",
                NA,
                "≤ 100 MiB",
                idle / 1024 <= 100,
                {"gateway_value": idle / 1024, "unit": "MiB"},
            )
        )
        self.sessions_rows(gw, idle)

        self.log(f"tools/list: {total} merged tools vs one direct {total}-tool listing")
        self.listing_rows(gw, total)
        self.extra["rss_twenty_after_listing_load_kib"] = rss_kib(gw.pid)
        self.stop(gw.proc)
        self.big_listing()

    def big_listing(self) -> None:
        """tools/list of 10,000 merged tools (20 stdio fixtures of 500) against one direct 10,000-tool listing."""
        p = self.plan
        _, servers, expected = stdio_fleet("b", p.upstreams, p.big_list_tools_per_upstream, startup_timeout=120)
        total = len(expected)
        self.log(f"tools/list: {total} merged tools ({p.upstreams} stdio upstreams) vs one direct {total}-tool listing")
        gw = self.gateway(servers, "big-listing")
        ready_s = self.wait_tools(gw, expected, timeout=240)
        self.log(f"  gateway listed all {total} tools {ready_s:.1f} s after it started")
        self.extra["big_listing_gateway_ready_s"] = ready_s
        self.extra["rss_big_listing_gateway_kib"] = rss_kib(gw.pid)
        self.listing_rows(gw, total)
        self.stop(gw.proc)

    def listing_rows(self, gw: Gateway, total: int) -> None:
        """p50 of tools/list through the gateway (merged) against one fixture listing as many tools, per era."""
        fx = self.fixture(f"list-{total}", FixtureSpec(tools=total - 1))
        for era in ERAS:
            targets = [
                Target(
                    "direct",
                    Endpoint.parse(fx.url),
                    "tools/list",
                    None,
                    {"upstream": fx.proc.pid},
                    expect='"tools":',
                    check=check_listing(total),
                ),
                Target(
                    "gateway",
                    Endpoint.parse(gw.url),
                    "tools/list",
                    None,
                    {"gateway": gw.pid},
                    expect='"tools":',
                    check=check_listing(total),
                ),
            ]
            res = self.alternate(f"tools/list {total}", era, targets, 1, self.plan.list_duration)
            d = [r.p50_ms for r in res["direct"]]
            g = [r.p50_ms for r in res["gateway"]]
            lratio = median(gv / dv for dv, gv in zip(d, g, strict=True) if dv)
            self.rows.append(
                Row(
                    f"tools/list, {total} merged tools, p50 latency ({era})",
                    f"{median(d):.2f} ms",
                    f"{median(g):.2f} ms",
                    f"{lratio:.2f}{X}",
                    f"≤ {LIST_RATIO:g}{X}",
                    lratio <= LIST_RATIO,
                    {"direct_value": median(d), "gateway_value": median(g), "ratio_value": lratio, "unit": "ms"},
                )
            )
        self.stop(fx.proc, grace=0)

    def sessions_rows(self, gw: Gateway, idle_kib: float) -> None:
        """Open N 2025-era sessions with raw initialize requests, keep them, and read the gateway's RSS."""
        n = self.plan.sessions
        self.log(f"sessions: opening {n} 2025-era sessions")
        conn = Connection(Endpoint.parse(gw.url))
        t = time.monotonic()
        sessions = [open_session(conn, LEGACY) for _ in range(n)]
        opened_s = time.monotonic() - t
        time.sleep(2.0)
        with_sessions = rss_median(gw.pid)
        label = f"RSS with {n} open 2025-era sessions, over idle"
        self.rows.append(_added_rss_row(label, with_sessions, idle_kib, "≤ +15 MiB", 15, {"open_s": opened_s}))
        # The same sessions as an SDK client holds them: each with its GET stream open.
        streams = open_get_streams(gw, sessions)
        time.sleep(2.0)
        with_streams = rss_median(gw.pid)
        label = f"RSS with {n} sessions, each with its GET stream open, over idle"
        self.rows.append(_added_rss_row(label, with_streams, idle_kib, "(info)", None, {"streams": streams[1]}))
        for c in streams[0]:
            c.close()
        for s in sessions:
            close_session(conn, s)
        conn.close()
        time.sleep(0.5)

    def conversations_phase(self) -> None:
        """N 2025-era sessions, one after another, each with its own process of a conversation-isolated stdio
        server: opened, used once, closed. Time per conversation, processes left, RSS after over before."""
        n = self.plan.sessions
        marker = f"bench-conversations-{os.getpid()}"
        server = {"command": PYTHON, "args": [str(SCRIPTED), marker], "isolation": "conversation", "required": True}
        gw = self.gateway({"state": server}, "conversations")
        self.wait_tools(gw, {"state__echo"})
        time.sleep(1.0)
        before = rss_median(gw.pid)
        self.log(f"conversations: {n} sessions, each with its own upstream process")
        conn = Connection(Endpoint.parse(gw.url))
        t = time.monotonic()
        for i in range(n):
            session = open_session(conn, LEGACY)
            call_tool(conn, session, "state__echo", {"text": f"c{i}"})
            close_session(conn, session)
        took = time.monotonic() - t
        conn.close()
        deadline = time.monotonic() + 10
        while (left := _processes_with(marker)) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        after = rss_median(gw.pid)
        label = f"{n} conversations on an isolated stdio server (each its own process), one at a time"
        self.rows.append(
            Row(
                label,
                NA,
                f"{took / n * 1000:.1f} ms each",
                f"{left - 1} processes left",
                "0 left",
                left == 1,
                {"gateway_value": took / n * 1000, "unit": "ms", "processes_left": left - 1, "seconds": took},
            )
        )
        label = f"RSS after {n} isolated conversations, over before"
        self.rows.append(_added_rss_row(label, after, before, "≤ +30 MiB", 30, {"before_kib": before}))
        self.stop(gw.proc)

    # --- output ----------------------------------------------------------------------------------

    def finish_rows(self) -> None:
        load = self.extra.get("rss_calls_gateway_under_load_max_kib") or 0
        idle = self.extra.get("rss_calls_gateway_idle_kib") or 0
        if load:
            self.rows.append(
                Row(
                    "RSS under load (echo c=16, gateway with 4 low-level upstreams), peak",
                    NA,
                    f"{load / 1024:.1f} MiB",
                    f"+{(load - idle) / 1024:.1f} MiB over its idle",
                    "(info)",
                    None,
                    {"gateway_value": load / 1024, "idle_mib": idle / 1024, "unit": "MiB"},
                )
            )
        self.rows.append(
            Row(
                "errors under load (all runs, warm-ups included)",
                str(self.errors["direct"]),
                str(self.errors["gateway"]),
                NA,
                "0",
                self.errors["gateway"] == 0,
                {
                    "direct_value": self.errors["direct"],
                    "gateway_value": self.errors["gateway"],
                    "peer_value": self.errors["peer"],
                },
                str(self.errors["peer"]) if "peer" in self.extra else NA,
            )
        )

    def report(self, elapsed: float, completed: bool) -> dict[str, Any]:
        gen = self.generator_cpu_s * 1e6 / self.calls if self.calls else 0.0
        return {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "plan": self.plan.__dict__,
            "completed": completed,
            "elapsed_s": round(elapsed, 1),
            "machine": machine_info(),
            "versions": self.versions_at_start,
            "versions_changed_during_run": self.versions() != self.versions_at_start,
            "git": git_describe(),
            "gateway_tree": None if self.gateway_tree == REPO else str(self.gateway_tree),
            "upstream_protocol": self.upstream_protocol,
            "generator": {"calls": self.calls, "cpu_s": round(self.generator_cpu_s, 3), "cpu_us_per_call": gen},
            "peer_reason": self.peer_reason,
            "rows": [r.to_json() for r in self.rows],
            "extra": self.extra,
            "runs": self.runs,
        }


def stdio_fleet(
    prefix: str, upstreams: int, tools_each: int, startup_timeout: float
) -> tuple[FixtureSpec, dict[str, dict[str, Any]], set[str]]:
    """`upstreams` stdio fixtures of `tools_each` tools named PREFIX01...: the fixture, the gateway's servers,
    and every public tool name the gateway should list."""
    spec = FixtureSpec(tools=tools_each - 1)
    names = [f"{prefix}{i:02d}" for i in range(1, upstreams + 1)]
    servers = {n: {**spec.stdio_server(), "startup_timeout": startup_timeout} for n in names}
    tool_names = ["echo", *(f"tool_{i:04d}" for i in range(1, tools_each))]
    return spec, servers, {f"{n}__{t}" for n in names for t in tool_names}


def _child_pid(pid: int) -> int | None:
    """The first child process of `pid` (the stdio upstream of a one-stdio-server gateway)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            return int(stat.parent.name)
    return None


def readyz_all_up(port: int) -> bool | None:
    """True when /readyz lists every server up with tools, False while some are not, None if it can't tell."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        body = json.loads(conn.getresponse().read())
        servers = body.get("servers")
        if not isinstance(servers, list) or not servers:
            return None
        return all(s.get("state") == "up" and s.get("tools", 0) > 0 for s in servers)
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def settle(pids: Iterable[int], timeout: float = 20.0, interval: float = 0.1, busy: float = 0.1) -> float:
    """Wait until processes are idle (together under `busy` of a core over `interval`); return the seconds waited.

    A slow target can still be working through requests that wrk sent before it stopped; the next target's
    run must not share the machine with that backlog.
    """
    pids = list(pids)
    started = time.monotonic()

    def total() -> float:
        return sum(cpu_seconds(p) or 0.0 for p in pids)

    before = total()
    while time.monotonic() - started < timeout:
        time.sleep(interval)
        now = total()
        if now - before < busy * interval:
            break
        before = now
    return time.monotonic() - started


def rss_median(pid: int, samples: int = 5, interval: float = 0.2) -> float:
    values = []
    for _ in range(samples):
        v = rss_kib(pid)
        if v is not None:
            values.append(v)
        time.sleep(interval)
    return median(values)


def direct_stdio_start(specs: list[FixtureSpec], timeout: float = 60.0) -> list[float]:
    """Start stdio fixtures all at once, handshake each (server/discover, tools/list), and return the seconds
    from the first spawn until each one's full listing arrived."""
    meta = {META_VERSION: MODERN, META_CLIENT_INFO: CLIENT_INFO, META_CAPABILITIES: {}}
    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}},
    ]
    payload = "".join(json.dumps(m) + "\n" for m in msgs).encode()
    sel = selectors.DefaultSelector()
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()
    done: dict[int, float] = {}
    buffers: dict[int, bytes] = {}
    try:
        for i, spec in enumerate(specs):
            p = subprocess.Popen(
                spec.stdio_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(payload)
            p.stdin.flush()
            os.set_blocking(p.stdout.fileno(), False)
            sel.register(p.stdout, selectors.EVENT_READ, i)
            buffers[i] = b""
            procs.append(p)
        while len(done) < len(specs):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"only {len(done)} of {len(specs)} stdio fixtures listed within {timeout} s")
            for key, _ in sel.select(timeout=1.0):
                i = key.data
                chunk = key.fileobj.read()  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(key.fileobj)
                    if i not in done:
                        raise RuntimeError(f"stdio fixture {i} closed its output before listing")
                    continue
                buffers[i] += chunk
                while b"\n" in buffers[i]:
                    line, buffers[i] = buffers[i].split(b"\n", 1)
                    msg = json.loads(line)
                    if msg.get("id") == 2:
                        n = len(msg.get("result", {}).get("tools", []))
                        if n != spec_tools(specs[i]):
                            raise RuntimeError(f"stdio fixture {i} listed {n} tools: {line[:200]!r}")
                        done[i] = time.monotonic() - t0
                        sel.unregister(key.fileobj)
                        break
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()
        sel.close()
    return [done[i] for i in range(len(specs))]


def spec_tools(spec: FixtureSpec) -> int:
    return spec.tools + 1


def open_get_streams(gw: Gateway, sessions: list[Session]) -> tuple[list[http.client.HTTPConnection], int]:
    """Open each session's standalone GET SSE stream (as the SDK client does) and keep the connections."""
    conns = []
    ok = 0
    for s in sessions:
        c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        try:
            c.request("GET", "/mcp", headers={"Accept": ACCEPT.split(", ")[1], **s.headers})
            resp = c.getresponse()
            if resp.status == 200:
                ok += 1
        except (OSError, http.client.HTTPException):
            pass
        conns.append(c)
    return conns, ok


def _processes_with(marker: str) -> int:
    """Running Python processes whose command line carries `marker` (a server's, not its sandbox's)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if marker.encode() in cmdline and os.path.basename(cmdline.split(b"\0", 1)[0]).startswith(b"python"):
                count += 1
        except OSError:
            continue
    return count


def git_describe() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "gateway"))}


# --- output files -----------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    """The results as markdown: the table, the machine, and every run."""
    m = report["machine"]
    v = report["versions"]
    g = report["generator"]
    lines = [
        f"### Manifold benchmark ({report['plan']['name']} run, {report['when']})",
        "",
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, {m['memory_gib']} GiB, Python {m['python']}, "
        f"load average at start {m['load_average_at_start']}. mcp {v['mcp']}, uvicorn {v['uvicorn']}, "
        f"uvloop {v['uvloop']}, httptools {v['httptools']}, {v['wrk']}. Gateway at {report['git']['commit']}"
        f"{' (with uncommitted gateway changes)' if report['git']['dirty'] else ''}"
        + (f", the gateway package run from {report['gateway_tree']}" if report.get("gateway_tree") else "")
        + (
            f", every calls-phase server set to `protocol: {report['upstream_protocol']}`"
            if report.get("upstream_protocol")
            else ", default configuration"
        )
        + ". "
        + _peer_note(report)
        + f"Took {report['elapsed_s']:.0f} s{_phases_note(report)}{'' if report['completed'] else ' (INCOMPLETE)'}."
        + _native_note(report)
        + (" **Installed packages changed during the run.**" if report.get("versions_changed_during_run") else ""),
        "",
        f"| scenario | direct | gateway | ratio | peer ({PEER_NAME}) | target | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        met = NA if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(
            f"| {r['scenario']} | {r['direct']} | {r['gateway']} | {r['ratio']} | {r.get('peer', NA)} "
            f"| {r['target']} | {met} |"
        )
    lines += [
        "",
        "Ratios are medians of per-round ratios; each round runs the direct fixture, then the gateway, then the "
        f"peer ({report['plan']['rounds']} rounds of {report['plan']['duration']:g} s per scenario and era, after "
        'a warm-up). Rows without "MCPServer" use the lean low-level fixture; the MCPServer rows use the same '
        "tools written on the SDK's MCPServer, called directly and through the gateway; the stateless rows the "
        "low-level fixture in the SDK's stateless HTTP mode (stateless_http=True, JSON answers, no Mcp-Session-Id). "
        "The peer column is "
        f"{PEER_NAME} (create_proxy, its default session strategy) in front of the same fixture, in the ratio "
        "column's terms, with its own median in brackets. The stdio rows compare the hop over a stdio upstream "
        "with the same stdio server called directly over its pipes (bench/stdioload.py, an asyncio driver that keeps "
        "c requests in flight and checks every answer; its figure against the HTTP fixture is in brackets). "
        "The startup baseline starts the same 20 stdio fixtures at once "
        "without the gateway and waits for the slowest listing. Load generator (wrk + Lua): "
        f"{g['cpu_us_per_call']:.0f} µs of its own CPU per call over {g['calls']} calls.",
        *(search_markdown(report["extra"]["search"]) if "search" in report["extra"] else []),
        "",
        "Medians over the rounds, per target (CPU per call from /proc of each process: the hop is the gateway "
        "or the peer; the upstream of the stdio rows is the hop's stdio child, of the direct rows the HTTP "
        "fixture, of direct stdio the driver's child; the generator column is wrk's, or for direct stdio the "
        "driver's):",
        "",
        "| scenario | era | target | calls/s | p50 ms | p99 ms | hop CPU ms/call | upstream CPU ms/call "
        "| wrk CPU µs/call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in report["runs"]:
        groups.setdefault((r["scenario"], r["era"], r["target"]), []).append(r)
    for (scenario, era, target), runs in groups.items():

        def med(f: Callable[[dict[str, Any]], float | None], rs: list[dict[str, Any]] = runs) -> float | None:
            values = [v for v in map(f, rs) if v is not None]
            return median(values) if values else None

        lines.append(
            f"| {scenario} | {era} | {target} | {_fmt(med(lambda r: r['calls_per_s']), 0)} "
            f"| {_fmt(med(lambda r: r['p50_ms']))} | {_fmt(med(lambda r: r['p99_ms']))} "
            f"| {_fmt(med(lambda r: r['cpu_ms_per_call'].get('gateway')))} "
            f"| {_fmt(med(lambda r: r['cpu_ms_per_call'].get('upstream')))} "
            f"| {_fmt(med(lambda r: r['generator_cpu_us_per_call']), 0)} |"
        )
    lines += [
        "",
        "<details><summary>Every run</summary>",
        "",
        "| scenario | era | target | round | calls/s | p50 ms | p90 ms | p99 ms | max ms | hop CPU ms/call "
        "| upstream CPU ms/call | wrk CPU µs/call | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        cpu = r["cpu_ms_per_call"]
        lines.append(
            f"| {r['scenario']} | {r['era']} | {r['target']} | {r['round'] + 1} | {r['calls_per_s']:.0f} "
            f"| {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} "
            f"| {_fmt(cpu.get('gateway'))} | {_fmt(cpu.get('upstream'))} | {r['generator_cpu_us_per_call']:.0f} "
            f"| {r['errors']} |"
        )
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _phases_note(report: dict[str, Any]) -> str:
    took = report["extra"].get("phase_seconds") or {}
    return f" ({', '.join(f'{name} {s:.0f} s' for name, s in took.items())})" if took else ""


def _peer_note(report: dict[str, Any]) -> str:
    peer = report["extra"].get("peer")
    if peer:
        return f"Peer: {peer['name']} (fastmcp and its mcp: {peer['fastmcp_and_mcp']}). "
    return f"Peer: {_cell_text(report.get('peer_reason') or 'not measured', 200)}. "


def _native_note(report: dict[str, Any]) -> str:
    native = report["extra"].get("native_modules")
    if not native:
        return ""
    parts = [f"{who}: {', '.join(k for k, v in mods.items() if v) or 'none'}" for who, mods in native.items()]
    return f" Compiled speedups loaded ({'; '.join(parts)})."


def _fmt(v: float | None, digits: int = 2) -> str:
    return NA if v is None else f"{v:.{digits}f}"


def write_results(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "latest" if report["plan"]["name"] == "full" else report["plan"]["name"]
    json_path = out_dir / f"{name}.json"
    md_path = out_dir / f"{name}.md"
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path


# --- profile ----------------------------------------------------------------------------------------


def profile(
    out_dir: Path,
    duration: float = 8.0,
    stateless: bool = False,
    protocol: str | None = None,
    eras: tuple[str, ...] = ERAS,
    tree: Path = REPO,
) -> None:
    """py-spy on the gateway while wrk drives echo c=16 through an HTTP upstream and a stdio upstream, in each era.

    `stateless`: the HTTP fixture in the SDK's stateless mode; `protocol`: `protocol:` set on both servers. The
    files are named after both (profile-2025.svg, profile-2025-stdio.svg, profile-stateless-2025-11-25-2026.svg...),
    the summary goes to profile{the same suffix}.md."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise SystemExit("py-spy is not installed: `pip install py-spy`")
    bench = Bench(QUICK, out_dir, gateway_tree=tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ("-stateless" if stateless else "") + (f"-{protocol}" if protocol else "")
    try:
        spec = FixtureSpec(tools=10, stateless=stateless)
        fx = bench.fixture("echo", spec)
        servers: dict[str, dict[str, Any]] = {"h": {"url": fx.url}, "s": spec.stdio_server()}
        if protocol is not None:
            for entry in servers.values():
                entry["protocol"] = protocol
        gw = bench.gateway(servers, "profile")
        bench.wait_tools(gw, {"h__echo", "s__echo"})
        summary = []
        for era in eras:
            for server, via in (("h", ""), ("s", "-stdio")):
                params = {"name": f"{server}__echo", "arguments": {"text": ECHO_TEXT}}
                target = Target(f"gateway {server}", Endpoint.parse(gw.url), "tools/call", params, {"gateway": gw.pid})
                bench.prepare(target, era, 16)
                bench.load(target, 16, 1)
                tag = ("2025" if era == LEGACY else "2026") + via
                svg = out_dir / f"profile{suffix}-{tag}.svg"
                raw = bench.workdir / f"profile{suffix}-{tag}.txt"  # collapsed stacks, summarised into profile.md
                for fmt, path in (("flamegraph", svg), ("raw", raw)):
                    # blocking sampling (the default) pauses the gateway per sample but gives whole stacks
                    cmd = [py_spy, "record", "--pid", str(gw.pid), "--duration", f"{duration:g}", "--rate", "200"]
                    cmd += ["--format", fmt, "--output", str(path)]
                    spy = subprocess.Popen(
                        cmd,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                    )
                    res = bench.load(target, 16, duration + 1)
                    _, err = spy.communicate()
                    if spy.returncode != 0:
                        raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
                    bench.log(
                        f"  {era} {'stdio' if via else 'http'} {fmt}: {res.calls_per_s:.0f} calls/s, "
                        f"gateway {res.cpu_ms_per_call} ms CPU/call"
                    )
                upstream = "a stdio upstream" if via else "an HTTP upstream"
                summary.append(f"## {era}, {upstream}\n\n{hotspots(raw)}")
                bench.release(target)
        fixture = "the SDK's stateless HTTP mode" if stateless else "its default (stateful) HTTP mode"
        note = (
            "py-spy samples of the gateway while wrk drives echo at c=16 through an HTTP upstream and a stdio "
            f"upstream (the low-level fixture, in {fixture}; {duration:g} s per era and upstream; flame graphs in "
            f"profile{suffix}-*.svg; the servers' `protocol`: {protocol or 'auto (the default)'}). Self % of very "
            "small, very frequent functions (anyio's current_async_library, asyncio's current_task) comes out "
            "inflated under py-spy here; weigh the inclusive table and the package totals more.\n\n"
        )
        (out_dir / f"profile{suffix}.md").write_text(note + "\n".join(summary))
        print("\n".join(summary))
    finally:
        bench.stop_all()


def hotspots(raw: Path, top: int = 25) -> str:
    """Self and inclusive shares per function from py-spy's collapsed stacks."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        if frames:
            self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            incl_n[f] = incl_n.get(f, 0) + n
    if not total:
        return "(no samples)"
    by_package: dict[str, int] = {}
    for f, n in self_n.items():
        by_package[_package(f)] = by_package.get(_package(f), 0) + n
    out = [f"{total} samples (CPU only, idle excluded).", "", "| self % | package |", "|---|---|"]
    for pkg, n in sorted(by_package.items(), key=lambda kv: -kv[1]):
        out.append(f"| {100 * n / total:.1f} | {pkg} |")
    out += ["", "| self % | function |", "|---|---|"]
    for f, n in sorted(self_n.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"| {100 * n / total:.1f} | `{f}` |")
    out += ["", "| inclusive % | function |", "|---|---|"]
    for f, n in sorted(incl_n.items(), key=lambda kv: -kv[1])[: top * 2]:
        out.append(f"| {100 * n / total:.1f} | `{f}` |")
    return "\n".join(out) + "\n"


def _package(frame: str) -> str:
    """The package a frame belongs to, from its shortened path (`mcp/server/x.py` -> `mcp.server`)."""
    _, _, where = frame.partition(" (")
    parts = where.rstrip(")").split("/")
    if len(parts) == 1:
        return parts[0].removesuffix(".py") or "?"
    if parts[0] == "mcp" and len(parts) > 2:
        return f"mcp.{parts[1]}"
    return parts[0]


def _frame(f: str) -> str:
    """`func (path/to/file.py:123)` -> `func (pkg/file.py)`: lines merged, paths shortened."""
    name, _, where = f.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


# --- entry point ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (figures not comparable)")
    parser.add_argument("--profile", action="store_true", help="py-spy the gateway under echo c=16 via HTTP and stdio")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default bench/results)")
    parser.add_argument(
        "--only", choices=["calls", "twenty", "conversations", "search", "sandbox"], help="run one phase only"
    )
    parser.add_argument("--no-peer", action="store_true", help=f"leave the peer ({PEER_NAME}) out")
    parser.add_argument(
        "--fixture-mode",
        choices=[*FIXTURE_MODES, "both"],
        default="both",
        help="the HTTP fixtures of the calls phase: stateful (the SDK's default sessions), stateless "
        "(stateless_http=True, JSON answers; the low-level fixture only), or both (the default); with --profile, "
        "stateless profiles the stateless fixture",
    )
    parser.add_argument(
        "--upstream-protocol",
        choices=["auto", "2025-11-25", "2026-07-28"],
        help="set `protocol:` on the calls phase's servers (an A/B; the table's figures are the default, unset)",
    )
    parser.add_argument(
        "--gateway-tree",
        type=Path,
        default=REPO,
        help="run the `gateway` package of another directory (e.g. `git archive` of another commit), for an A/B",
    )
    parser.add_argument("--rounds", type=int, help="alternating rounds per scenario (overrides the plan's)")
    args = parser.parse_args(argv)
    modes = FIXTURE_MODES if args.fixture_mode == "both" else (args.fixture_mode,)
    if args.profile:
        stateless = args.fixture_mode == "stateless"
        profile(args.out, stateless=stateless, protocol=args.upstream_protocol, tree=args.gateway_tree)
        return 0
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = replace(plan, name=f"{plan.name}-{args.rounds}-rounds", rounds=args.rounds)
    bench = Bench(
        plan,
        args.out,
        peer=not args.no_peer,
        fixture_modes=modes,
        upstream_protocol=args.upstream_protocol,
        gateway_tree=args.gateway_tree,
    )
    started = time.monotonic()
    completed = False
    print(f"bench: {plan.name} run; logs and configs in {bench.workdir}")
    phases: list[tuple[str, Callable[[], None]]] = [
        ("calls", bench.calls_phase),
        ("twenty", bench.twenty_phase),
        ("conversations", bench.conversations_phase),
        ("search", lambda: search_phase(bench)),
        ("sandbox", lambda: sandbox_phase(bench)),
    ]
    took = bench.extra.setdefault("phase_seconds", {})
    try:
        for name, phase in phases:
            if args.only in (None, name):
                t = time.monotonic()
                phase()
                took[name] = round(time.monotonic() - t, 1)
                print(f"bench: {name} phase took {took[name]:.0f} s")
        completed = True
    finally:
        bench.stop_all()
        bench.finish_rows()
        report = bench.report(time.monotonic() - started, completed)
        json_path, md_path = write_results(report, args.out)
        print()
        print(markdown(report).split("<details>")[0])
        print(f"bench: wrote {json_path} and {md_path}")
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
