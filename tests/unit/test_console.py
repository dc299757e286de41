"""The console's pure parts: the call feed's bounded fan-out, the side-by-side diff, the rates read from the
metrics, and the sign-in sessions."""

from __future__ import annotations

import anyio
import pytest

from gateway.console.diff import side_by_side
from gateway.console.rates import CallRates
from gateway.console.sessions import MAX_SESSIONS, Sessions
from gateway.observe.callfeed import CallFeed
from gateway.observe.metrics import Metrics


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_slow_reader_loses_events_and_the_publisher_never_waits() -> None:
    feed = CallFeed(history=3, queue=2)
    with feed.subscribe() as slow, feed.subscribe() as other:
        for n in range(5):  # a plain function: it cannot wait for a reader
            feed.record("fx", f"fx__t{n}", "ok", 0.0015, "ops-agent")
        events = await slow.next(timeout=1)
        assert [e.tool for e in events] == ["fx__t0", "fx__t1"] and slow.dropped == 3
        assert events[0].caller == "ops-agent" and events[0].duration_ms == 1.5
        assert len(await other.next(timeout=1)) == 2, "each reader has a queue of its own"
        feed.record("fx", "fx__t5", "held", None, "ops-agent")
        [held] = await slow.next(timeout=1)
        assert held.outcome == "held" and held.duration_ms is None
        assert feed.watchers == 2
    assert feed.watchers == 0
    assert [e.tool for e in feed.recent] == ["fx__t3", "fx__t4", "fx__t5"]


@pytest.mark.anyio
async def test_a_reader_with_nothing_to_read_wakes_after_its_timeout() -> None:
    feed = CallFeed()
    with feed.subscribe() as reader, anyio.fail_after(2):
        assert await reader.next(timeout=0.05) == []


def test_metrics_tell_the_feed_of_each_call() -> None:
    metrics, feed = Metrics(), CallFeed()
    metrics.on_call = feed.record
    metrics.add_server("fx")
    metrics.record_call("fx", "fx__echo", "ok", 0.01)
    metrics.record_call("gone", "gone__echo", "ok", 0.01)  # a removed server's late call: neither counted nor told
    assert [(e.server, e.tool, e.outcome) for e in feed.recent] == [("fx", "fx__echo", "ok")]


def test_side_by_side_aligns_equal_lines_and_pairs_changed_ones() -> None:
    pinned = {"name": "a", "description": "old", "inputSchema": {"type": "object"}}
    offered = {"name": "a", "description": "new", "title": "A", "inputSchema": {"type": "object"}}
    rows = side_by_side(pinned, offered)
    assert [(r.kind, r.left_no, r.right_no) for r in rows] == [
        ("same", 1, 1),
        ("changed", 2, 2),
        ("same", 3, 3),
        ("same", 4, 4),
        ("same", 5, 5),
        ("changed", 6, 6),
        ("added", None, 7),
        ("same", 7, 8),
    ]
    assert (rows[1].left, rows[1].right) == ('  "description": "old",', '  "description": "new",')
    assert rows[6].left is None and rows[6].right == '  "title": "A"'
    assert all(r.left == r.right for r in rows if r.kind == "same")
    assert {r.kind for r in side_by_side(None, offered)} == {"added"}
    assert {r.kind for r in side_by_side(offered, None)} == {"removed"}
    assert {r.kind for r in side_by_side(pinned, dict(pinned))} == {"same"}


def test_rates_count_calls_since_the_reference_reading() -> None:
    metrics = Metrics()
    metrics.add_server("fx")
    rates = CallRates(metrics, window=60)
    idle = rates.now()
    assert idle.per_minute == 0 and idle.error_share is None
    for outcome in ("ok", "ok", "ok", "timeout"):
        metrics.record_call("fx", "fx__echo", outcome, 0.01)
    busy = rates.now()
    assert busy.per_minute > 0 and busy.error_share == 0.25
    assert busy.by_outcome == {"ok": 3, "timeout": 1}


def test_sessions_open_find_close_and_expire() -> None:
    sessions = Sessions("the-admin-token")
    assert sessions.token_matches("the-admin-token") and not sessions.token_matches("the-admin-toke")
    first = sessions.open()
    assert sessions.get(first.id) == first and first.csrf != first.id
    sessions.close(first)
    assert sessions.get(first.id) is None
    brief = Sessions("t", lifetime=-1)
    assert brief.get(brief.open().id) is None, "an expired session is no session"
    many = Sessions("t")
    oldest = many.open()
    for _ in range(MAX_SESSIONS):
        many.open()
    assert many.get(oldest.id) is None, "beyond the cap the oldest session goes"
