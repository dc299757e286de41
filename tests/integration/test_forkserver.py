"""The fork server the harness starts gateways and fixtures from behaves as a fresh interpreter would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.fixtures.forkserver import FIXTURE, Forked, spawn
from tests.fixtures.servers import free_port, run_http_fixture


def _fixture(*args: str, env: dict[str, str] | None = None) -> Forked:
    proc = spawn([sys.executable, str(FIXTURE), *args], env={**os.environ, **(env or {})}, stderr=subprocess.DEVNULL)
    assert isinstance(proc, Forked), "a fixture command is forked from the fork server"
    return proc


def test_exit_codes_and_signals_are_reported_as_popen_reports_them() -> None:
    assert _fixture("--mode", "exit-at-start").wait(30) == 3
    assert _fixture("--mode", "env:FORKSERVER_PROBE").wait(30) == 4
    hung = _fixture("--transport", "http", "--port", str(free_port()), "--mode", "hang-at-start")
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(0.5)
    assert os.getpgid(hung.pid) == hung.pid, "the child leads a session of its own"
    hung.send_signal(signal.SIGKILL)
    assert hung.wait(10) == -signal.SIGKILL


def test_the_child_gets_the_environment_it_was_given() -> None:
    with run_http_fixture(mode="env:FORKSERVER_PROBE", env={"FORKSERVER_PROBE": "1"}) as web:
        assert isinstance(web.proc, Forked)
        assert web.proc.poll() is None


def test_interpreter_settings_are_never_lost() -> None:
    env = {**os.environ, "PYTHONOPTIMIZE": "1"}
    proc = spawn([sys.executable, str(FIXTURE), "--mode", "exit-at-start"], env=env, stderr=subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen), "PYTHON* settings differ: a fresh interpreter"
    assert proc.wait(30) == 3
