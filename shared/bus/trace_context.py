"""W3C trace context in NATS message headers: what a publisher injects and the middleware extracts.

Used by the bus middleware (`shared.bus.middleware.handle` makes a received message's context current for
its handler) and by every service that publishes a traced message (queue: work items; placement:
proposals; binder: public events). Two headers, both optional:

- `traceparent` / `tracestate` (W3C Trace Context): the message's own context, set when the message
  belongs to exactly one trace. Any W3C-aware consumer understands it.
- `kairos-traces`: JSON `{podgroup key: traceparent}`, one entry per traced podgroup the message covers
  (a work item or a proposal covers many podgroups, each with its own trace). Always set when any podgroup
  is traced, also for one podgroup, so that a receiver never has to guess which podgroup a bare
  `traceparent` belongs to (a proposal for one podgroup also evicts other podgroups' pods).

Headers stay out of the msgpack body, so the wire contract does not change and untraced messages cost
nothing. Extraction never raises: a malformed header is ignored (counted as untraced), because a trace is
an aid, never a reason to refuse work.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.telemetry import tracing
from shared.telemetry.tracing import context_of, traceparent

log = logging.getLogger("kairos.bus.tracing")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACES = "kairos-traces"
MAX_TRACES_BYTES = 48 * 1024
"""At most this much `kairos-traces` per message, about 650 podgroups: JetStream refuses a message whose
headers exceed 64 KiB, so a whole-cycle work item with more pending podgroups carries the contexts of the
first ones in queue order and the rest go untraced on that dispatch (`entry_bytes` sizes one)."""
TRACEPARENT_BYTES = 55
"""A version-00 `traceparent` is always this long."""

_PROPAGATOR = TraceContextTextMapPropagator()


def entry_bytes(podgroup: str) -> int:
    """What one podgroup's entry adds to `kairos-traces` (`"key":"traceparent",`)."""
    return len(json.dumps(podgroup)) + TRACEPARENT_BYTES + 4


def headers_for(contexts: Mapping[str, SpanContext]) -> dict[str, str] | None:
    """Headers carrying each podgroup's span context (`kairos-traces`), plus `traceparent`/`tracestate`
    when there is exactly one; None when nothing is traced."""
    entries: dict[str, str] = {}
    first: SpanContext | None = None
    size = 2
    for podgroup, ctx in contexts.items():
        if not ctx.is_valid:
            continue
        value = traceparent(ctx)
        size += entry_bytes(podgroup)
        if size > MAX_TRACES_BYTES:
            break
        entries[podgroup] = value
        first = first or ctx
    if first is None:
        return None
    headers = {TRACES: json.dumps(entries, separators=(",", ":"))}
    if len(entries) == 1:
        headers[TRACEPARENT] = entries[next(iter(entries))]
        state = first.trace_state.to_header() if first.trace_state else ""
        if state:
            headers[TRACESTATE] = state
    return headers


@dataclass
class Carried:
    """The trace context a received message carries: its own (`context`) and per podgroup."""

    context: Context | None = None
    traceparents: Mapping[str, str] = field(default_factory=dict)
    """Podgroup key -> traceparent, as sent; parsed on demand (a whole-cycle item may name hundreds)."""

    def parent_of(self, podgroup: str) -> Context | None:
        """The context a span about `podgroup` continues, or None when the message did not trace it."""
        return context_of(self.traceparents.get(podgroup, ""))

    def __bool__(self) -> bool:
        return self.context is not None or bool(self.traceparents)


NOTHING = Carried()
_carried: contextvars.ContextVar[Carried] = contextvars.ContextVar("kairos_carried", default=NOTHING)


def carried_by(headers: Mapping[str, str] | None) -> Carried:
    """What `headers` carry (never raises: malformed parts are left out)."""
    if not headers:
        return NOTHING
    context = context_of(headers.get(TRACEPARENT, ""))
    if context is not None and headers.get(TRACESTATE):
        context = _PROPAGATOR.extract({TRACEPARENT: headers[TRACEPARENT], TRACESTATE: headers[TRACESTATE]})
    traceparents: dict[str, str] = {}
    raw = headers.get(TRACES)
    if raw:
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            traceparents = {k: v for k, v in decoded.items() if isinstance(k, str) and isinstance(v, str)}
        else:
            log.debug("ignored a malformed %s header", TRACES)
    return Carried(context, traceparents)


def carried() -> Carried:
    """What the message being handled carries (set by the middleware around the handler)."""
    return _carried.get()


def receiving(headers: Mapping[str, str] | None) -> contextlib.AbstractContextManager[Carried]:
    """Around a handler: make the message's trace context current (spans the handler starts become its
    children) and `carried()` return what it carries. A shared no-op while tracing is off or the message
    carries no context, so an untraced message costs one check."""
    if not headers or not tracing.enabled():
        return _UNTRACED
    found = carried_by(headers)
    if not found:
        return _UNTRACED
    return _attached(found)


_UNTRACED = contextlib.nullcontext(NOTHING)


@contextlib.contextmanager
def _attached(found: Carried) -> Iterator[Carried]:
    token = _carried.set(found)
    attached = otel_context.attach(found.context) if found.context is not None else None
    try:
        yield found
    finally:
        if attached is not None:
            otel_context.detach(attached)
        _carried.reset(token)
