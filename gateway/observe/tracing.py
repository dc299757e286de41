"""Traces: OpenTelemetry spans of the gateway's requests, exported over OTLP/HTTP, off unless asked for.

Turned on by the `tracing:` settings block (`enabled: true`) or by the standard variables: an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER=otlp`; turned off,
whatever else says so, by `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` or `enabled: false`. The other
`OTEL_*` variables (service name and resource attributes, sampler and its argument, exporter headers, timeout,
compression, batch sizes and delays) are read as the OpenTelemetry SDK reads them, and win over the block's keys.

When tracing is off, `ACTIVE` is None and nothing of this module runs on a request: the callers check it and
go on (no span, no context, no allocation).

The spans (see the README's Tracing section):

- a SERVER span per downstream request, whose parent is the caller's context: `_meta`'s `traceparent` (with
  `tracestate` and `baggage`, SEP-414) when it holds a valid one, else the HTTP `traceparent` header; when both are
  present and differ, the header's context is added as a link (OpenTelemetry's MCP conventions: the `_meta`
  context is the parent, the transport's is linked);
- a CLIENT span per request sent upstream (one per attempt: a retried call has one per try), a child of the
  gateway's server span; the upstream request carries THIS span's context, in `_meta` and, over HTTP, in the
  `traceparent` header, never the caller's unchanged;
- INTERNAL spans for connections (`connect`), listings, upstream OAuth token requests, held calls and relayed
  questions.

Attributes follow the OpenTelemetry semantic conventions for MCP and GenAI (`mcp.method.name`,
`mcp.protocol.version`, `mcp.session.id`, `jsonrpc.request.id`, `gen_ai.operation.name`, `gen_ai.tool.name`,
`gen_ai.prompt.name`, `mcp.resource.uri`, `error.type`, `rpc.response.status_code`, `network.transport`), plus the
gateway's own under `manifold.` (`server`, `endpoint`, `caller`, `outcome`, `retries`, `attempt`). Never a
request's arguments or a result, and never a header's value but the trace context's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

SCOPE = "manifold"
TRACE_KEYS = ("traceparent", "tracestate", "baggage")
TraceSampler = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]
SAMPLERS = frozenset(get_args(TraceSampler))
DEFAULT_SAMPLER = "parentbased_always_on"
SERVICE_NAME = "manifold"
_EMPTY: Mapping[str, Any] = {}
_TRUE = ("true", "1", "yes", "on")

NO_SPAN: AbstractContextManager[None] = nullcontext()  # reusable: what a hook enters when tracing is off

ACTIVE: Tracing | None = None
"""The process's tracing, or None when it is off: what every hook checks first."""


@dataclass(frozen=True)
class TracingConfig:
    """The `tracing:` block of the config file (every key optional; the OTEL_* variables win)."""

    enabled: bool | None = None  # None: on when an OTLP endpoint or exporter is named in the environment
    endpoint: str | None = None  # base URL of an OTLP/HTTP receiver (`/v1/traces` is added), or the full traces URL
    headers: Mapping[str, str] = field(default_factory=dict)  # sent with each export (credentials go here)
    service_name: str | None = None
    sampler: str | None = None  # one of SAMPLERS
    sampler_arg: float | None = None  # the ratio of the *traceidratio samplers
    timeout: float | None = None  # seconds per export


def wanted(config: TracingConfig, environ: Mapping[str, str]) -> bool:
    """Whether tracing is on for this config and environment."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or config.enabled is False:
        return False
    if config.enabled:
        return True
    if exporter:
        return "otlp" in {e.strip() for e in exporter.split(",")}
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def traces_url(config: TracingConfig, environ: Mapping[str, str]) -> str:
    """Where spans go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` or the
    block's `endpoint` with `/v1/traces` added (unless it ends so already), else the OTLP/HTTP default."""
    if url := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return url
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or config.endpoint or "http://localhost:4318"
    if base.rstrip("/").endswith("/v1/traces"):
        return base
    return base.rstrip("/") + "/v1/traces"


def shown_url(url: str) -> str:
    """`url` fit for a log line: no user info, query or fragment (where credentials may hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def sampler_of(name: str, arg: float | None) -> Any:
    """The SDK sampler called `name` (an OTEL_TRACES_SAMPLER value) with ratio `arg` (default 1.0)."""
    from opentelemetry.sdk.trace import sampling

    ratio = 1.0 if arg is None else arg
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"the sampler's argument must be between 0 and 1, not {ratio}")
    roots = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": sampling.TraceIdRatioBased(ratio),
    }
    if name in roots:
        return roots[name]
    if name.startswith("parentbased_") and name[len("parentbased_") :] in roots:
        return sampling.ParentBased(roots[name[len("parentbased_") :]])
    raise ValueError(f"unknown sampler {name!r}: one of {', '.join(sorted(SAMPLERS))}")


def _resource_service(attributes: str) -> str | None:
    """`service.name` of an OTEL_RESOURCE_ATTRIBUTES value (`key=value,key=value`), if it names one."""
    for pair in attributes.split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "service.name" and value.strip():
            return value.strip()
    return None


def configure(config: TracingConfig, environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Build the process's tracing (and make it `ACTIVE`), or None (and `ACTIVE` None) when it is off."""
    global ACTIVE
    env = os.environ if environ is None else environ
    ACTIVE = Tracing.build(config, env) if wanted(config, env) else None
    return ACTIVE


class Tracing:
    """The gateway's tracer and its exporter. Its own provider, never the global one: the SDK's built-in spans
    (its server middleware's and its client dispatcher's) stay no-ops, so the only spans are the gateway's, with
    the gateway deciding what each upstream request carries."""

    def __init__(self, provider: Any, tracer: Tracer, url: str, sampler: str) -> None:
        self.provider = provider
        self.tracer = tracer
        self.url = url
        self.sampler = sampler

    @classmethod
    def build(cls, config: TracingConfig, environ: Mapping[str, str]) -> Tracing:
        """A provider with a batching OTLP/HTTP exporter (its own thread: exports never run on the event loop)."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from gateway import __version__

        name = (environ.get("OTEL_TRACES_SAMPLER") or config.sampler or DEFAULT_SAMPLER).strip().lower()
        raw_arg = environ.get("OTEL_TRACES_SAMPLER_ARG")
        arg = float(raw_arg) if raw_arg else config.sampler_arg
        sampler = sampler_of(name, arg)
        named = environ.get("OTEL_SERVICE_NAME") or _resource_service(environ.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        service = named or config.service_name or SERVICE_NAME
        # OTEL_RESOURCE_ATTRIBUTES' other attributes are merged in by the SDK
        resource = Resource.create({"service.name": service, "service.version": __version__})
        url = traces_url(config, environ)
        env_headers = environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS")
        headers = None if env_headers or not config.headers else dict(config.headers)
        timeout = None if environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") else config.timeout
        exporter = OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout)
        provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        described = name if arg is None or "ratio" not in name else f"{name}:{arg:g}"
        return cls(provider, provider.get_tracer(SCOPE, __version__), url, described)

    def shutdown(self) -> None:
        """Export what is waiting and stop (bounded by the exporter's timeout)."""
        self.provider.force_flush()
        self.provider.shutdown()

    # -- downstream: the server span -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        *,
        version: str | None,
        session_id: str | None,
        request_id: Any,
        endpoint: str,
        caller: str,
        path: str,
    ) -> AbstractContextManager[Span]:
        """`serving` for a downstream request with its params (`request_attributes`)."""
        target, attributes = request_attributes(
            method,
            params,
            version=version,
            session_id=session_id,
            request_id=request_id,
            endpoint=endpoint,
            caller=caller,
            path=path,
        )
        meta = params.get("_meta") if params else None
        return self.serving(method, target, meta if isinstance(meta, Mapping) else None, headers, attributes)

    @contextmanager
    def serving(
        self,
        method: str,
        target: str | None,
        meta: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        attributes: Mapping[str, Any],
    ) -> Iterator[Span]:
        """A SERVER span for one downstream request, current while the request is served (`parent_of` says
        whose child it is). An exception escaping it marks the span an error with the exception's type only
        (its text may carry the caller's input)."""
        parent, links = parent_of(meta, headers)
        span = self.tracer.start_span(
            f"{method} {target}" if target else method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            links=links,
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        with _current_until_done(span, token):
            yield span

    # -- upstream: the client span and what the request carries -----------------------------------------------

    @contextmanager
    def sending(self, method: str, target: str | None, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """A CLIENT span for one request sent upstream, a child of the current (server) span, current while the
        request is under way (so the SDK's client, which writes the current context into `_meta` itself, writes
        this span's)."""
        span = self.tracer.start_span(
            f"{method} {target}" if target else method, kind=SpanKind.CLIENT, attributes=attributes
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        with _current_until_done(span, token):
            yield span

    def begin(self, name: str, attributes: Mapping[str, Any] = _EMPTY) -> Span:
        """An INTERNAL span that starts a trace of its own and is ended by hand (`end`): a connection's, which ends
        once the server is listed while the connection lives on."""
        return self.tracer.start_span(
            name, context=otel_context.Context(), kind=SpanKind.INTERNAL, attributes=attributes
        )

    @contextmanager
    def internal(self, name: str, attributes: Mapping[str, Any] = _EMPTY, parent: Span | None = None) -> Iterator[Span]:
        """An INTERNAL span (a listing, a token request, a held call, a relayed question), current while it lasts:
        a child of `parent`, else of whatever span is current (a root of its own in a connection's owner task)."""
        context = trace.set_span_in_context(parent) if parent is not None else None
        with self.tracer.start_as_current_span(
            name,
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as e:
                if not span_has_error(span):
                    failed(span, _error_type(e))
                raise


def request_attributes(
    method: str,
    params: Mapping[str, Any] | None,
    *,
    version: str | None,
    session_id: str | None,
    request_id: Any,
    endpoint: str,
    caller: str,
    path: str,
) -> tuple[str | None, dict[str, Any]]:
    """A downstream request's span target (the tool or prompt it names) and attributes (semantic conventions for
    MCP, plus the gateway's endpoint, caller and `path`: `shortcut` or `sdk`). Never an argument's value."""
    attributes: dict[str, Any] = {
        "mcp.method.name": method,
        "network.transport": "tcp",
        "network.protocol.name": "http",
        "manifold.endpoint": endpoint,
        "manifold.caller": caller,
        "manifold.path": path,
    }
    if version:
        attributes["mcp.protocol.version"] = version
    if session_id:
        attributes["mcp.session.id"] = session_id
    if request_id is not None:
        attributes["jsonrpc.request.id"] = str(request_id)
    name = params.get("name") if params else None
    target = name[:128] if isinstance(name, str) and method in ("tools/call", "prompts/get") else None
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
        if target is not None:
            attributes["gen_ai.tool.name"] = target
    elif method == "prompts/get" and target is not None:
        attributes["gen_ai.prompt.name"] = target
    elif params and isinstance(uri := params.get("uri"), str):
        attributes["mcp.resource.uri"] = uri[:1024]
    return target, attributes


def end(span: Span | None, error: BaseException | None = None) -> None:
    """End a span begun by hand (`Tracing.begin`), once: failed with `error`'s type when given."""
    if span is None or not span.is_recording():
        return
    if error is not None:
        failed(span, _error_type(error))
    span.end()


def carry(span: Span, meta: MutableMapping[str, Any]) -> dict[str, str]:
    """Write `span`'s context (and the current baggage) into `meta` in place of any the caller sent, and return
    the same as HTTP headers (`traceparent`, `tracestate`, `baggage`) for an HTTP upstream."""
    for key in TRACE_KEYS:
        meta.pop(key, None)
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    meta.update(carrier)
    return carrier


def parent_of(
    meta: Mapping[str, Any] | None, headers: Mapping[str, str] | None
) -> tuple[otel_context.Context, list[Link] | None]:
    """The caller's context a server span is a child of, and the links it carries.

    `_meta` wins (SEP-414, and OpenTelemetry's MCP conventions: the MCP-level context is the parent, the
    transport's is linked): its `traceparent` (with its `tracestate` and `baggage`) when valid; the HTTP
    `traceparent` header (with `tracestate` and `baggage` headers) when `_meta` holds none or an invalid one. When
    both hold valid contexts that differ, the header's is linked. Neither: a new trace (an empty context, never an
    ambient one the SDK may have set).
    """
    from_meta = _extract(meta)
    from_headers = _extract(headers)
    if from_meta is not None:
        links = None
        if from_headers is not None:
            theirs = trace.get_current_span(from_headers).get_span_context()
            ours = trace.get_current_span(from_meta).get_span_context()
            if (theirs.trace_id, theirs.span_id) != (ours.trace_id, ours.span_id):
                links = [Link(theirs, {"manifold.link": "http.traceparent"})]
        return from_meta, links
    if from_headers is not None:
        return from_headers, None
    return otel_context.Context(), None


def _extract(carrier: Mapping[str, Any] | None) -> otel_context.Context | None:
    if not carrier or not isinstance(carrier.get("traceparent"), str):
        return None
    strings = {k: v for k in TRACE_KEYS if isinstance(v := carrier.get(k), str)}
    try:
        ctx = propagate.extract(strings, context=otel_context.Context())
    except (ValueError, TypeError):
        return None
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def caller_trace_id(meta: Mapping[str, Any] | None, headers: Mapping[str, str] | None) -> str | None:
    """The trace id of the caller's context (`_meta` first, then the header), as 32 hex digits, or None: what the
    audit log records when the gateway does not trace."""
    for carrier in (meta, headers):
        if carrier:
            value = carrier.get("traceparent")
            if isinstance(value, str) and len(value) >= 55 and value[2] == "-" and value[35] == "-":
                trace_id = value[3:35].lower()
                if trace_id != "0" * 32 and all(c in "0123456789abcdef" for c in trace_id):
                    return trace_id
    return None


def current_trace_id() -> str | None:
    """The trace id of the current span, when it is a valid one, as 32 hex digits."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def trace_id_of(meta: Mapping[str, Any] | None, headers: Mapping[str, str] | None) -> str | None:
    """The trace a request belongs to, for the audit log: the gateway's own span's when tracing is on (it shares
    the caller's trace id when the caller sent one), else the caller's (`caller_trace_id`)."""
    if ACTIVE is not None and (own := current_trace_id()) is not None:
        return own
    return caller_trace_id(meta, headers)


def current_span() -> Span:
    """The current span (a non-recording one when there is none)."""
    return trace.get_current_span()


def note_failure(code: int) -> None:
    """Mark the current span failed with a JSON-RPC error `code` (tracing on only)."""
    if ACTIVE is not None:
        span = trace.get_current_span()
        span.set_attribute("rpc.response.status_code", str(code))
        failed(span, str(code))


def failed(span: Span, error_type: str, description: str | None = None) -> None:
    """Mark `span` failed with a low-cardinality `error.type` (a JSON-RPC code, `tool_error`, a failure kind)."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, description))


def span_has_error(span: Span) -> bool:
    status = getattr(span, "status", None)
    return status is not None and status.status_code is StatusCode.ERROR


def _error_type(e: BaseException) -> str:
    code = getattr(getattr(e, "error", None), "code", None)
    if isinstance(code, int):
        return str(code)
    return type(e).__qualname__


@contextmanager
def _current_until_done(span: Span, token: object) -> Iterator[None]:
    """The span stays current (`token` detaches it) until the block ends, and ends with it, failed if it raised."""
    try:
        yield
    except BaseException as e:
        if not span_has_error(span):
            failed(span, _error_type(e))
        raise
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
        span.end()
