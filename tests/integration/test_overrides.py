"""Overrides: the operator renames, re-describes or re-annotates a server's tool; calls reach the original."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import ERAS, ROOT, connect, run_gateway, write_config

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("era", ERAS)
async def test_a_renamed_tool_is_listed_described_and_called_under_its_new_name(tmp_path: Path, era: str) -> None:
    overrides = {
        "echo": {"name": "say", "description": "Say the text back.", "annotations": {"readOnlyHint": True}},
        "no_such_tool": {"description": "a typo"},
    }
    config = {"servers": {"fx": {**stdio_spec(), "required": True, "tools": overrides}}}
    with run_gateway(tmp_path, config) as gw:
        deadline = time.monotonic() + 20
        while httpx2.get(f"{gw.base}/readyz", timeout=2).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        async with connect(gw.url, era) as c:
            listed = {t.name: t for t in (await c.session.list_tools()).tools}
            assert "fx__say" in listed and "fx__echo" not in listed
            say = listed["fx__say"]
            assert say.description == "Say the text back."
            assert say.annotations is not None and say.annotations.read_only_hint is True
            assert (say.meta or {})["manifold/tool"] == "echo"
            result = await c.call("fx__say", {"text": "hello"})
            assert result.is_error is not True and result.content[0].text == "hello"
        events = [e for e in gw.log_events() if e.get("event") == "override names no tool the server offers"]
        assert events and events[0]["tool"] == "no_such_tool"


def test_check_names_a_bad_override(tmp_path: Path) -> None:
    bad = {"servers": {"fx": {**stdio_spec(), "tools": {"echo": {"annotations": {"readonly": True}, "colour": 1}}}}}
    path = write_config(tmp_path, bad)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "servers.fx.tools.echo" in done.stdout + done.stderr
    assert "colour" in done.stdout + done.stderr
