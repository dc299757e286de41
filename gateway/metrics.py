"""Every Prometheus metric of the gateway, defined in one place."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gateway import __version__

CALL_OUTCOMES = ("ok", "tool_error", "unavailable", "timeout", "busy", "denied", "invalid", "cancelled")
KNOWN_METHODS = frozenset(
    {
        "initialize",
        "notifications/initialized",
        "notifications/cancelled",
        "ping",
        "server/discover",
        "subscriptions/listen",
        "tools/list",
        "tools/call",
    }
)


class Metrics:
    """The gateway's metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.upstream_up = Gauge(
            "manifold_upstream_up", "1 when the server is connected and listed, else 0", ["server"], registry=r
        )
        self.upstream_tools = Gauge(
            "manifold_upstream_tools", "Tools the server offers after filters (0 while down)", ["server"], registry=r
        )
        self.upstream_connects = Counter(
            "manifold_upstream_connects",
            "Connection attempts by outcome (ok, error)",
            ["server", "outcome"],
            registry=r,
        )
        self.tools_changes = Counter(
            "manifold_tools_changes", "Times a server's offered tools changed", ["server"], registry=r
        )
        self.catalog_tools = Gauge("manifold_catalog_tools", "Tools in the merged catalog", registry=r)
        self.tool_calls = Counter(
            "manifold_tool_calls",
            "Tool calls by server, public tool name and outcome",
            ["server", "tool", "outcome"],
            registry=r,
        )
        self.call_duration = Histogram(
            "manifold_tool_call_duration_seconds",
            "Time from a tool call's arrival to its result",
            ["server"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.call_retries = Counter("manifold_tool_call_retries", "Retried tool-call attempts", ["server"], registry=r)
        self.downstream_sessions = Gauge("manifold_downstream_sessions", "Open 2025-era sessions", registry=r)
        self.downstream_requests = Counter(
            "manifold_downstream_requests",
            "JSON-RPC requests and notifications received, by method",
            ["method"],
            registry=r,
        )
        self.build_info = Gauge("manifold_build_info", "Always 1; the version is a label", ["version"], registry=r)
        self.build_info.labels(__version__).set(1)
        self._children: dict[tuple[str, ...], Any] = {}  # labelled series, looked up once each

    def add_server(self, server: str) -> None:
        """Create a server's series at zero so they exist before its first event."""
        self.upstream_up.labels(server).set(0)
        self.upstream_tools.labels(server).set(0)
        for outcome in ("ok", "error"):
            self.upstream_connects.labels(server, outcome)
        self.tools_changes.labels(server)
        self.call_retries.labels(server)

    def count_request(self, method: str) -> None:
        """Count one downstream message; unknown methods share the label `other`."""
        label = method if method in KNOWN_METHODS else "other"
        self._child(self.downstream_requests, "requests", label).inc()

    def record_call(self, server: str, tool: str, outcome: str, seconds: float | None = None) -> None:
        """Count one tool call by outcome, and time it when `seconds` is given."""
        self._child(self.tool_calls, "calls", server, tool, outcome).inc()
        if seconds is not None:
            self._child(self.call_duration, "duration", server).observe(seconds)

    def _child(self, metric: Any, kind: str, *labels: str) -> Any:
        key = (kind, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
