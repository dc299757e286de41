"""structlog set-up: JSON lines off a terminal, console output on one; secrets redacted."""

from __future__ import annotations

import asyncio
import atexit
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import MutableMapping
from functools import lru_cache
from typing import Any, TextIO

import orjson
import structlog

_SECRET_KEYS = re.compile(r"(authorization|token|secret|password|api[_-]?key|cookie|headers|env)$", re.I)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
REDACTED = "[redacted]"


def redact_text(text: str) -> str:
    """Text with credentials after `Bearer`/`Basic` replaced."""
    lowered = text.lower()
    if "bearer" not in lowered and "basic" not in lowered:
        return text  # the pattern needs one of them: most lines are spared the regex
    return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)


def traceback_text(exc: BaseException) -> str:
    """`exc`'s traceback as text, credentials after `Bearer`/`Basic` replaced (it goes into a log line's field,
    where the redaction of event values does not reach a formatted exception)."""
    return redact_text("".join(traceback.format_exception(exc)))[-8000:]


@lru_cache(maxsize=1024)
def _secret_key(key: str) -> bool:
    return _SECRET_KEYS.search(key) is not None


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if value is not None and _secret_key(key):
            event[key] = REDACTED
        elif isinstance(value, str):
            event[key] = redact_text(value)
    return event


def _dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


class _Clock:
    """ISO 8601 UTC timestamps with microseconds; the date and time of day are formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, _: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        event["timestamp"] = f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"
        return event


class LineWriter:
    """structlog's output: rendered lines to a text stream. Lines logged on the event loop wait for the end of
    the loop's turn and go out together in one write (a write per line cost a call's log line half its price);
    warnings and errors, and lines from other threads, are written at once, after whatever waits."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._waiting: list[str] = []
        self._turn: asyncio.AbstractEventLoop | None = None  # the loop whose turn ends with a flush
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        """Write a line at the end of the loop's turn, or now off the loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.now(message)
            return
        with self._lock:
            self._waiting.append(message)
            if self._turn is loop:
                return
            self._turn = loop
        loop.call_soon(self.flush)

    def now(self, message: str) -> None:
        """Write a line at once, after the lines waiting."""
        with self._lock:
            self._waiting.append(message)
            self._write()

    def flush(self) -> None:
        """Write the lines waiting."""
        with self._lock:
            self._turn = None
            self._write()

    def _write(self) -> None:
        if self._waiting:
            lines = "\n".join(self._waiting) + "\n"
            self._waiting.clear()
            try:
                self._stream.write(lines)
                self._stream.flush()
            except (OSError, ValueError):
                pass  # a closed or broken stream: the lines have nowhere to go

    debug = info = msg
    warning = warn = error = err = critical = exception = fatal = now


_writer: LineWriter | None = None  # the writer `configure` set up last


class _Handler(logging.Handler):
    """The stdlib's records (uvicorn's, the SDK's) through the same writer, in order with structlog's lines."""

    def __init__(self, writer: LineWriter) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.now(self.format(record))
        except Exception:
            self.handleError(record)


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Set up structlog and the stdlib root logger for `level` and `fmt` (`auto`, `json`, `console`)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = logging.getLevelNamesMapping()[level.upper()]
    global _writer
    if _writer is not None:  # configured again: the old writer's lines go out now, and exit waits for the new one's
        _writer.flush()
        atexit.unregister(_writer.flush)
    writer = _writer = LineWriter(sys.stderr)
    atexit.register(writer.flush)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _Clock(),
        _redact,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: writer,
        cache_logger_on_first_use=True,
    )
    handler = _Handler(writer)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING) if numeric < logging.WARNING else numeric)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def get_logger(name: str) -> Any:
    """A structlog logger bound to a component name."""
    return structlog.get_logger(component=name)
