"""structlog set-up: JSON lines off a terminal, console output on one; secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from functools import lru_cache
from typing import Any

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
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
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
