"""The spans of a podgroup's attempt, service by service: where the trace starts (state), how the queue,
placement and binder continue it, and what each span says. Spans go to an in-memory exporter; the session
is the real core, the cluster client the real NATS one against a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.binder.cluster_client import ClusterRefused, NatsClusterClient
from shared.backoff import Backoff
from shared.bus.connection import Bus, connect
from shared.bus.trace_context import Carried, carried_by, headers_for, receiving
from shared.contracts import subjects as s
from shared.contracts.events import PodBound, QueueFairShare
from shared.contracts.messages import (
    CLUSTER_REQUESTS,
    Binding,
    ClusterReply,
    EvictionOrder,
    Outcome,
    PipelinedPod,
    PodGroupRecord,
    PodRecord,
    Proposal,
    WorkItem,
    encode,
)
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.kubeapi.client import ApiError
from shared.model import PodStatus, Snapshot
from shared.telemetry import spans, tracing
from shared.telemetry.attempts import AttemptTracker
from shared.telemetry.tracing import traceparent
from tests import builders
from tests.builders import gang, gpu_nodes, queue, root_queue
from tools.stack.nats_server import start_nats_server


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing.use(provider):
        yield exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# --- state: the attempt tracker --------------------------------------------------------------------------------
def pod_changes(name: str, size: int, status: PodStatus = PodStatus.PENDING) -> list[tuple[str, object]]:
    group, pods = gang(name, "team", size, status=status)
    return [(s.podgroup_key("", name), group), *((s.pod_key("", p.name), p) for p in pods)]


def test_a_podgroup_with_pending_pods_begins_an_attempt_with_a_root_span(
    exported: InMemorySpanExporter,
) -> None:
    tracker = AttemptTracker("sim")
    began = tracker.observe(pod_changes("train", 2))
    assert list(began) == [s.podgroup_key("", "train")]
    (observe,) = named(exported, spans.STATE_OBSERVE)
    assert observe.parent is None
    assert observe.attributes is not None
    assert dict(observe.attributes) == {
        spans.PODGROUP: "train",
        spans.PODGROUP_KEY: "train",
        spans.NAMESPACE: "",
        spans.QUEUE: "team",
        spans.PODS_PENDING: 2,
        spans.MIN_MEMBER: 2,
        spans.SOURCE: "sim",
    }
    assert tracker.traceparents["train"] == traceparent(observe.get_span_context())


def test_the_record_written_for_the_podgroup_carries_its_trace(exported: InMemorySpanExporter) -> None:
    tracker = AttemptTracker("kube")
    changes = pod_changes("train", 1)
    tracker.observe(changes)
    group = changes[0][1]
    record = tracker.record(group)
    assert record == PodGroupRecord(podgroup=group, traceparent=tracker.traceparents["train"])


def test_pods_joining_an_open_attempt_stay_in_its_trace(exported: InMemorySpanExporter) -> None:
    tracker = AttemptTracker("kube")
    tracker.observe(pod_changes("train", 1))
    first = tracker.traceparents["train"]
    _, pods = gang("train", "team", 3)
    began = tracker.observe([(s.pod_key("", p.name), p) for p in pods[1:]])
    assert began == {}
    assert tracker.traceparents["train"] == first
    assert len(named(exported, spans.STATE_OBSERVE)) == 1


def test_an_attempt_ends_when_no_pod_is_pending_and_an_eviction_begins_another(
    exported: InMemorySpanExporter,
) -> None:
    tracker = AttemptTracker("sim")
    tracker.observe(pod_changes("train", 1))
    first = tracker.traceparents["train"]
    tracker.observe(pod_changes("train", 1, status=PodStatus.RUNNING)[1:])
    assert "train" not in tracker.traceparents
    began = tracker.observe(pod_changes("train", 1)[1:])  # evicted back to Pending
    assert list(began) == [s.podgroup_key("", "train")]
    assert tracker.traceparents["train"] != first


def test_pods_that_arrive_before_their_podgroup_start_the_trace_once_it_is_known(
    exported: InMemorySpanExporter,
) -> None:
    tracker = AttemptTracker("kube")
    changes = pod_changes("train", 2)
    assert tracker.observe(changes[1:]) == {}
    began = tracker.observe(changes[:1])
    assert list(began) == [s.podgroup_key("", "train")]


def test_deleted_pods_leave_the_attempt(exported: InMemorySpanExporter) -> None:
    tracker = AttemptTracker("kube")
    changes = pod_changes("train", 1)
    tracker.observe(changes)
    tracker.observe([(changes[1][0], None)])
    assert "train" not in tracker.traceparents


def test_a_restarted_writer_keeps_the_open_attempts_of_kv(exported: InMemorySpanExporter) -> None:
    tracker = AttemptTracker("sim")
    tracker.observe(pod_changes("train", 1))
    group, pod = pod_changes("train", 1)[:2]
    stored = {
        s.podgroup_key("", "train"): encode(tracker.record(group[1])),
        s.pod_key("", "train-0"): encode(PodRecord(pod=pod[1])),
    }
    restarted = AttemptTracker("sim")
    restarted.seed_encoded(stored)
    assert restarted.traceparents == tracker.traceparents
    assert restarted.observe(pod_changes("train", 1)) == {}


# --- queue: queue.order --------------------------------------------------------------------------------------
def _share(queue: str) -> QueueFairShare:
    return QueueFairShare(
        time=0.0,
        queue=queue,
        parent=None,
        fair_share={"gpu": 4.0, "cpu": 0.0, "memory": 0.0},
        allocated={"gpu": 6.0, "cpu": 10.0, "memory": 0.0},
        requested={"gpu": 8.0, "cpu": 10.0, "memory": 0.0},
        deserved={"gpu": 4.0, "cpu": 0.0, "memory": 0.0},
    )


def _queue_view(tracker: AttemptTracker, names: list[str]) -> tuple[Snapshot, dict[str, PodGroupRecord]]:
    groups = [gang(name, "team", 1)[0] for name in names]
    records = {s.podgroup_key("", g.name): tracker.record(g) for g in groups}
    return Snapshot(podgroups=tuple(groups)), records


def _item(podgroups: tuple[str, ...] = ()) -> WorkItem:
    return WorkItem(
        id="w1", shard="default", term=3, leader="q", now=0.0, state_revision=1, podgroups=podgroups
    )


def test_queue_order_continues_the_stored_trace_with_the_queues_numbers(
    exported: InMemorySpanExporter,
) -> None:
    tracker = AttemptTracker("sim")
    tracker.observe(pod_changes("a", 1) + pod_changes("b", 1))
    snapshot, records = _queue_view(tracker, ["a", "b", "c"])
    cycle = spans.OrderTracer().cycle(["b", "a", "c"], snapshot, [_share("team")], records, 0)
    assert cycle is not None
    headers = cycle.order(_item(), ["b", "a", "c"])
    orders = {span.attributes[spans.PODGROUP]: span for span in named(exported, spans.QUEUE_ORDER)}
    assert set(orders) == {"a", "b"}  # c has no stored trace: it stays untraced
    observed = {span.attributes[spans.PODGROUP]: span for span in named(exported, spans.STATE_OBSERVE)}
    assert parent_id(orders["a"]) == observed["a"].get_span_context().span_id
    b = orders["b"].attributes
    assert b is not None
    assert (b[spans.POSITION], b[spans.PENDING_PODGROUPS], b[spans.WORK_ITEM], b[spans.TERM]) == (
        1,
        3,
        "w1",
        3,
    )
    assert b["kairos.queue.fair_share.gpu"] == 4.0
    assert b[spans.SATURATION] == 1.5  # 6 GPUs allocated on a fair share of 4
    assert carried_by(headers).traceparents == {
        key: traceparent(orders[key].get_span_context()) for key in ("a", "b")
    }


def test_a_podgroup_retried_every_cycle_is_traced_only_for_its_first_tries(
    exported: InMemorySpanExporter,
) -> None:
    tracker = AttemptTracker("sim")
    tracker.observe(pod_changes("a", 1))
    snapshot, records = _queue_view(tracker, ["a"])
    queue = spans.OrderTracer()
    for _ in range(spans.MAX_TRIES + 5):
        cycle = queue.cycle(["a"], snapshot, [], records, 0)
        assert cycle is not None
        cycle.order(_item(("a",)), ["a"])
    assert len(named(exported, spans.QUEUE_ORDER)) == spans.MAX_TRIES


def test_a_whole_cycle_item_traces_what_its_headers_can_carry(exported: InMemorySpanExporter) -> None:
    names = [f"a-podgroup-with-a-long-name-{i:05d}" for i in range(2000)]
    tracker = AttemptTracker("sim")
    tracker.observe([change for name in names for change in pod_changes(name, 1)])
    snapshot, records = _queue_view(tracker, names)
    cycle = spans.OrderTracer().cycle(names, snapshot, [], records, 0)
    assert cycle is not None
    headers = cycle.order(_item(), names)
    assert headers is not None
    # JetStream refuses a message whose headers pass 64 KiB: the work item must still go out.
    assert sum(len(k) + len(v) + 4 for k, v in headers.items()) < 64 * 1024
    traced = carried_by(headers).traceparents
    orders = named(exported, spans.QUEUE_ORDER)
    assert 0 < len(traced) == len(orders) < len(names)
    assert list(traced) == names[: len(traced)]  # the first in queue order


def test_the_queue_does_no_span_work_while_tracing_is_off() -> None:
    assert spans.OrderTracer().cycle(["a"], Snapshot(), [], {}, 0) is None


# --- placement: placement.session and placement.place ---------------------------------------------------------
def _session() -> tuple[Snapshot, list[str]]:
    queues = (root_queue("org"), queue("team", 8, parent="org"))
    fits = gang("fits", "team", 2, created=1.0)
    big = gang("big", "team", 1, gpus=8.0, created=2.0)
    snapshot = builders.snapshot(gpu_nodes(2, gpus=4), fits, big, queues=queues)
    return snapshot, ["fits", "big"]


def _details(snapshot: Snapshot, traced: list[str]) -> dict[str, spans.PlaceDetail]:
    result = schedule(snapshot, 10.0, Policy(), node_details=traced)
    return spans.place_details(result, traced, len(snapshot.nodes))


def test_place_details_say_what_the_session_did_with_each_podgroup() -> None:
    snapshot, traced = _session()
    details = _details(snapshot, traced)
    fits, big = details["fits"].attributes, details["big"].attributes
    assert (fits[spans.RESULT], fits[spans.PODS_BOUND], fits[spans.NODES_CONSIDERED]) == ("bound", 2, 2)
    assert len(fits[spans.NODES_CHOSEN]) >= 1
    assert big[spans.RESULT] == "pending"
    assert big[spans.NODES_FILTERED] == 2
    assert big[spans.NODES_FILTERED_BY] == ["2 node(s) didn't have enough resources: GPUs"]
    assert "GPUs" in big[spans.REASON]


def test_placement_spans_continue_each_podgroups_queue_order(exported: InMemorySpanExporter) -> None:
    snapshot, traced = _session()
    details = _details(snapshot, traced)
    orders = {key: tracing.tracer().start_span(spans.QUEUE_ORDER) for key in traced}
    for span in orders.values():
        span.end()
    received = carried_by(headers_for({k: v.get_span_context() for k, v in orders.items()}))
    proposal = Proposal(id="p1", work="w1", shard="default", term=3, leader="q", state_revision=1)
    headers = spans.placement_spans(
        _item(), proposal, details, received, 1_000, 2_000, [("allocate", 1_000, 2_501_000)]
    )

    places = {span.attributes[spans.PODGROUP]: span for span in named(exported, spans.PLACEMENT_PLACE)}
    assert {key: parent_id(span) for key, span in places.items()} == {
        key: span.get_span_context().span_id for key, span in orders.items()
    }
    (session,) = named(exported, spans.PLACEMENT_SESSION)
    assert session.parent is None  # a session for two podgroups is its own trace, linked to both
    assert len(session.links) == 2
    assert session.attributes is not None
    assert session.attributes["kairos.action.allocate.ms"] == 2.5
    assert (places["fits"].start_time, places["fits"].end_time) == (1_000, 2_000)
    assert carried_by(headers).traceparents == {
        key: traceparent(span.get_span_context()) for key, span in places.items()
    }


def test_a_session_for_one_podgroup_is_part_of_its_trace(exported: InMemorySpanExporter) -> None:
    snapshot, _ = _session()
    details = _details(snapshot, ["fits"])
    order = tracing.tracer().start_span(spans.QUEUE_ORDER)
    order.end()
    received = carried_by(headers_for({"fits": order.get_span_context()}))
    proposal = Proposal(id="p1", work="w1", shard="default", term=3, leader="q", state_revision=1)
    spans.placement_spans(_item(("fits",)), proposal, details, received, 1, 2)
    (session,) = named(exported, spans.PLACEMENT_SESSION)
    assert parent_id(session) == order.get_span_context().span_id


def test_nothing_traced_means_no_placement_spans(exported: InMemorySpanExporter) -> None:
    proposal = Proposal(id="p1", work="w1", shard="default", term=3, leader="q", state_revision=1)
    assert spans.placement_spans(_item(), proposal, {}, Carried(), 1, 2) is None
    assert exported.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Pod a-0 was reclaimed by podgroup b-job of queue team-b", "b"),
        ("Pod ns/a-0 was evicted to be moved elsewhere, making room for podgroup ns/c", "c"),
        ("Pod a-0 was preempted by higher priority podgroup b-job-2", None),
        ("Pod a-0 is stale", None),
    ],
)
def test_an_eviction_is_attributed_to_the_podgroup_its_message_names(
    message: str, expected: str | None
) -> None:
    assert spans.preemptor_of(message, {"b": "b-job", "c": "ns/c"}) == expected


def test_action_times_wrap_another_hook() -> None:
    inner: list[str] = []

    class Inner:
        def __init__(self, name: str) -> None:
            inner.append(name)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *_: object) -> None:
            return None

    times = spans.ActionTimes(inner=Inner)
    with times("allocate"):
        pass
    assert inner == ["allocate"]
    ((name, start, end),) = times.times
    assert name == "allocate"
    assert start <= end


# --- binder: binder.commit, binder.bind, binder.evict -------------------------------------------------------------
@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[Bus]:
    server = start_nats_server(tmp_path / "nats")
    try:
        connected = await connect(server.url, "test")
        try:
            yield connected
        finally:
            await connected.close()
    finally:
        server.stop()


def _binding(pod: str, podgroup: str) -> Binding:
    return Binding(pod=pod, namespace="ns", name=pod, podgroup=podgroup, node="node-1", gpus=1.0)


def _proposal() -> Proposal:
    return Proposal(
        id="p1",
        work="w1",
        shard="default",
        term=1,
        leader="q",
        state_revision=1,
        binds=(_binding("b-0", "ns/b"), _binding("b-1", "ns/b"), _binding("x-0", "ns/x")),
        evictions=(
            EvictionOrder(
                pod="a-0",
                namespace="ns",
                name="a-0",
                podgroup="ns/a",
                node="node-1",
                message="Pod ns/a-0 was reclaimed by podgroup ns/b of queue q",
            ),
        ),
        pipelined=(PipelinedPod(pod="c-0", podgroup="ns/c", node="node-2"),),
    )


def _parents(*keys: str) -> tuple[dict[str, trace.Span], Carried]:
    placed = {key: tracing.tracer().start_span(spans.PLACEMENT_PLACE) for key in keys}
    for span in placed.values():
        span.end()
    return placed, carried_by(headers_for({k: v.get_span_context() for k, v in placed.items()}))


def _lookup(key: str) -> None:
    return None


def test_binder_commit_is_one_span_per_traced_podgroup_it_acts_for(exported: InMemorySpanExporter) -> None:
    placed, received = _parents("ns/b", "ns/c", "ns/untouched")
    with spans.CommitTrace(_proposal(), received, _lookup) as commit:
        commit.finish(
            Outcome(
                proposal="p1", work="w1", shard="default", status="committed", bound=("b-0", "b-1", "x-0")
            )
        )
    commits = {span.attributes[spans.PODGROUP_KEY]: span for span in named(exported, spans.BINDER_COMMIT)}
    assert set(commits) == {"ns/b", "ns/c"}  # ns/x is not traced; ns/untouched has nothing to commit
    assert parent_id(commits["ns/b"]) == placed["ns/b"].get_span_context().span_id
    b = commits["ns/b"].attributes
    assert b is not None
    assert (b[spans.BINDS], b[spans.PODS_BOUND], b[spans.EVICTIONS], b[spans.STATUS]) == (
        2,
        2,
        1,
        "committed",
    )
    c = commits["ns/c"].attributes
    assert c is not None
    assert (c[spans.PODS_PIPELINED], c[spans.EVICTIONS]) == (1, 0)


def test_public_events_carry_the_context_of_the_commit_they_report(exported: InMemorySpanExporter) -> None:
    _, received = _parents("ns/b")
    with spans.CommitTrace(_proposal(), received, _lookup):
        bound = PodBound(time=0.0, namespace="ns", pod="b-0", podgroup="b", queue="q", node="node-1")
        other = PodBound(time=0.0, namespace="ns", pod="x-0", podgroup="x", queue="q", node="node-1")
        headers, untraced = spans.event_headers(bound), spans.event_headers(other)
    (span,) = named(exported, spans.BINDER_COMMIT)
    assert carried_by(headers).traceparents == {"ns/b": traceparent(span.get_span_context())}
    assert untraced is None
    assert spans.event_headers(bound) is None  # the commit is closed


async def test_binds_and_evictions_get_spans_with_retries_and_refusals(
    exported: InMemorySpanExporter, bus: Bus
) -> None:
    requests: list[str] = []

    async def cluster(msg: object) -> None:
        request = CLUSTER_REQUESTS.decode(getattr(msg, "subject", ""), getattr(msg, "data", b""))
        requests.append(type(request).__name__)
        if type(request).__name__ == "BindRequest" and requests.count("BindRequest") == 1:
            return  # the first bind gets no answer: the client asks again
        ok = type(request).__name__ == "BindRequest"
        await msg.respond(encode(ClusterReply(ok=ok, error="" if ok else "pod is protected")))

    sub = await bus.nc.subscribe(s.CLUSTER_WILDCARD, cb=cluster)
    client = spans.TracedCluster(
        NatsClusterClient(bus, timeout=0.3, backoff=Backoff(attempts=3, base=0.01, cap=0.02))
    )
    proposal = _proposal()
    _, received = _parents("ns/b")
    try:
        with spans.CommitTrace(proposal, received, _lookup):
            await client.bind(proposal.binds[0])
            with pytest.raises(ClusterRefused):
                await client.evict(proposal.evictions[0])
            await client.bind(proposal.binds[2])  # ns/x is not traced: no span
    finally:
        await sub.unsubscribe()
    (commit,) = named(exported, spans.BINDER_COMMIT)
    (bind,) = named(exported, spans.BINDER_BIND)
    (evict,) = named(exported, spans.BINDER_EVICT)
    assert parent_id(bind) == parent_id(evict) == commit.get_span_context().span_id
    assert bind.attributes is not None
    assert (bind.attributes[spans.POD], bind.attributes[spans.RETRIES], bind.attributes[spans.RESULT]) == (
        "ns/b-0",
        1,
        "done",
    )
    assert evict.attributes is not None
    assert (evict.attributes[spans.RESULT], evict.attributes[spans.RETRIES]) == ("refused", 0)
    assert not evict.status.is_ok


async def test_a_refusal_by_the_api_server_records_its_http_status(exported: InMemorySpanExporter) -> None:
    class ApiServerSaysConflict:
        """Stands in for the Kubernetes client: answers every bind as the API server answers a bound pod."""

        async def bind(self, binding: Binding) -> None:
            answer = ApiError(f"bind {binding.name}", 409, "Conflict", "already bound")
            raise ClusterRefused("bind", binding.pod, "already bound to node-9") from answer

        async def evict(self, eviction: EvictionOrder) -> None:
            raise AssertionError(f"not asked to evict {eviction.pod}")

    _, received = _parents("ns/b")
    proposal = _proposal()
    with spans.CommitTrace(proposal, received, _lookup), pytest.raises(ClusterRefused):
        await spans.TracedCluster(ApiServerSaysConflict()).bind(proposal.binds[0])
    (bind,) = named(exported, spans.BINDER_BIND)
    assert bind.attributes is not None
    assert bind.attributes[spans.HTTP_STATUS] == 409


async def test_a_handler_continues_the_trace_its_message_carries(exported: InMemorySpanExporter) -> None:
    parent = tracing.tracer().start_span(spans.BINDER_COMMIT)
    parent.end()
    handled: list[int] = []

    async def on_event(event: object, _msg: object) -> None:
        handled.append(trace.get_current_span().get_span_context().span_id)

    wrapped = spans.traced_handler(spans.STATE_WRITEBACK, on_event)
    event = PodBound(time=0.0, namespace="ns", pod="b-0", podgroup="b", queue="q", node="n")
    with receiving(headers_for({"ns/b": parent.get_span_context()})):
        await wrapped(event, None)
    await wrapped(event, None)  # no context: runs untraced
    (writeback,) = named(exported, spans.STATE_WRITEBACK)
    assert parent_id(writeback) == parent.get_span_context().span_id
    assert writeback.attributes is not None
    assert writeback.attributes[spans.EVENT] == "pod-bound"
    assert handled[0] == writeback.get_span_context().span_id
    assert handled[1] == 0


async def test_tracing_off_leaves_handlers_and_clients_as_they_are() -> None:
    calls: list[str] = []

    async def on_event(event: object, _msg: object) -> None:
        calls.append("event")

    await spans.traced_handler(spans.STATE_WRITEBACK, on_event)(None, None)
    with spans.CommitTrace(_proposal(), Carried(), _lookup) as commit:
        assert commit.spans == {}
    assert calls == ["event"]
