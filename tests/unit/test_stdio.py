"""stdio upstreams: the line splitter that caps stdout and stderr lines, and how a bare command is found."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from gateway.upstream.transports.stdio import (
    MAX_LINE,
    MAX_STDERR_LINE,
    STDERR_BURST,
    LineSplitter,
    find_command,
    stdio_transport,
)


def feed_all(splitter: LineSplitter, chunks: list[bytes]) -> list[bytes]:
    lines: list[bytes] = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    return lines


# --- LineSplitter ---------------------------------------------------------------------------------------


def test_the_caps() -> None:
    assert MAX_LINE == 64 * 1024 * 1024
    assert MAX_STDERR_LINE == 64 * 1024


def test_a_line_split_across_chunks_comes_out_whole() -> None:
    s = LineSplitter(100)
    assert s.feed(b"hel") == []
    assert s.feed(b"lo wo") == []
    assert s.feed(b"rld\nsecond ") == [b"hello world"]
    assert s.feed(b"line\n") == [b"second line"]
    assert s.dropped == 0


def test_a_chunk_without_a_newline_is_held_until_one_comes() -> None:
    s = LineSplitter(100)
    assert s.feed(b"partial") == []
    assert s.feed(b"") == []
    assert s.feed(b"\n") == [b"partial"]
    assert s.feed(b"\n") == [b""]


def test_a_line_exactly_at_the_limit_is_kept() -> None:
    s = LineSplitter(8)
    assert s.feed(b"12345678\n") == [b"12345678"]
    # ... also when it arrives in pieces, the last of which ends exactly at the limit before the newline
    assert s.feed(b"1234") == []
    assert s.feed(b"5678") == []
    assert s.feed(b"\nabcdefgh\n") == [b"12345678", b"abcdefgh"]
    # ... and as a line in the middle of a chunk
    assert s.feed(b"a\n12345678\nb\n") == [b"a", b"12345678", b"b"]
    assert s.dropped == 0


def test_one_byte_over_the_limit_is_dropped() -> None:
    s = LineSplitter(8)
    assert s.feed(b"123456789\n") == []
    assert s.dropped == 1
    assert s.feed(b"a\n123456789\nb\n") == [b"a", b"b"]
    assert s.dropped == 2


def test_an_over_long_line_is_dropped_whole_with_its_tail_in_later_chunks() -> None:
    s = LineSplitter(8)
    assert s.feed(b"0123456789") == []  # over the limit already, no newline yet
    assert s.dropped == 1
    assert s.feed(b"more of the same line") == []
    assert s.feed(b"") == []
    assert s.feed(b"and its end\nnext\n") == [b"next"]  # the tail is not a line of its own
    assert s.dropped == 1  # counted once, however many chunks it spans
    assert s.feed(b"fine\n") == [b"fine"]


def test_a_line_that_grows_past_the_limit_across_chunks_is_dropped() -> None:
    s = LineSplitter(8)
    assert s.feed(b"12345") == []
    assert s.feed(b"6789") == []  # 9 bytes held: over
    assert s.dropped == 1
    assert s.feed(b"\nok\n") == [b"ok"]
    s = LineSplitter(8)
    assert s.feed(b"12345") == []
    assert s.feed(b"6789\nok\n") == [b"ok"]  # over only once the newline's chunk is counted
    assert s.dropped == 1


def test_an_over_long_tail_after_good_lines_is_dropped_but_the_good_lines_are_not() -> None:
    s = LineSplitter(4)
    assert s.feed(b"ab\ncd\nefghij") == [b"ab", b"cd"]
    assert s.dropped == 1
    assert s.feed(b"kl\nmn\n") == [b"mn"]
    assert s.dropped == 1


def test_many_lines_in_one_chunk_come_out_in_order() -> None:
    s = LineSplitter(100)
    lines = [f"line {i}".encode() for i in range(5000)]
    assert s.feed(b"\n".join(lines) + b"\n") == lines
    assert s.dropped == 0


def test_empty_lines_are_lines() -> None:
    s = LineSplitter(100)
    assert s.feed(b"\n\n") == [b"", b""]
    assert s.feed(b"a\n\nb\n") == [b"a", b"", b"b"]
    assert s.feed(b"c") == []
    assert s.feed(b"\n\n\n") == [b"c", b"", b""]


def test_the_dropped_counter_can_be_reset_by_its_reader() -> None:
    s = LineSplitter(2)
    s.feed(b"abc\nde\nfgh\n")
    assert s.dropped == 2
    s.dropped = 0  # the stdio readers log the count and reset it
    assert s.feed(b"ijk\nl\n") == [b"l"]
    assert s.dropped == 1


def test_a_huge_stream_without_a_newline_holds_at_most_the_limit() -> None:
    """50 MB with no newline in 64 KiB chunks: nothing comes out, one drop, and nothing is kept of it."""
    s = LineSplitter(MAX_STDERR_LINE)
    chunk = b"x" * 65536
    for _ in range(800):
        assert s.feed(chunk) == []
    assert s.dropped == 1
    assert sum(len(p) for p in s._parts) <= MAX_STDERR_LINE
    assert s.feed(b"\nafter the flood\n") == [b"after the flood"]
    assert s.dropped == 1


def _expected(data: bytes, limit: int) -> tuple[list[bytes], int]:
    *complete, tail = data.split(b"\n")
    kept = [line for line in complete if len(line) <= limit]
    dropped = sum(len(line) > limit for line in complete) + (len(tail) > limit)
    return kept, dropped


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"a", b"bb", b"\n", b"cccc", b"\n\n", b"dddddddd"]), max_size=40).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
    limit=st.integers(min_value=0, max_value=12),
)
def test_any_chunking_gives_the_lines_of_the_whole(data: bytes, cuts: list[int], limit: int) -> None:
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    s = LineSplitter(limit)
    lines = feed_all(s, chunks)
    kept, dropped = _expected(data, limit)
    assert lines == kept
    assert s.dropped == dropped


# --- find_command -----------------------------------------------------------------------------------------


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


BESIDE = Path(sys.executable).parent


def test_a_bare_name_is_found_on_path(tmp_path: Path) -> None:
    tool = _executable(tmp_path / "manifold-test-tool")
    assert find_command("manifold-test-tool", f"/nonexistent{os.pathsep}{tmp_path}") == str(tool)


def test_a_bare_name_found_only_beside_the_interpreter(tmp_path: Path) -> None:
    """`mcp-server-time` is installed in the gateway's venv; PATH does not have the venv's bin."""
    assert (BESIDE / "mcp-server-time").is_file()
    assert find_command("mcp-server-time", str(tmp_path)) == str(BESIDE / "mcp-server-time")
    assert find_command("mcp-server-time", "/usr/bin:/bin") == str(BESIDE / "mcp-server-time")


def test_path_wins_over_beside_the_interpreter(tmp_path: Path) -> None:
    shadow = _executable(tmp_path / "mcp-server-time")
    assert find_command("mcp-server-time", str(tmp_path)) == str(shadow)


def test_a_name_with_a_slash_is_kept(tmp_path: Path) -> None:
    _executable(tmp_path / "tool")
    assert find_command("./tool", str(tmp_path)) == "./tool"
    assert find_command("sub/dir/mcp-server-time", str(tmp_path)) == "sub/dir/mcp-server-time"
    assert find_command("/usr/bin/env", str(tmp_path)) == "/usr/bin/env"
    assert find_command("/no/such/mcp-server-time", str(tmp_path)) == "/no/such/mcp-server-time"


def test_a_name_found_nowhere_is_kept(tmp_path: Path) -> None:
    assert find_command("manifold-no-such-command", str(tmp_path)) == "manifold-no-such-command"


def test_a_file_that_is_not_executable_is_not_taken(tmp_path: Path) -> None:
    (tmp_path / "manifold-plain-file").write_text("not a program\n")
    assert find_command("manifold-plain-file", str(tmp_path)) == "manifold-plain-file"


# --- stderr ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_flood_of_stderr_lines_is_logged_rate_limited_and_what_was_held_back_is_counted() -> None:
    script = "import sys, time\nfor i in range(500): print(i, file=sys.stderr)\nsys.stderr.flush(); time.sleep(0.3)\n"
    script += "print('last', file=sys.stderr); sys.stderr.flush(); time.sleep(30)\n"
    with capture_logs() as logs, anyio.fail_after(20):
        async with stdio_transport("noisy", sys.executable, ["-c", script], {}, None):
            while not any(e.get("line") == "last" for e in logs):
                await anyio.sleep(0.05)
    lines = [e for e in logs if e["event"] == "upstream stderr"]
    held = sum(e["count"] for e in logs if e["event"] == "upstream stderr lines suppressed")
    assert STDERR_BURST <= len(lines) <= STDERR_BURST + 10, len(lines)
    assert len(lines) + held == 501, "every line is logged or counted"
