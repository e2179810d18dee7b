"""The spans of one podgroup's scheduling attempt, service by service, and their attribute names.

Called by the service shells, each only while tracing is on (`tracing.enabled()`):

- state: `attempts.AttemptTracker` opens the trace (`state.observe`); the write-back continues it
  (`traced_handler(STATE_WRITEBACK, ...)` around its event handler);
- queue: `OrderTracer.cycle(...).order(item, podgroups)` -> `queue.order` per podgroup, and the headers of
  the work item;
- placement: `place_details` (in the worker's thread, from the core's result) and `placement_spans`
  -> `placement.session` and `placement.place` per podgroup, and the headers of the proposal;
  `ActionTimes` is the core's `around_action` hook that times each action;
- binder: `CommitTrace` around one proposal -> `binder.commit` per podgroup, `TracedCluster` around the
  cluster client -> `binder.bind` / `binder.evict` per call, `event_headers` for the public events.

docs/tracing.md lists every span and attribute. Spans are built after the fact where the work is one
call (a placement session is one call of the core, in a thread): start and end times are then given
explicitly, so the timeline in a tracing UI is still true.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode

from shared.bus.trace_context import MAX_TRACES_BYTES, Carried, carried, entry_bytes, headers_for
from shared.contracts.events import Event, PodBound, PodEvicted, PodGroupState, QueueFairShare
from shared.contracts.messages import (
    Binding,
    EvictionOrder,
    Outcome,
    PodGroupRecord,
    Proposal,
    StateRecord,
    WorkItem,
)
from shared.contracts.subjects import podgroup_key
from shared.core.result import CycleResult, NodeRefusals
from shared.model import PodGroup, Snapshot
from shared.telemetry import tracing
from shared.telemetry.tracing import context_of

T = TypeVar("T")

# --- span names ------------------------------------------------------------------------------------------
STATE_OBSERVE = "state.observe"
QUEUE_ORDER = "queue.order"
PLACEMENT_SESSION = "placement.session"
PLACEMENT_PLACE = "placement.place"
BINDER_COMMIT = "binder.commit"
BINDER_BIND = "binder.bind"
BINDER_EVICT = "binder.evict"
STATE_WRITEBACK = "state.writeback"

# --- attribute names -------------------------------------------------------------------------------------
PODGROUP = "kairos.podgroup"
"""`namespace/name` (just `name` without a namespace): what to search for in a tracing UI."""
PODGROUP_KEY = "kairos.podgroup.key"
NAMESPACE = "kairos.namespace"
QUEUE = "kairos.queue"
PODS_PENDING = "kairos.pods.pending"
MIN_MEMBER = "kairos.podgroup.min_member"
SOURCE = "kairos.source"
WORK_ITEM = "kairos.work_item"
TERM = "kairos.term"
WORK_PODGROUPS = "kairos.work_item.podgroups"
POSITION = "kairos.queue.position"
PENDING_PODGROUPS = "kairos.queue.pending_podgroups"
SATURATION = "kairos.queue.saturation"
TRY = "kairos.try"
ACTIONS = "kairos.actions"
NODES_CONSIDERED = "kairos.nodes.considered"
NODES_FILTERED = "kairos.nodes.filtered"
NODES_FILTERED_BY = "kairos.nodes.filtered_by"
NODES_CHOSEN = "kairos.nodes.chosen"
RESULT = "kairos.result"
REASON = "kairos.reason"
PODS_BOUND = "kairos.pods.bound"
PODS_PIPELINED = "kairos.pods.pipelined"
EVICTIONS = "kairos.evictions"
VICTIMS = "kairos.victims"
BINDS = "kairos.binds"
PENDING = "kairos.pending"
PROPOSAL = "kairos.proposal"
STATUS = "kairos.status"
CAS_CONFLICTS = "kairos.cas.conflicts"
CAS_ATTEMPTS = "kairos.cas.attempts"
CAS_LOST = "kairos.cas.lost"
POD = "kairos.pod"
NODE = "kairos.node"
RETRIES = "kairos.retries"
HTTP_STATUS = "http.response.status_code"
EVENT = "kairos.event"
RESOURCES = ("gpu", "cpu", "memory")

MAX_TRIES = 20
"""Dispatches of one attempt that the queue traces: a podgroup pending for hours is retried every cycle,
and its trace keeps the first tries (later ones go untraced) instead of growing without end."""


def qualified(namespace: str, name: str) -> str:
    """`namespace/name`, or `name` alone outside namespaces (the in-memory cluster)."""
    return f"{namespace}/{name}" if namespace else name


def podgroup_name(group: PodGroup) -> str:
    return qualified(group.namespace, group.name)


def podgroup_attributes(group: PodGroup) -> dict[str, str]:
    return {
        PODGROUP: podgroup_name(group),
        PODGROUP_KEY: group.key,
        NAMESPACE: group.namespace,
        QUEUE: group.queue,
    }


def _ms(start_ns: int, end_ns: int) -> float:
    return round((end_ns - start_ns) / 1e6, 3)


# --- queue --------------------------------------------------------------------------------------------------
def queue_attributes(share: QueueFairShare | None) -> dict[str, float]:
    """A queue's numbers as attributes: fair share, allocated, requested per resource, and its saturation
    (allocated / fair share, the highest over resources with a fair share)."""
    if share is None:
        return {}
    out: dict[str, float] = {}
    saturation = 0.0
    for resource in RESOURCES:
        fair = share.fair_share.get(resource, 0.0)
        allocated = share.allocated.get(resource, 0.0)
        out[f"kairos.queue.fair_share.{resource}"] = fair
        out[f"kairos.queue.allocated.{resource}"] = allocated
        out[f"kairos.queue.requested.{resource}"] = share.requested.get(resource, 0.0)
        if fair > 0:
            saturation = max(saturation, allocated / fair)
    out[SATURATION] = round(saturation, 6)
    return out


@dataclass
class CycleTrace:
    """One queue cycle's view for tracing: the stored context of each pending podgroup."""

    tracer: OrderTracer
    started_ns: int
    pending: Sequence[str]
    groups: Mapping[str, PodGroup]
    shares: Mapping[str, QueueFairShare]
    traceparents: Mapping[str, str]
    _position: dict[str, int] | None = None

    def order(self, item: WorkItem, podgroups: Sequence[str]) -> dict[str, str] | None:
        """A `queue.order` span per traced podgroup of `item` (`podgroups`: the item's, or every pending
        one for a whole-cycle item); the headers the work item carries."""
        if self._position is None:
            self._position = {key: i for i, key in enumerate(self.pending, start=1)}
        contexts: dict[str, SpanContext] = {}
        now = time.time_ns()
        room = MAX_TRACES_BYTES - 2
        for key in podgroups:
            parent = self.traceparents.get(key, "")
            tries = self.tracer.tries.get(parent, 0) + 1
            parent_ctx = context_of(parent) if tries <= MAX_TRIES else None
            if parent_ctx is None:
                continue
            room -= entry_bytes(key)
            if room < 0:
                break  # the headers are full: the rest of this item goes untraced (no span, no try counted)
            self.tracer.tries[parent] = tries
            group = self.groups.get(key)
            attributes: dict[str, Any] = {
                PODGROUP_KEY: key,
                POSITION: self._position.get(key, 0),
                PENDING_PODGROUPS: len(self.pending),
                WORK_ITEM: item.id,
                TERM: item.term,
                WORK_PODGROUPS: len(item.podgroups),
                TRY: tries,
            }
            if group is not None:
                attributes.update(podgroup_attributes(group))
                attributes.update(queue_attributes(self.shares.get(group.queue)))
            span = tracing.tracer().start_span(
                QUEUE_ORDER, context=parent_ctx, attributes=attributes, start_time=self.started_ns
            )
            span.end(end_time=now)
            contexts[key] = span.get_span_context()
        return headers_for(contexts)


@dataclass
class OrderTracer:
    """The queue leader's tracing state: how often each open attempt was dispatched."""

    tries: dict[str, int] = field(default_factory=dict)
    """Traceparent of an attempt -> its dispatches traced so far."""

    def cycle(
        self,
        pending: Sequence[str],
        snapshot: Snapshot,
        shares: Sequence[QueueFairShare],
        records: Mapping[str, StateRecord],
        started_ns: int,
    ) -> CycleTrace | None:
        """The cycle's trace view (None while tracing is off); `records` is the replica's state records,
        where each podgroup's attempt context is stored."""
        if not tracing.enabled():
            return None
        waiting = set(pending)
        groups = {g.key: g for g in snapshot.podgroups if g.key in waiting}
        traceparents: dict[str, str] = {}
        for key, group in groups.items():
            record = records.get(podgroup_key(group.namespace, group.name))
            if isinstance(record, PodGroupRecord) and record.traceparent:
                traceparents[key] = record.traceparent
        live = set(traceparents.values())
        self.tries = {tp: n for tp, n in self.tries.items() if tp in live}
        return CycleTrace(
            self, started_ns, pending, groups, {share.queue: share for share in shares}, traceparents
        )


# --- placement ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlaceDetail:
    """What a cycle did with one podgroup, read from the core's result."""

    attributes: dict[str, Any]
    result: str


def _who(group: PodGroup | None, key: str) -> str:
    if group is None:
        return key
    return podgroup_name(group)


def preemptor_of(message: str, candidates: Mapping[str, str]) -> str | None:
    """The candidate (key -> `namespace/name`) an eviction message names as the podgroup it made room
    for (the core's eviction messages say "... by podgroup NAME ..." / "... for podgroup NAME")."""
    for key, who in candidates.items():
        marker = f"podgroup {who}"
        at = message.find(marker)
        while at >= 0:
            end = at + len(marker)
            if end == len(message) or message[end] in " .,;":
                return key
            at = message.find(marker, end)
    return None


def place_details(result: CycleResult, traced: Collection[str], considered: int) -> dict[str, PlaceDetail]:
    """Per traced podgroup: nodes considered (`considered`, the snapshot's nodes), filtered (per reason:
    the result's `refusals`, so `schedule(..., node_details=traced)`), chosen, and the result."""
    bound: Counter[str] = Counter()
    chosen: dict[str, set[str]] = {}
    for proposal in result.binds:
        for binding in proposal.bindings:
            bound[proposal.podgroup] += 1
            chosen.setdefault(proposal.podgroup, set()).add(binding.node)
    pipelined: Counter[str] = Counter()
    for p in result.pipelined:
        pipelined[p.podgroup] += 1
        chosen.setdefault(p.podgroup, set()).add(p.node)
    pending = {p.podgroup: p.message for p in result.pending}
    statuses = result.podgroups
    names = {
        key: qualified(status.namespace, status.name)
        for key in traced
        if (status := statuses.get(key)) is not None
    }
    victims: dict[str, list[str]] = {}
    for eviction in result.evictions:
        preemptor = preemptor_of(eviction.message, names)
        if preemptor is not None:
            victims.setdefault(preemptor, []).append(qualified(eviction.namespace, eviction.name))
    out: dict[str, PlaceDetail] = {}
    for key in traced:
        status = statuses.get(key)
        if status is None:
            out[key] = PlaceDetail({PODGROUP_KEY: key, RESULT: "gone"}, "gone")
            continue
        refusals = status.refusals or NodeRefusals()
        if bound[key]:
            outcome = "bound"
        elif pipelined[key]:
            outcome = "pipelined"
        elif key in pending or status.pending:
            outcome = "pending"
        else:
            outcome = "unchanged"
        attributes: dict[str, Any] = {
            PODGROUP: names[key],
            PODGROUP_KEY: key,
            NAMESPACE: status.namespace,
            QUEUE: status.queue,
            NODES_CONSIDERED: considered,
            NODES_FILTERED: refusals.nodes,
            NODES_FILTERED_BY: sorted(f"{n} {reason}" for reason, n in refusals.by_reason.items()),
            NODES_CHOSEN: sorted(chosen.get(key, ())),
            RESULT: outcome,
            PODS_BOUND: bound[key],
            PODS_PIPELINED: pipelined[key],
            EVICTIONS: len(victims.get(key, ())),
        }
        if victims.get(key):
            attributes[VICTIMS] = sorted(victims[key])
        if key in pending:
            attributes[REASON] = pending[key].strip()
        out[key] = PlaceDetail(attributes, outcome)
    return out


@dataclass
class ActionTimes:
    """The core's `around_action` hook that records each action's start and end (wall clock, ns)."""

    inner: Callable[[str], contextlib.AbstractContextManager[object]] | None = None
    """Another hook to run inside this one (the metrics' timer)."""
    times: list[tuple[str, int, int]] = field(default_factory=list)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.time_ns()
        try:
            if self.inner is None:
                yield
            else:
                with self.inner(name):
                    yield
        finally:
            self.times.append((name, start, time.time_ns()))


def placement_spans(
    item: WorkItem,
    proposal: Proposal,
    details: Mapping[str, PlaceDetail],
    received: Carried,
    started_ns: int,
    ended_ns: int,
    actions: Sequence[tuple[str, int, int]] = (),
) -> dict[str, str] | None:
    """`placement.session` for the work item and `placement.place` per traced podgroup (child of its
    `queue.order`); returns the headers of the proposal (each podgroup's `placement.place`)."""
    parents = {key: ctx for key in details if (ctx := received.parent_of(key)) is not None}
    if not parents:
        return None
    tracer = tracing.tracer()
    session_attributes: dict[str, Any] = {
        WORK_ITEM: item.id,
        TERM: item.term,
        WORK_PODGROUPS: len(item.podgroups),
        PROPOSAL: proposal.id,
        BINDS: len(proposal.binds),
        EVICTIONS: len(proposal.evictions),
        PODS_PIPELINED: len(proposal.pipelined),
        PENDING: len(proposal.pending),
        ACTIONS: [name for name, _, _ in actions] or list(item.actions),
    }
    for name, start, end in actions:
        session_attributes[f"kairos.action.{name}.ms"] = _ms(start, end)
    if len(parents) == 1:
        # One podgroup's session: part of its trace, beside its placement.place.
        (only,) = parents.values()
        session = tracer.start_span(
            PLACEMENT_SESSION, context=only, attributes=session_attributes, start_time=started_ns
        )
    else:
        # A session for many podgroups belongs to none of their traces: its own trace, linked to each.
        session = tracer.start_span(
            PLACEMENT_SESSION,
            context=Context(),
            attributes=session_attributes,
            links=[Link(trace.get_current_span(ctx).get_span_context()) for ctx in parents.values()],
            start_time=started_ns,
        )
    session.end(end_time=ended_ns)
    contexts: dict[str, SpanContext] = {}
    for key, parent in parents.items():
        detail = details[key]
        span = tracer.start_span(
            PLACEMENT_PLACE,
            context=parent,
            attributes=detail.attributes,
            links=[Link(session.get_span_context())],
            start_time=started_ns,
        )
        span.end(end_time=ended_ns)
        contexts[key] = span.get_span_context()
    return headers_for(contexts)


# --- binder -------------------------------------------------------------------------------------------------
Lookup = Callable[[str], PodGroup | None]

_commit: contextvars.ContextVar[CommitTrace | None] = contextvars.ContextVar("kairos_commit", default=None)
_attempts: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("kairos_attempts", default=None)


class CommitTrace:
    """`binder.commit` spans of one proposal, one per traced podgroup it binds, pipelines or evicts for.

    Use as a context manager around the commit; `finish(outcome)` records the result. While it is open,
    `TracedCluster` puts each bind or eviction under its podgroup's span, and `event_headers` gives the
    public events that podgroup's context."""

    def __init__(self, proposal: Proposal, received: Carried, lookup: Lookup) -> None:
        self.proposal = proposal
        self.spans: dict[str, Span] = {}
        self._by_pod: dict[tuple[str, str], str] = {}
        self._by_group: dict[tuple[str, str], str] = {}
        self._token: contextvars.Token[CommitTrace | None] | None = None
        self.evicts_for: dict[str, str] = {}
        """Evicted pod key -> the traced podgroup its eviction made room for."""
        self.cas_attempts = 0
        self.cas_lost = 0
        self._binds: dict[str, list[Binding]] = {}
        if not received or not tracing.enabled():
            return
        groups = {key: lookup(key) for key in received.traceparents}
        names = {key: _who(group, key) for key, group in groups.items()}
        for eviction in proposal.evictions:
            preemptor = preemptor_of(eviction.message, names)
            if preemptor is not None:
                self.evicts_for[eviction.pod] = preemptor
        involved = (
            {b.podgroup for b in proposal.binds}
            | {p.podgroup for p in proposal.pipelined}
            | set(self.evicts_for.values())
        )
        if len(names) == 1 and proposal.evictions:
            # One traced podgroup: the evictions in its proposal were made for it.
            (only,) = names
            self.evicts_for = {e.pod: only for e in proposal.evictions}
            involved.add(only)
        for b in proposal.binds:
            self._binds.setdefault(b.podgroup, []).append(b)
        pipelined = Counter(p.podgroup for p in proposal.pipelined)
        evictions = Counter(self.evicts_for.values())
        for key in sorted(involved & names.keys()):
            parent = received.parent_of(key)
            if parent is None:
                continue
            group = groups[key]
            binds = self._binds.get(key, [])
            attributes: dict[str, Any] = {
                PODGROUP: names[key],
                PODGROUP_KEY: key,
                PROPOSAL: proposal.id,
                WORK_ITEM: proposal.work,
                TERM: proposal.term,
                BINDS: len(binds),
                PODS_PIPELINED: pipelined[key],
                EVICTIONS: evictions[key],
                NODES_CHOSEN: sorted({b.node for b in binds}),
            }
            if group is not None:
                attributes[NAMESPACE] = group.namespace
                attributes[QUEUE] = group.queue
            self.spans[key] = tracing.tracer().start_span(
                BINDER_COMMIT, context=parent, attributes=attributes
            )
            for b in binds:
                self._by_pod[(b.namespace, b.name)] = key
            if group is not None:
                self._by_group[(group.namespace, group.name)] = key
        for e in proposal.evictions:
            if (owner := self.evicts_for.get(e.pod)) in self.spans:
                self._by_pod[(e.namespace, e.name)] = owner

    def __enter__(self) -> CommitTrace:
        if self.spans:
            self._token = _commit.set(self)
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self._token is not None:
            _commit.reset(self._token)
            self._token = None
        for span in self.spans.values():
            if exc is not None:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.end()

    def finish(self, outcome: Outcome) -> None:
        """Record what the binder decided: status, reason, conflicts, the pods bound and evicted."""
        bound = set(outcome.bound)
        for key, span in self.spans.items():
            span.set_attribute(STATUS, outcome.status)
            span.set_attribute(CAS_CONFLICTS, outcome.conflicts)
            span.set_attribute(CAS_ATTEMPTS, self.cas_attempts)
            span.set_attribute(CAS_LOST, self.cas_lost)
            span.set_attribute(PODS_BOUND, sum(1 for b in self._binds.get(key, ()) if b.pod in bound))
            if outcome.reason:
                span.set_attribute(REASON, outcome.reason)
            if outcome.status == "failed":
                span.set_status(Status(StatusCode.ERROR, outcome.reason))

    def span_for_bind(self, binding: Binding) -> Span | None:
        return self.spans.get(binding.podgroup)

    def span_for_eviction(self, eviction: EvictionOrder) -> Span | None:
        owner = self.evicts_for.get(eviction.pod)
        return self.spans.get(owner) if owner is not None else None

    def headers_for(self, event: Event) -> dict[str, str] | None:
        match event:
            case PodBound() | PodEvicted():
                owner = self._by_pod.get((event.namespace, event.pod))
            case PodGroupState():
                owner = self._by_group.get((event.namespace, event.podgroup))
            case _:
                owner = None
        span = self.spans.get(owner) if owner is not None else None
        if span is None:
            return None
        return headers_for({owner: span.get_span_context()}) if owner is not None else None


def commit_trace(proposal: Proposal, lookup: Lookup) -> CommitTrace:
    """The commit spans of `proposal`, from the contexts its message carried (see `CommitTrace`)."""
    return CommitTrace(proposal, carried(), lookup)


def event_headers(event: Event) -> dict[str, str] | None:
    """Headers for a public event the binder publishes while a `CommitTrace` is open (else None)."""
    trace_ = _commit.get()
    return trace_.headers_for(event) if trace_ is not None else None


def noting_cas(on_write: Callable[[str, bool], None]) -> Callable[[str, bool], None]:
    """`on_write` (a `CountedKv` callback), also counting compare-and-set writes and the conflicts among
    them on the open `CommitTrace`'s spans."""

    def both(operation: str, won: bool) -> None:
        on_write(operation, won)
        trace_ = _commit.get()
        if trace_ is not None:
            trace_.cas_attempts += 1
            trace_.cas_lost += 0 if won else 1

    return both


def note_retry() -> None:
    """A cluster client is about to ask again: counted on the `binder.bind`/`binder.evict` span."""
    attempts = _attempts.get()
    if attempts is not None:
        attempts[0] += 1


def counting_retries(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """`method`, noting a retry on every call after its first (for clients whose retry loop is elsewhere)."""
    calls = 0

    async def counted(*args: Any, **kwargs: Any) -> T:
        nonlocal calls
        if calls:
            note_retry()
        calls += 1
        return await method(*args, **kwargs)

    return counted


class ClusterCalls(Protocol):
    async def bind(self, binding: Binding) -> None: ...

    async def evict(self, eviction: EvictionOrder) -> None: ...


@dataclass
class TracedCluster:
    """A cluster client whose calls made under an open `CommitTrace` get `binder.bind` / `binder.evict`
    spans (retries, the HTTP status of a refusal); outside one (the recovery scan) it only delegates."""

    inner: ClusterCalls

    async def bind(self, binding: Binding) -> None:
        trace_ = _commit.get()
        parent = trace_.span_for_bind(binding) if trace_ is not None else None
        if parent is None:
            await self.inner.bind(binding)
            return
        attributes = {POD: qualified(binding.namespace, binding.name), NODE: binding.node}
        await _call(BINDER_BIND, parent, attributes, lambda: self.inner.bind(binding))

    async def evict(self, eviction: EvictionOrder) -> None:
        trace_ = _commit.get()
        parent = trace_.span_for_eviction(eviction) if trace_ is not None else None
        if parent is None:
            await self.inner.evict(eviction)
            return
        attributes = {
            POD: qualified(eviction.namespace, eviction.name),
            NODE: eviction.node,
            PODGROUP_KEY: eviction.podgroup,
            REASON: eviction.message,
        }
        await _call(BINDER_EVICT, parent, attributes, lambda: self.inner.evict(eviction))


async def _call(
    name: str, parent: Span, attributes: dict[str, Any], call: Callable[[], Awaitable[None]]
) -> None:
    attempts = [0]
    token = _attempts.set(attempts)
    span = tracing.tracer().start_span(name, context=trace.set_span_in_context(parent), attributes=attributes)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            await call()
        span.set_attribute(RESULT, "done")
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        status = getattr(cause, "status", None) or getattr(exc, "status", None)
        if isinstance(status, int) and status > 0:
            span.set_attribute(HTTP_STATUS, status)
        span.set_attribute(RESULT, "refused" if type(exc).__name__ == "ClusterRefused" else "no answer")
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        raise
    finally:
        span.set_attribute(RETRIES, attempts[0])
        span.end()
        _attempts.reset(token)


# --- any handler --------------------------------------------------------------------------------------------
def traced_handler(
    name: str, handler: Callable[[Any, Any], Awaitable[None]]
) -> Callable[[Any, Any], Awaitable[None]]:
    """`handler` (a middleware handler) inside a span `name` when the message carried a trace context
    (the middleware made it current); messages without one run untraced."""

    async def wrapped(message: Any, msg: Any) -> None:
        if not tracing.enabled() or not trace.get_current_span().get_span_context().is_valid:
            await handler(message, msg)
            return
        config = getattr(type(message), "__struct_config__", None)
        attributes = {EVENT: str(getattr(config, "tag", None) or type(message).__name__)}
        with tracing.tracer().start_as_current_span(name, attributes=attributes):
            await handler(message, msg)

    return wrapped
