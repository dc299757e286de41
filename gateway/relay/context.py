"""What a downstream request carries upstream, passed along explicitly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.relay.asks import Caller
from gateway.relay.progress import ProgressRelay


@dataclass(frozen=True, slots=True)
class CallContext:
    """One downstream request as the relay layer sees it.

    `version` is the caller's protocol revision; `caller` who the server's questions and log lines go to
    (None: nobody, e.g. a plain call the shortcut serves); `conversation` the conversation the request
    belongs to (its handed-over servers and `isolation: conversation` connections); `headers` the caller's
    HTTP headers with lower-case names (what `forward_headers` passes on); `endpoint` the view's endpoint
    (a metric label) and `who` the view's name (an API token's, an OAuth rule's); `progress` where the server's
    progress notices go; `subject` an OAuth caller's subject.
    """

    version: str
    request_id: Any = None
    caller: Caller | None = None
    conversation: str | None = None
    headers: Mapping[str, str] | None = None
    endpoint: str = ""
    who: str = ""
    progress: ProgressRelay | None = None
    subject: str | None = None  # an OAuth token's subject (the audit log's), when the caller has one
