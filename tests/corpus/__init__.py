"""The compatibility corpus: real MCP servers of every SDK generation (`catalog.py`), installed by `make corpus`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parent
MARKERS = [CORPUS / "node_modules" / ".installed"] + [
    CORPUS / ".venvs" / v / ".installed" for v in ("mcp1", "fastmcp", "mcp2")
]
# `make test` installs the corpus while the tests start; it names a file that gets the install's exit status, and its
# log. A test that needs the corpus waits for it (and fails with the log when the install failed).
STATUS, LOG = "MANIFOLD_CORPUS_STATUS", "MANIFOLD_CORPUS_LOG"
INSTALL_WAIT = 900  # seconds a test waits for the install at most


def installed() -> bool:
    """Whether every part of the corpus is installed."""
    return all(m.exists() for m in MARKERS)


def installing() -> bool:
    """Whether the corpus is installed, or being installed beside this run."""
    return installed() or bool(os.environ.get(STATUS))


def wait_installed() -> None:
    """Return once the corpus is installed; skip when it is not and nothing installs it; fail when its install
    failed or did not end within `INSTALL_WAIT` seconds."""
    status = os.environ.get(STATUS)
    deadline = time.monotonic() + INSTALL_WAIT
    while not installed():
        if not status:
            pytest.skip("the corpus is not installed (make test installs it)")
        done = Path(status)
        if done.exists() and done.read_text().strip() not in ("", "0"):
            log = Path(os.environ.get(LOG, "/dev/null")).read_text(errors="replace")[-4000:]
            pytest.fail(f"the corpus install failed (exit {done.read_text().strip()}):\n{log}")
        if time.monotonic() > deadline:
            pytest.fail(f"the corpus install did not end within {INSTALL_WAIT} s")
        time.sleep(1)
