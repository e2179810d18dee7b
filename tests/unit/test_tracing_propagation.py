"""The W3C trace context travels in NATS message headers: what a publisher puts there, what a receiver
reads back, and the middleware making it current for the handler (never failing on a bad header)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.bus import trace_context
from shared.bus.middleware import Counters, handle
from shared.bus.trace_context import (
    MAX_TRACES_BYTES,
    TRACEPARENT,
    TRACES,
    TRACESTATE,
    carried,
    carried_by,
    headers_for,
    receiving,
)
from shared.contracts.messages import WORK, WorkItem, encode
from shared.telemetry import tracing
from shared.telemetry.tracing import context_of, traceparent


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Spans of the active tracer, kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing.use(provider):
        yield exporter
    provider.shutdown()


def a_span_context(name: str = "queue.order") -> SpanContext:
    span = tracing.tracer().start_span(name)
    span.end()
    return span.get_span_context()


def test_traceparent_is_what_the_w3c_propagator_writes(exported: InMemorySpanExporter) -> None:
    ctx = a_span_context()
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(trace.NonRecordingSpan(ctx)))
    assert traceparent(ctx) == carrier["traceparent"]
    assert traceparent(ctx).startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")


def test_a_traceparent_reads_back_as_a_remote_parent(exported: InMemorySpanExporter) -> None:
    ctx = a_span_context()
    parent = context_of(traceparent(ctx))
    assert parent is not None
    found = trace.get_current_span(parent).get_span_context()
    assert (found.trace_id, found.span_id, found.is_remote) == (ctx.trace_id, ctx.span_id, True)


@pytest.mark.parametrize(
    "value", ["", "00-zz-1-01", "00-00000000000000000000000000000000-0000000000000000-01"]
)
def test_a_malformed_or_empty_traceparent_is_no_context(value: str) -> None:
    assert context_of(value) is None


def test_one_podgroup_gets_both_the_standard_and_the_per_podgroup_header(
    exported: InMemorySpanExporter,
) -> None:
    ctx = a_span_context()
    headers = headers_for({"team/train": ctx})
    assert headers is not None
    assert headers[TRACEPARENT] == traceparent(ctx)
    assert json.loads(headers[TRACES]) == {"team/train": traceparent(ctx)}
    assert TRACESTATE not in headers


def test_several_podgroups_travel_only_in_the_per_podgroup_header(exported: InMemorySpanExporter) -> None:
    a, b = a_span_context(), a_span_context()
    headers = headers_for({"a": a, "b": b})
    assert headers is not None
    assert TRACEPARENT not in headers
    assert json.loads(headers[TRACES]) == {"a": traceparent(a), "b": traceparent(b)}


def test_nothing_traced_means_no_headers() -> None:
    assert headers_for({}) is None
    assert headers_for({"a": trace.INVALID_SPAN_CONTEXT}) is None


def test_the_per_podgroup_header_is_bounded(exported: InMemorySpanExporter) -> None:
    ctx = a_span_context()
    headers = headers_for({f"namespace/podgroup-é{i:05d}": ctx for i in range(5000)})
    assert headers is not None
    assert len(headers[TRACES].encode()) <= MAX_TRACES_BYTES
    kept = json.loads(headers[TRACES])
    assert 0 < len(kept) < 5000
    assert "namespace/podgroup-é00000" in kept  # the first in queue order are the ones kept


def test_a_receiver_finds_each_podgroups_parent(exported: InMemorySpanExporter) -> None:
    a, b = a_span_context(), a_span_context()
    got = carried_by(headers_for({"a": a, "b": b}))
    parent_a = got.parent_of("a")
    assert parent_a is not None
    assert trace.get_current_span(parent_a).get_span_context().span_id == a.span_id
    assert got.parent_of("c") is None
    assert got.context is None


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {TRACES: "{not json"},
        {TRACES: '["a list"]'},
        {TRACEPARENT: "garbage"},
        {"Nats-Msg-Id": "x"},
    ],
)
def test_headers_without_a_usable_context_carry_nothing(headers: dict[str, str] | None) -> None:
    assert not carried_by(headers)


def test_receiving_makes_the_message_context_current(exported: InMemorySpanExporter) -> None:
    ctx = a_span_context()
    with receiving(headers_for({"a": ctx})) as got:
        assert carried() is got
        child = tracing.tracer().start_span("placement.place")
        child.end()
    assert child.parent is not None
    assert (child.parent.trace_id, child.parent.span_id) == (ctx.trace_id, ctx.span_id)
    assert not carried()
    assert not trace.get_current_span().get_span_context().is_valid


def test_receiving_does_nothing_while_tracing_is_off() -> None:
    headers = {TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with receiving(headers) as got:
        assert not got
        assert not trace.get_current_span().get_span_context().is_valid


def _item() -> WorkItem:
    return WorkItem(id="w1", shard="default", term=1, leader="queue-0", now=0.0, state_revision=1)


async def test_the_middleware_runs_the_handler_inside_the_message_trace(
    exported: InMemorySpanExporter,
) -> None:
    ctx = a_span_context()
    msg = Msg(
        _client=None, subject="kairos.work.default", data=encode(_item()), headers=headers_for({"a": ctx})
    )
    seen: list[tuple[int, str | None]] = []

    async def handler(item: WorkItem, _msg: Msg) -> None:
        current = trace.get_current_span().get_span_context()
        seen.append((current.span_id, trace_context.carried().traceparents.get("a")))

    counters = Counters()
    await handle(msg, WORK, handler, counters, jetstream=False)
    assert seen == [(ctx.span_id, traceparent(ctx))]
    assert counters["handled"] == 1
    assert not trace.get_current_span().get_span_context().is_valid


async def test_a_bad_trace_header_never_stops_a_message(exported: InMemorySpanExporter) -> None:
    msg = Msg(
        _client=None,
        subject="kairos.work.default",
        data=encode(_item()),
        headers={TRACEPARENT: "nonsense", TRACES: "]["},
    )
    handled: list[str] = []

    async def handler(item: WorkItem, _msg: Msg) -> None:
        handled.append(item.id)

    await handle(msg, WORK, handler, Counters(), jetstream=False)
    assert handled == ["w1"]
