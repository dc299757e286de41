"""The audit log: what a line holds, what it never holds, and that a full queue drops (and counts) instead of
making a call wait."""

from __future__ import annotations

import io
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from gateway.observe.audit import AuditConfig, AuditLog, digest

SECRET = "hunter2-very-secret-password"


def _lines(buffer: io.BytesIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_a_call_line_holds_who_what_and_a_digest_never_the_arguments() -> None:
    out = io.BytesIO()
    log = AuditLog(out)
    arguments = {"password": SECRET, "user": "alice"}
    log.call(
        who="ci-bot",
        endpoint="reader",
        server="vault",
        tool="vault__login",
        outcome="ok",
        duration=0.0123,
        arguments=arguments,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        request_id=7,
    )
    log.close()
    (line,) = _lines(out)
    assert line["kind"] == "tool_call" and line["who"] == "ci-bot" and line["endpoint"] == "reader"
    assert line["server"] == "vault" and line["tool"] == "vault__login" and line["outcome"] == "ok"
    assert line["duration_ms"] == 12.3 and line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert line["request_id"] == 7
    assert line["time"].endswith("Z") and "T" in line["time"]
    assert line["arguments_digest"] == digest(arguments, None)
    assert line["arguments_digest"].startswith("sha256:")
    text = out.getvalue().decode()
    assert SECRET not in text and "alice" not in text and "password" not in text


def test_digest_is_canonical_and_keyed_when_a_key_is_given() -> None:
    a, b = {"x": 1, "y": [1, 2]}, {"y": [1, 2], "x": 1}
    assert digest(a, None) == digest(b, None) != digest({"x": 2, "y": [1, 2]}, None)
    keyed = digest(a, b"k" * 32)
    assert keyed.startswith("hmac-sha256:") and keyed != digest(a, b"j" * 32)
    assert digest(None, None) == digest({}, None)
    out = io.BytesIO()
    log = AuditLog(out, digest_key="k" * 32)
    log.call(who="w", endpoint="", server="s", tool="t", outcome="ok", duration=None, arguments=a, trace_id=None)
    log.close()
    assert _lines(out)[0]["arguments_digest"] == keyed


def test_an_act_line() -> None:
    out = io.BytesIO()
    log = AuditLog(out)
    log.act("server_added", server="github", source="admin_api")
    log.act("worker_refused", who="laptop-token", outcome="refused", reason="name_taken")
    log.close()
    first, second = _lines(out)
    assert first["kind"] == "admin" and first["action"] == "server_added" and first["who"] == "admin"
    assert first["server"] == "github" and "arguments_digest" not in first
    assert second["who"] == "laptop-token" and second["outcome"] == "refused" and second["reason"] == "name_taken"


class _Stuck(io.RawIOBase):
    """A stream whose writes wait until released: a disk that stalls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.data = b""

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.release.wait(10)
        self.data += bytes(b)
        return len(b)


def test_a_full_queue_drops_and_counts_and_never_blocks() -> None:
    stream = _Stuck()
    drops: list[int] = []
    log = AuditLog(stream, size=4, on_drop=lambda: drops.append(1))  # type: ignore[arg-type]
    started = time.perf_counter()
    for i in range(200):
        log.call(
            who="w", endpoint="", server="s", tool=f"t{i}", outcome="ok", duration=0.001, arguments={}, trace_id=None
        )
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5  # 200 hand-overs, a stalled writer: nobody waited on it
    assert log.dropped >= 190 and len(drops) == log.dropped
    stream.release.set()
    log.close()
    written = [json.loads(line) for line in stream.data.splitlines()]
    assert 1 <= len(written) <= 10 and len(written) + log.dropped == 200


def test_a_file_is_appended_to_and_private(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for n in range(2):
        log = AuditLog.open(AuditConfig(enabled=True, path=str(path)))
        log.act("reload", servers=n)
        log.close()
    assert [json.loads(x)["servers"] for x in path.read_text().splitlines()] == [0, 1]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_metrics_tell_the_audit_log_of_every_call_and_count_its_drops() -> None:
    from gateway.observe.metrics import Metrics

    metrics = Metrics()
    out = io.BytesIO()
    metrics.audit = AuditLog(out, on_drop=metrics.audit_dropped.inc)
    metrics.add_server("s")
    metrics.record_call("s", "s__t", "ok", 0.5, "ep", "tok", arguments={"a": SECRET}, trace_id=None, subject="u-1")
    metrics.record_call("gone", "gone__t", "held", endpoint="", who="tok")  # a removed server's call: audited too
    metrics.audit.close()
    first, second = _lines(out)
    assert (first["server"], first["subject"], first["endpoint"]) == ("s", "u-1", "ep")
    assert second["server"] == "gone" and second["arguments_digest"] is None
    assert SECRET not in out.getvalue().decode()
    metrics.audit_dropped.inc()
    assert b"manifold_audit_dropped_total 1.0" in metrics.render()[0]
