"""Tracing's pure parts: when it is on, where spans go, whose child a server span is (SEP-414's `_meta` over the
HTTP header), and that an upstream request carries the gateway's client span, not the caller's context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.observe import tracing
from gateway.observe.tracing import Tracing, TracingConfig, carry, parent_of, traces_url, wanted

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
OTHER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER = f"00-{OTHER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def traced() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Tracing(provider, provider.get_tracer("manifold"), "http://x/v1/traces", "always_on"), exporter
    provider.shutdown()


def test_off_unless_asked() -> None:
    assert not wanted(TracingConfig(), {})
    assert wanted(TracingConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert wanted(TracingConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert wanted(TracingConfig(), {"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted(TracingConfig(), {"OTEL_TRACES_EXPORTER": "console"})
    assert wanted(TracingConfig(enabled=True), {})
    # off wins, whoever says it
    assert not wanted(TracingConfig(enabled=True), {"OTEL_SDK_DISABLED": "true"})
    assert not wanted(TracingConfig(enabled=True), {"OTEL_TRACES_EXPORTER": "none"})
    assert not wanted(TracingConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


def test_configure_off_leaves_nothing_active() -> None:
    assert tracing.configure(TracingConfig(), {}) is None
    assert tracing.ACTIVE is None


def test_where_spans_go() -> None:
    assert traces_url(TracingConfig(), {}) == "http://localhost:4318/v1/traces"
    assert traces_url(TracingConfig(endpoint="http://c:4318/"), {}) == "http://c:4318/v1/traces"
    assert traces_url(TracingConfig(endpoint="http://c/x/v1/traces"), {}) == "http://c/x/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318"}
    assert traces_url(TracingConfig(endpoint="http://c:4318"), env) == "http://e:4318/v1/traces"
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://t:1/traces"
    assert traces_url(TracingConfig(), env) == "http://t:1/traces"
    assert tracing.shown_url("https://user:pw@c:4318/v1/traces?key=s3cret") == "https://c:4318/v1/traces"


def test_samplers() -> None:
    assert tracing.sampler_of("parentbased_traceidratio", 0.01).get_description().startswith("ParentBased")
    assert tracing.sampler_of("always_off", None).get_description() == "AlwaysOffSampler"
    with pytest.raises(ValueError, match="unknown sampler"):
        tracing.sampler_of("sometimes", None)
    with pytest.raises(ValueError, match="between 0 and 1"):
        tracing.sampler_of("traceidratio", 2.0)


def test_build_reads_the_environment() -> None:
    env = {"OTEL_SERVICE_NAME": "gw-a", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    built = Tracing.build(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9", service_name="ignored"), env)
    try:
        assert built.sampler == "traceidratio:0.25"
        assert built.url == "http://127.0.0.1:9/v1/traces"
        assert built.provider.resource.attributes["service.name"] == "gw-a"
    finally:
        built.provider.shutdown()
    built = Tracing.build(TracingConfig(enabled=True, service_name="gw-b"), {})
    try:
        assert built.provider.resource.attributes["service.name"] == "gw-b"
        assert built.sampler == "parentbased_always_on"
    finally:
        built.provider.shutdown()


def _ids(ctx: otel_context.Context) -> tuple[str, str]:
    sc = trace.get_current_span(ctx).get_span_context()
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")


def test_meta_wins_over_the_header_which_is_linked() -> None:
    parent, links = parent_of({"traceparent": CALLER}, {"traceparent": OTHER})
    assert _ids(parent) == (CALLER_TRACE, CALLER_SPAN)
    assert links is not None and len(links) == 1
    assert format(links[0].context.trace_id, "032x") == OTHER_TRACE


def test_same_context_in_both_places_is_not_linked() -> None:
    parent, links = parent_of({"traceparent": CALLER}, {"traceparent": CALLER})
    assert _ids(parent) == (CALLER_TRACE, CALLER_SPAN) and links is None


def test_header_when_meta_has_none_or_a_bad_one() -> None:
    for meta in (None, {}, {"traceparent": "garbage"}, {"traceparent": 12}, {"other": "x"}):
        parent, links = parent_of(meta, {"traceparent": OTHER})
        assert _ids(parent)[0] == OTHER_TRACE and links is None


def test_neither_starts_a_new_trace() -> None:
    parent, links = parent_of(None, {"accept": "*/*"})
    assert not trace.get_current_span(parent).get_span_context().is_valid and links is None


def test_caller_trace_id() -> None:
    assert tracing.caller_trace_id({"traceparent": CALLER}, None) == CALLER_TRACE
    assert tracing.caller_trace_id({}, {"traceparent": OTHER}) == OTHER_TRACE
    assert tracing.caller_trace_id({"traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"}, None) is None
    assert tracing.caller_trace_id({"traceparent": "nonsense"}, None) is None


def test_client_span_is_a_child_of_the_server_span_and_is_what_goes_upstream(
    traced: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracer, exporter = traced
    meta = {"traceparent": CALLER, "tracestate": "congo=t61", "baggage": "tenant=blue", "k": "v"}
    with tracer.serving("tools/call", "a__seen", meta, None, {"mcp.method.name": "tools/call"}) as server:
        assert baggage.get_baggage("tenant") == "blue"
        with tracer.sending("tools/call", "seen", {"manifold.attempt": 1}) as client:
            upstream_meta = {k: v for k, v in meta.items()}
            headers = carry(client, upstream_meta)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    s, c = spans["tools/call a__seen"], spans["tools/call seen"]
    assert s.kind is SpanKind.SERVER and c.kind is SpanKind.CLIENT
    assert format(s.context.trace_id, "032x") == CALLER_TRACE
    assert s.parent is not None and format(s.parent.span_id, "016x") == CALLER_SPAN
    assert c.parent is not None and c.parent.span_id == s.context.span_id
    assert server.get_span_context().span_id == s.context.span_id
    # the upstream gets the client span's context, not the caller's; the rest of `_meta` is kept
    client_id = format(c.context.span_id, "016x")
    assert upstream_meta["traceparent"] == f"00-{CALLER_TRACE}-{client_id}-01"
    assert headers["traceparent"] == upstream_meta["traceparent"]
    assert upstream_meta["k"] == "v" and "tenant=blue" in upstream_meta["baggage"]
    assert upstream_meta["traceparent"] != CALLER
    assert client.get_span_context().span_id == c.context.span_id


def test_an_escaping_error_marks_the_span_with_its_type_only(traced: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracer, exporter = traced
    with pytest.raises(RuntimeError), tracer.serving("tools/list", None, None, None, {}):
        raise RuntimeError("the caller's secret text")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "RuntimeError"
    assert "secret" not in str(span.status.description) and not span.events


def test_internal_spans_nest(traced: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracer, exporter = traced
    with tracer.internal("connect", {"manifold.server": "a"}), tracer.internal("tools/list", {}):
        pass
    inner, outer = exporter.get_finished_spans()
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id
    assert outer.parent is None


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_token_request_has_a_span_without_secrets(
    traced: tuple[Tracing, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    from gateway.protocol.errors import NoToken
    from tests.unit.test_tokens import Endpoint, params

    tracer, exporter = traced
    monkeypatch.setattr(tracing, "ACTIVE", tracer)
    assert await Endpoint().tokens().source(params()).token() == "at-1"
    with pytest.raises(NoToken):
        await Endpoint([(400, {"error": "invalid_client"})]).tokens().source(params(credential="other")).token()
    ok, refused = exporter.get_finished_spans()
    assert ok.name == refused.name == "oauth.token"
    assert dict(ok.attributes or {}) == {"manifold.credential": "svc", "manifold.grant": "client_credentials"}
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.attributes is not None and refused.attributes["error.type"] == "NoToken"
    for span in (ok, refused):
        assert "s3cret" not in span.to_json() and "at-1" not in span.to_json()
