"""Every Prometheus metric of the gateway, defined in one place."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gateway import __version__

if TYPE_CHECKING:
    from gateway.observe.audit import AuditLog

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
        self.listing_failures = Counter(
            "manifold_upstream_listing_failures",
            "Listings (tools, prompts, resources, resourceTemplates) a connected server failed to give; the server "
            "serves on without them",
            ["server", "listing"],
            registry=r,
        )
        self.upstream_degraded = Gauge(
            "manifold_upstream_degraded",
            "1 for each listing the server is serving without because it failed, by listing",
            ["server", "listing"],
            registry=r,
        )
        self.conversation_instances = Gauge(
            "manifold_conversation_instances",
            "Open per-conversation connections of a server with isolation: conversation",
            ["server"],
            registry=r,
        )
        self.instance_starts = Counter(
            "manifold_conversation_instance_starts", "Per-conversation connections started", ["server"], registry=r
        )
        self.instance_stops = Counter(
            "manifold_conversation_instance_stops",
            "Per-conversation connections stopped, by reason (idle, session_end, failed, server_gone, shutdown)",
            ["server", "reason"],
            registry=r,
        )
        self.tools_changes = Counter(
            "manifold_tools_changes", "Times a server's offered tools changed", ["server"], registry=r
        )
        self.sandbox_limit_hits = Counter(
            "manifold_sandbox_limit_hits",
            "Limits a sandboxed server hit, by limit (cpu_time, file_size: the server was killed; processes: a fork "
            "was refused)",
            ["server", "limit"],
            registry=r,
        )
        self.tools_held = Gauge(
            "manifold_tools_held",
            "Tools held back from listings and calls because their definition does not match its pin",
            ["server"],
            registry=r,
        )
        self.pin_mismatches = Counter(
            "manifold_pin_mismatches",
            "Tool definitions seen that differ from their pin (or have none), by the server's pin mode",
            ["server", "mode"],
            registry=r,
        )
        self.catalog_tools = Gauge("manifold_catalog_tools", "Tools in the merged catalog", registry=r)
        self.tool_calls = Counter(
            "manifold_tool_calls",
            'Tool calls by server, public tool name, outcome and endpoint ("" for /mcp)',
            ["server", "tool", "outcome", "endpoint"],
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
        self.store_bad_rows = Gauge(
            "manifold_store_bad_rows",
            "1 for each row of the runtime-server store that cannot be read back (skipped), by its name",
            ["server"],
            registry=r,
        )
        self.oauth_tokens = Counter(
            "manifold_oauth_tokens",
            "OAuth access tokens checked, by outcome (accepted, expired, audience, issuer, signature, unknown_key, "
            "algorithm, type, claims, malformed, too_long, not_yet_valid, scope, no_rule, no_keys)",
            ["outcome"],
            registry=r,
        )
        self.oauth_key_fetches = Counter(
            "manifold_oauth_key_fetches",
            "Fetches of the authorization server's signing keys (JWKS), by outcome (ok, error)",
            ["outcome"],
            registry=r,
        )
        self.upstream_token_requests = Counter(
            "manifold_upstream_token_requests",
            "Requests to a token endpoint for upstream access tokens, by credential, grant and outcome (ok, refused, "
            "error)",
            ["credential", "grant", "outcome"],
            registry=r,
        )
        self.upstream_token_refusals = Counter(
            "manifold_upstream_token_refusals",
            "Upstream requests answered 401 (the access token was refused; it is renewed and the request sent once "
            "more)",
            ["credential"],
            registry=r,
        )
        self.workers_connected = Gauge(
            "manifold_workers_connected", "Workers connected and offering a name", ["name"], registry=r
        )
        self.worker_calls = Counter(
            "manifold_worker_calls",
            "Tool calls sent to workers, by the name offered and the name of the worker's token",
            ["name", "token"],
            registry=r,
        )
        self.worker_disconnects = Counter(
            "manifold_worker_disconnects",
            "Worker connections that ended after they were admitted, by name and reason",
            ["name", "reason"],
            registry=r,
        )
        self.worker_refusals = Counter(
            "manifold_worker_refusals",
            "Worker connections refused before their tools were admitted, by reason",
            ["reason"],
            registry=r,
        )
        self.http_refusals = Counter(
            "manifold_http_refusals",
            "Connections and requests refused by the HTTP limits, by reason (header_too_large, header_timeout, "
            "body_timeout, connections)",
            ["reason"],
            registry=r,
        )
        self.internal_errors = Counter(
            "manifold_internal_errors",
            "Programming errors caught where a connection is served (its traceback is logged), by where (upstream, "
            "worker)",
            ["where"],
            registry=r,
        )
        self.audit_dropped = Counter(
            "manifold_audit_dropped",
            "Audit log records dropped because the writer's queue was full (a call never waits for its audit line)",
            registry=r,
        )
        self.build_info = Gauge("manifold_build_info", "Always 1; the version is a label", ["version"], registry=r)
        self.build_info.labels(__version__).set(1)
        for where in ("upstream", "worker"):
            self.internal_errors.labels(where)
        for reason in ("header_too_large", "header_timeout", "body_timeout", "connections"):
            self.http_refusals.labels(reason)
        self._children: dict[tuple[str, ...], Any] = {}  # labelled series, looked up once each
        # Told of each tool call recorded (server, tool, outcome, seconds or None, who); must return at once.
        self.on_call: Callable[[str, str, str, float | None, str], None] | None = None
        # The audit log, when one is kept (`audit:`): told of each tool call recorded, and of administrative acts.
        self.audit: AuditLog | None = None
        self._servers: set[str] = set()
        self._degraded: set[tuple[str, str]] = set()
        # Every metric with a `server` label, and its label names in order.
        self._per_server: tuple[tuple[Any, tuple[str, ...]], ...] = (
            (self.upstream_up, ("server",)),
            (self.upstream_tools, ("server",)),
            (self.upstream_connects, ("server", "outcome")),
            (self.listing_failures, ("server", "listing")),
            (self.upstream_degraded, ("server", "listing")),
            (self.tools_changes, ("server",)),
            (self.tools_held, ("server",)),
            (self.pin_mismatches, ("server", "mode")),
            (self.conversation_instances, ("server",)),
            (self.instance_starts, ("server",)),
            (self.instance_stops, ("server", "reason")),
            (self.tool_calls, ("server", "tool", "outcome", "endpoint")),
            (self.call_duration, ("server",)),
            (self.call_retries, ("server",)),
            (self.sandbox_limit_hits, ("server", "limit")),
        )

    def add_server(self, server: str) -> None:
        """Create a server's series at zero so they exist before its first event."""
        self._servers.add(server)
        self.upstream_up.labels(server).set(0)
        self.upstream_tools.labels(server).set(0)
        for outcome in ("ok", "error"):
            self.upstream_connects.labels(server, outcome)
        self.tools_changes.labels(server)
        self.call_retries.labels(server)
        self.tools_held.labels(server).set(0)

    def remove_server(self, server: str) -> None:
        """Drop every series labelled with `server`: a removed server leaves nothing behind in `/metrics`."""
        self._servers.discard(server)
        self._degraded = {k for k in self._degraded if k[0] != server}
        for metric, names in self._per_server:
            _remove_series(metric, names, "server", server)
        for key in [k for k in self._children if k[0] in ("calls", "duration") and k[1] == server]:
            del self._children[key]

    def set_bad_rows(self, names: Iterable[str]) -> None:
        """Report exactly these store rows as unreadable."""
        self.store_bad_rows.clear()
        for name in names:
            self.store_bad_rows.labels(name).set(1)

    def count_request(self, method: str) -> None:
        """Count one downstream message; unknown methods share the label `other`."""
        label = method if method in KNOWN_METHODS else "other"
        self._child(self.downstream_requests, "requests", label).inc()

    def record_call(
        self,
        server: str,
        tool: str,
        outcome: str,
        seconds: float | None = None,
        endpoint: str = "",
        who: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        trace_id: str | None = None,
        request_id: Any = None,
        subject: str | None = None,
    ) -> None:
        """Count one tool call by outcome and endpoint, and time it when `seconds` is given (not for a removed
        server, whose series are gone: a call that ends after its server was removed must not bring them back);
        `who` (the caller's view) is told to `on_call` only, never a label. The audit log (when kept) gets the call
        whatever its server's fate, with a digest of `arguments` (never them), its trace id and the OAuth
        `subject` when there is one."""
        if self.audit is not None:
            self.audit.call(
                who=who,
                endpoint=endpoint,
                server=server,
                tool=tool,
                outcome=outcome,
                duration=seconds,
                arguments=arguments,
                trace_id=trace_id,
                request_id=request_id,
                subject=subject,
            )
        if server not in self._servers:
            return
        self._child(self.tool_calls, "calls", server, tool, outcome, endpoint).inc()
        if seconds is not None:
            self._child(self.call_duration, "duration", server).observe(seconds)
        if self.on_call is not None:
            self.on_call(server, tool, outcome, seconds, who)

    def count_retry(self, server: str) -> None:
        """Count one retried call attempt (not for a removed server)."""
        if server in self._servers:
            self.call_retries.labels(server).inc()

    def set_held(self, server: str, count: int) -> None:
        """Set how many of a server's tools are held by their pins (not for a removed server)."""
        if server in self._servers:
            self.tools_held.labels(server).set(count)

    def count_pin_mismatch(self, server: str, mode: str) -> None:
        """Count one tool definition seen unlike its pin (not for a removed server)."""
        if server in self._servers:
            self.pin_mismatches.labels(server, mode).inc()

    def set_instances(self, server: str, count: int) -> None:
        """Set a server's number of open per-conversation connections (not for a removed server)."""
        if server in self._servers:
            self.conversation_instances.labels(server).set(count)

    def count_instance_start(self, server: str) -> None:
        """Count one per-conversation connection started (not for a removed server)."""
        if server in self._servers:
            self.instance_starts.labels(server).inc()

    def count_instance_stop(self, server: str, reason: str) -> None:
        """Count one per-conversation connection stopped, by reason (not for a removed server)."""
        if server in self._servers:
            self.instance_stops.labels(server, reason).inc()

    # Worker series are labelled `name` and outlive the name's pool (which leaves when its last worker does),
    # so a name whose workers come and go keeps one history, until the name is forgotten (`forget_worker`).
    def set_workers(self, name: str, count: int) -> None:
        """Set how many workers are connected and admitted for `name`."""
        self.workers_connected.labels(name).set(count)

    def forget_worker(self, name: str) -> None:
        """Drop every worker series of `name` (see `gateway/upstream/departures.py`)."""
        workers = ((self.workers_connected, ("name",)), (self.worker_calls, ("name", "token")))
        for metric, names in (*workers, (self.worker_disconnects, ("name", "reason"))):
            _remove_series(metric, names, "name", name)
        for key in [k for k in self._children if k[0] == "worker_calls" and k[1] == name]:
            del self._children[key]

    def count_worker_call(self, name: str, token: str) -> None:
        """Count one call sent to a worker of `name` that dialled in with the token named `token`."""
        self._child(self.worker_calls, "worker_calls", name, token).inc()

    def count_worker_disconnect(self, name: str, reason: str) -> None:
        """Count one admitted worker connection that ended, by reason."""
        self.worker_disconnects.labels(name, reason).inc()

    def count_worker_refusal(self, reason: str) -> None:
        """Count one worker connection refused (no name label: a refused name is the caller's text)."""
        self.worker_refusals.labels(reason).inc()

    def set_listings(self, server: str, failed: Iterable[str]) -> None:
        """Count each listing that just failed, and report exactly these as the ones the server serves without."""
        if server not in self._servers:
            return
        failed = set(failed)
        for listing in failed:
            self.listing_failures.labels(server, listing).inc()
        for listing in ("tools", "prompts", "resources", "resourceTemplates"):
            if listing in failed or (server, listing) in self._degraded:
                self.upstream_degraded.labels(server, listing).set(1 if listing in failed else 0)
        self._degraded = {k for k in self._degraded if k[0] != server} | {(server, x) for x in failed}

    def count_connect(self, server: str, outcome: str) -> None:
        """Count one connection attempt by outcome, `ok` or `error` (not for a removed server)."""
        if server in self._servers:
            self.upstream_connects.labels(server, outcome).inc()

    def count_sandbox_limit(self, server: str, limit: str) -> None:
        """Count one limit a sandboxed server hit (not for a removed server)."""
        if server in self._servers:
            self.sandbox_limit_hits.labels(server, limit).inc()

    def count_http_refusal(self, reason: str) -> None:
        """Count one connection or request refused by the HTTP limits, by reason."""
        self._child(self.http_refusals, "http", reason).inc()

    def count_internal_error(self, where: str) -> None:
        """Count one programming error caught (`upstream`, `worker`)."""
        self.internal_errors.labels(where).inc()

    def count_oauth_token(self, outcome: str) -> None:
        """Count one OAuth access token checked, by outcome."""
        self._child(self.oauth_tokens, "oauth", outcome).inc()

    def count_key_fetch(self, outcome: str) -> None:
        """Count one fetch of the authorization server's keys, by outcome."""
        self._child(self.oauth_key_fetches, "keys", outcome).inc()

    def count_token_request(self, credential: str, grant: str, outcome: str) -> None:
        """Count one request to a token endpoint for an upstream access token, by outcome."""
        self._child(self.upstream_token_requests, "token", credential, grant, outcome).inc()

    def count_token_refusal(self, credential: str) -> None:
        """Count one upstream request answered 401."""
        self._child(self.upstream_token_refusals, "refusal", credential).inc()

    def _child(self, metric: Any, kind: str, *labels: str) -> Any:
        key = (kind, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _remove_series(metric: Any, names: tuple[str, ...], label: str, value: str) -> None:
    """Remove every series of `metric` (labelled `names`) whose `label` is `value`."""
    labelsets = {
        tuple(sample.labels[n] for n in names)
        for family in metric.collect()
        for sample in family.samples
        if sample.labels.get(label) == value
    }
    for labels in labelsets:
        metric.remove(*labels)
