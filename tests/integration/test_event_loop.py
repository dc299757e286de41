"""Large request bodies are decoded off the event loop: a 4 MB body does not stall a small call beside it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from bench.mcphttp import MODERN, Connection, Endpoint, open_session
from tests.fixtures.servers import stdio_spec
from tests.integration.conftest import run_gateway

BIG_POSTS = 4


def _big_body(session_body: dict[str, object]) -> bytes:
    """A `tools/list` whose `_meta` holds ~4 MB: a long text (a file's content, say) and a few hundred small
    objects, enough brackets that the nesting must be measured."""
    body = dict(session_body)
    params = dict(body.get("params") or {})  # type: ignore[call-overload]
    meta = dict(params.get("_meta") or {})
    meta["vendor/bulk"] = {
        "text": "lorem ipsum [dolor] {sit} " * 150_000,
        "items": [{"k": i, "v": [i]} for i in range(300)],
    }
    params["_meta"] = meta
    body["params"] = params
    data = json.dumps(body, separators=(",", ":")).encode()
    assert 3_500_000 < len(data) < 4 * 1024 * 1024
    return data


def test_a_large_body_does_not_stall_a_small_call(tmp_path: Path) -> None:
    config = {"servers": {"fx": stdio_spec()}, "max_body_bytes": 8 * 1024 * 1024}
    with run_gateway(tmp_path, config) as gw:
        small = Connection(Endpoint.parse(gw.url))
        session = open_session(small, MODERN)
        deadline = time.monotonic() + 20
        while "fx__echo" not in {t["name"] for t in small.request(session, "tools/list")["tools"]}:
            assert time.monotonic() < deadline
            time.sleep(0.1)

        def echo_latency() -> float:
            started = time.perf_counter()
            result = small.request(session, "tools/call", {"name": "fx__echo", "arguments": {"text": "hi"}})
            assert result["content"][0]["text"] == "hi"
            return time.perf_counter() - started

        quiet = sorted(echo_latency() for _ in range(30))[-3]  # a high percentile with nothing else going on
        big = _big_body(session.body(1, "tools/list", {}))
        headers = session.request_headers("tools/list", {})
        statuses: list[int] = []

        def post_big() -> None:
            conn = Connection(Endpoint.parse(gw.url), timeout=60)
            for _ in range(BIG_POSTS):
                statuses.append(conn.exchange("POST", headers, big).status)
            conn.close()

        poster = threading.Thread(target=post_big)
        poster.start()
        busy: list[float] = []
        while poster.is_alive() or not busy:
            busy.append(echo_latency())
        poster.join()
        small.close()
    assert statuses == [200] * BIG_POSTS
    worst = max(busy)
    # Before, each big body held the event loop for about 0.6 s (a byte-by-byte nesting scan, then json.loads);
    # now a small call beside them waits for little more than the big bodies' reads (tens of ms on a busy machine).
    assert worst - quiet < 0.3, (
        f"a small call took {worst * 1000:.0f} ms beside the big bodies (quiet: {quiet * 1000:.1f} ms)"
    )
