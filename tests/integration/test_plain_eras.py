"""Plain tool calls to a server that answers both eras take the era learned from their first calls.

The upstream is the benchmark's low-level fixture in the SDK's stateless HTTP mode (`stateless_http=True`, JSON
answers): it issues no `Mcp-Session-Id`, and answers 2025-era and 2026-era requests alike. Which era a tool's calls
settle on depends on timing, so the tests check what must hold either way: every caller of either era gets its
answers right before, during and after the learning, the choice is made once and logged, and the `protocol`
option still fixes the era of every call.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.upstream.eras import LEARN_AFTER, SAMPLES, WARMUP
from tests.fixtures.servers import free_port
from tests.integration.conftest import connect, run_gateway

ROOT = Path(__file__).resolve().parents[2]
BENCH_FIXTURE = ROOT / "bench" / "fixture.py"
CHOSEN = "plain calls of a tool take the era that answered them faster"
OPENED = "2025-era session opened beside the server's 2026 connection"

pytestmark = pytest.mark.anyio


@contextmanager
def stateless_fixture(*args: str) -> Iterator[str]:
    """The low-level fixture over HTTP in the SDK's stateless mode (with more of its options); yields its URL."""
    port = free_port()
    cmd = [sys.executable, str(BENCH_FIXTURE), "--transport", "http", "--stateless", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "the stateless fixture exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the stateless fixture did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(5)


async def test_plain_calls_learn_their_era_and_answer_callers_of_both_eras(tmp_path: Path) -> None:
    with stateless_fixture() as url:
        config = {"servers": {"st": {"url": url}, "pinned": {"url": url, "protocol": "2026-07-28"}}}
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, "2026-07-28") as modern, connect(gw.url, "2025-11-25") as legacy:
                await modern.wait_for(lambda n: "st__echo" in n and "pinned__echo" in n)
                # one call at a time: each starts alone, so each of the learning calls is timed (the eras take
                # turns in blocks of time, so the calls go on until the choice is logged)
                i = 0
                while i < LEARN_AFTER + 2 * (WARMUP + SAMPLES) or CHOSEN not in gw.log():
                    assert i < 3000, "no era chosen"
                    client = modern if i % 2 else legacy
                    for server in ("st", "pinned"):
                        result = await client.call(f"{server}__echo", {"text": f"call {i}"})
                        assert not result.is_error
                        assert result.content[0].text == f"call {i}"
                        assert (result.meta or {}).get("manifold/server") == server
                    i += 1
                # and after the choice, both eras of callers still get their answers
                for client in (modern, legacy):
                    result = await client.call("st__echo", {"text": "after"})
                    assert result.content[0].text == "after" and not result.is_error
        events = gw.log_events()
    chosen = [e for e in events if e.get("event") == CHOSEN]
    assert [(e["server"], e["tool"]) for e in chosen] == [("st", "echo")], "chosen once, for the server left on auto"
    assert chosen[0]["era"] in ("2025-11-25", "2026-07-28")
    assert chosen[0]["median_2025_ms"] > 0 and chosen[0]["median_2026_ms"] > 0
    assert [e["server"] for e in events if e.get("event") == OPENED] == ["st"], "no 2025 session beside `pinned`"


async def test_a_tool_answered_faster_in_2025_takes_it_for_callers_of_both_eras(tmp_path: Path) -> None:
    """The fixture's echo sleeps 30 ms more in the 2026 era, so the 2025 era wins clearly; it names the era that
    served each call. After the choice every plain call of either caller takes the 2025 era and is answered right;
    the server pinned to 2026 stays there."""
    with stateless_fixture("--modern-sleep-ms", "30", "--tag-era") as url:
        config = {"servers": {"st": {"url": url}, "pinned": {"url": url, "protocol": "2026-07-28"}}}
        with run_gateway(tmp_path, config) as gw:
            async with connect(gw.url, "2026-07-28") as modern, connect(gw.url, "2025-11-25") as legacy:
                await modern.wait_for(lambda n: "st__echo" in n and "pinned__echo" in n)
                i = 0
                while CHOSEN not in gw.log():
                    assert i < 2000, "no era chosen"
                    result = await (modern if i % 2 else legacy).call("st__echo", {"text": f"call {i}"})
                    assert result.content[0].text == f"call {i}" and not result.is_error
                    i += 1
                for client in (modern, legacy):
                    for server, era in (("st", "2025-11-25"), ("pinned", "2026-07-28")):
                        result = await client.call(f"{server}__echo", {"text": "after"})
                        assert result.content[0].text == "after" and not result.is_error
                        assert (result.meta or {}).get("bench/era") == era, (server, result.meta)
        events = gw.log_events()
    chosen = [e for e in events if e.get("event") == CHOSEN]
    assert [(e["server"], e["tool"], e["era"]) for e in chosen] == [("st", "echo", "2025-11-25")]
    assert chosen[0]["median_2025_ms"] < chosen[0]["median_2026_ms"]
