"""The audit log: one JSON line per tool call and per administrative act, to a file or stdout.

A record is handed over with `AuditLog.call` or `AuditLog.act`, which only put it on a bounded queue: a thread of
the log's own digests the arguments, encodes the line and writes it, so the event loop never waits on a disk or
a pipe. A queue that is full drops the record and counts it (`manifold_audit_dropped_total`); a call never
waits for its audit line.

A line holds what happened, never the payload: the time, who (an API token's name, an OAuth subject, `admin`, a
worker's token name), the endpoint, the server, the tool, the outcome, the duration, a digest of the arguments
(HMAC-SHA256 under `audit.digest_key` when one is set, else SHA-256 of their canonical JSON: equal arguments give
equal digests, and no argument can be read back), and the trace id. Arguments, results, headers and credentials
are never written.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

import orjson

DEFAULT_QUEUE = 10_000
_STOP = object()


@dataclass(frozen=True)
class AuditConfig:
    """The `audit:` block of the config file."""

    enabled: bool = False
    path: str = "-"  # a file (appended to, created 0600), or "-" for stdout
    queue: int = DEFAULT_QUEUE  # records waiting to be written before new ones are dropped
    digest_key: str | None = None  # keys the arguments' digest (HMAC-SHA256); give every replica the same one


def digest(arguments: Any, key: bytes | None) -> str:
    """The arguments' digest: `hmac-sha256:<hex>` under `key`, else `sha256:<hex>`, of their canonical JSON
    (keys sorted), so equal arguments give equal digests."""
    data = orjson.dumps(arguments if arguments is not None else {}, option=orjson.OPT_SORT_KEYS, default=str)
    if key is not None:
        return "hmac-sha256:" + hmac.new(key, data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _utc(at: float) -> str:
    seconds = int(at)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((at - seconds) * 1e6):06d}Z"


class AuditLog:
    """The writer: a bounded queue and a daemon thread that empties it into the stream."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        size: int = DEFAULT_QUEUE,
        digest_key: str | None = None,
        on_drop: Callable[[], None] | None = None,
        close_stream: bool = False,
    ) -> None:
        self._stream = stream
        self._close_stream = close_stream
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._key = digest_key.encode() if digest_key else None
        self._on_drop = on_drop
        self.dropped = 0
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="manifold-audit", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, config: AuditConfig, on_drop: Callable[[], None] | None = None) -> AuditLog:
        """The log `config` describes: stdout for `-`, else the file, appended to (created with mode 0600)."""
        if config.path == "-":
            return cls(sys.stdout.buffer, size=config.queue, digest_key=config.digest_key, on_drop=on_drop)
        fd = os.open(config.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        stream = os.fdopen(fd, "ab", buffering=0)
        return cls(stream, size=config.queue, digest_key=config.digest_key, on_drop=on_drop, close_stream=True)

    # -- handing records over (on the event loop: no I/O, no hashing) ----------------------------------------

    def call(
        self,
        *,
        who: str,
        endpoint: str,
        server: str,
        tool: str,
        outcome: str,
        duration: float | None,
        arguments: Mapping[str, Any] | None,
        trace_id: str | None,
        request_id: Any = None,
        subject: str | None = None,
    ) -> None:
        """One tool call: its arguments are digested on the writer's thread, never written."""
        record = {
            "time": time.time(),
            "kind": "tool_call",
            "who": who,
            "endpoint": endpoint,
            "server": server,
            "tool": tool,
            "outcome": outcome,
            "duration_ms": None if duration is None else round(duration * 1000, 3),
            "trace_id": trace_id,
        }
        if subject is not None:
            record["subject"] = subject
        if request_id is not None:
            record["request_id"] = request_id if isinstance(request_id, int) else str(request_id)[:128]
        self._offer((record, arguments))

    def act(self, action: str, *, who: str = "admin", outcome: str = "ok", **fields: Any) -> None:
        """One administrative act (`server_added`, `server_removed`, `pins_approved`, `reload`, `worker_admitted`,
        `worker_refused`, `handover`, ...) with its plain fields (names, counts, reasons; never a secret)."""
        record = {"time": time.time(), "kind": "admin", "action": action, "who": who, "outcome": outcome, **fields}
        self._offer((record, _NO_ARGUMENTS))

    def _offer(self, item: tuple[dict[str, Any], Any]) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()

    # -- the writer's thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            lines = [self._line(item)]
            while len(lines) < 256:  # whatever else waits goes out in the same write
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    self._write(lines, len(lines))
                    self._queue.task_done()
                    return
                lines.append(self._line(more))
            self._write(lines, len(lines))

    def _line(self, item: tuple[dict[str, Any], Any]) -> bytes:
        record, arguments = item
        record["time"] = _utc(record["time"])
        if arguments is not _NO_ARGUMENTS:  # a call's: None when they were never read (a held or unknown tool)
            record["arguments_digest"] = digest(arguments, self._key) if arguments is not None else None
        return orjson.dumps(record, default=str) + b"\n"

    def _write(self, lines: list[bytes], count: int) -> None:
        try:
            self._stream.write(b"".join(lines))
            self._stream.flush()
            self.written += count
        except (OSError, ValueError):
            self.dropped += count  # a full disk or a closed stream loses these lines, never the gateway
        finally:
            for _ in range(count):
                self._queue.task_done()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait (up to `timeout` seconds) until every record handed over so far is written."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what waits (up to `timeout` seconds) and stop the thread."""
        self.flush(timeout)
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)
        if self._close_stream:
            self._stream.close()


_NO_ARGUMENTS = object()
