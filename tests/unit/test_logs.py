"""Log output: redaction, timestamps, and the writer that joins one loop turn's lines into one write."""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import Iterator

import pytest
import structlog

from gateway.observe.logs import LineWriter, configure, get_logger


class CountingStream(io.StringIO):
    """A text stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingStream]:
    stream = CountingStream()
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", "json")
    yield stream
    structlog.reset_defaults()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_is_json_with_a_utc_timestamp_and_secrets_redacted(stderr: CountingStream) -> None:
    get_logger("t").info("hello", token="s3cret", note="Authorization: Bearer abc.def", count=3)
    [line] = lines(stderr)
    assert line["event"] == "hello" and line["component"] == "t" and line["level"] == "info"
    assert line["token"] == "[redacted]" and "abc.def" not in str(line["note"]) and line["count"] == 3
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", str(line["timestamp"]))


def test_lines_of_one_loop_turn_go_out_in_one_write_after_it(stderr: CountingStream) -> None:
    log = get_logger("t")

    async def turn() -> tuple[int, int]:
        for i in range(5):
            log.info("call", i=i)
        waiting = stderr.writes  # nothing written yet: the turn is not over
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return waiting, stderr.writes

    before, after = asyncio.run(turn())
    assert (before, after) == (0, 1)
    assert [line["i"] for line in lines(stderr)] == [0, 1, 2, 3, 4]


def test_a_warning_is_written_at_once_after_the_lines_waiting(stderr: CountingStream) -> None:
    log = get_logger("t")

    async def turn() -> int:
        log.info("first")
        log.warning("second")
        return stderr.writes

    assert asyncio.run(turn()) == 1
    assert [line["event"] for line in lines(stderr)] == ["first", "second"]


def test_off_the_loop_a_line_is_written_at_once(stderr: CountingStream) -> None:
    get_logger("t").info("now")
    assert stderr.writes == 1 and lines(stderr)[0]["event"] == "now"


def test_lines_left_by_a_closed_loop_are_not_stranded() -> None:
    stream = CountingStream()
    writer = LineWriter(stream)

    loop = asyncio.new_event_loop()

    async def log_and_leave() -> None:
        writer.msg("left behind")  # its flush is scheduled, but the loop stops and closes first
        loop.stop()

    loop.run_until_complete(log_and_leave())
    loop.close()
    assert stream.getvalue() == ""

    async def later() -> None:
        writer.msg("next")
        await asyncio.sleep(0)

    asyncio.run(later())  # a new loop schedules its own flush, which takes the older line too
    assert stream.getvalue() == "left behind\nnext\n"
    writer.msg("at exit")
    assert stream.getvalue().endswith("at exit\n")  # off any loop: at once
