"""Specifications of KAI's series in Kairos: every series of KAI v0.17's docs/metrics/METRICS.md (the queue
controller's and the scheduler's), exported under KAI's name, type, label names and buckets by the service
that owns the quantity, and the placement shell's per-action, per-plugin and session series fed from the
core's values. The table below is taken from KAI's METRICS.md and pkg/scheduler/metrics (facts: names,
types, labels, buckets), written here as a Python table; the scrape labels KAI's table also lists
(`endpoint`, `instance`, `job`, `namespace`, `pod`, `service`) are the ServiceMonitor's target labels, not
the process's, and are left out (except `pod_group_evicted_pods_total`'s own `namespace`)."""

from __future__ import annotations

import re
import time
from typing import Any, cast

import pytest
from nats.aio.msg import Msg
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from shared.bus.middleware import Counters
from shared.contracts.events import QueueFairShare
from shared.core.policy import Policy
from shared.core.result import ActionCounts
from shared.core.scheduler import schedule
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.telemetry.metrics import (
    KAI_LATENCY_BUCKETS_MS,
    KAI_SEARCH_BUCKETS_S,
    BinderMetrics,
    GpuAgentMetrics,
    KaiCounter,
    PlacementMetrics,
    QueueMetrics,
    ServiceMetrics,
    StateMetrics,
)
from tests.builders import podgroup

QUEUE = ("queue_name", "queue_metadata_name", "queue_display_name")

KAI_SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    # queue controller
    "queue_info": ("gauge", QUEUE),
    "queue_deserved_gpus": ("gauge", QUEUE),
    "queue_quota_cpu_cores": ("gauge", QUEUE),
    "queue_quota_memory_bytes": ("gauge", QUEUE),
    "queue_allocated_gpus": ("gauge", QUEUE),
    "queue_allocated_cpu_cores": ("gauge", QUEUE),
    "queue_allocated_memory_bytes": ("gauge", QUEUE),
    # scheduler: latencies
    "e2e_scheduling_latency_milliseconds": ("gauge", ()),
    "open_session_latency_milliseconds": ("gauge", ()),
    "close_session_latency_milliseconds": ("gauge", ()),
    "plugin_scheduling_latency_milliseconds": ("gauge", ("plugin", "OnSession")),
    "action_scheduling_latency_milliseconds": ("gauge", ("action",)),
    "task_scheduling_latency_milliseconds": ("histogram", ()),
    "task_bind_latency_milliseconds": ("histogram", ()),
    "usage_query_latency_milliseconds": ("histogram", ()),
    # scheduler: actions
    "podgroups_scheduled_by_action": ("counter", ("action",)),
    "podgroups_acted_on_by_action": ("counter", ("action",)),
    "scenarios_simulation_by_action": ("counter", ("action",)),
    "scenarios_filtered_by_action": ("counter", ("action",)),
    "total_preemption_attempts": ("counter", ()),
    "pod_group_evicted_pods_total": ("counter", ("podgroup", "namespace", "uid", "nodepool", "action")),
    "scenario_search_jobs_total": ("counter", ("action", "result", "reduced_budget")),
    "scenario_search_action_budget_configured_seconds": ("gauge", ("action",)),
    "scenario_search_job_budget_configured_seconds": ("gauge", ()),
    "scenario_search_generator_budget_configured_seconds": ("gauge", ("generator",)),
    "scenario_search_action_budget_exhausted_total": ("counter", ("action",)),
    "scenario_search_duration_seconds": ("histogram", ("action", "generator", "result")),
    "scenario_search_scenarios_total": ("counter", ("action", "generator", "state")),
    # scheduler: queue fair share and usage
    "queue_fair_share_cpu_cores": ("gauge", QUEUE),
    "queue_fair_share_memory_gb": ("gauge", QUEUE),
    "queue_fair_share_gpu": ("gauge", QUEUE),
    "queue_cpu_usage": ("gauge", QUEUE),
    "queue_memory_usage": ("gauge", QUEUE),
    "queue_gpu_usage": ("gauge", QUEUE),
}
"""KAI's series (without the `kai_` namespace): type and the label names the process writes."""

KAI_BUCKETS = {
    "task_scheduling_latency_milliseconds": KAI_LATENCY_BUCKETS_MS,
    "task_bind_latency_milliseconds": KAI_LATENCY_BUCKETS_MS,
    "usage_query_latency_milliseconds": KAI_LATENCY_BUCKETS_MS,
    "scenario_search_duration_seconds": KAI_SEARCH_BUCKETS_S,
}
"""KAI's buckets: `ExponentialBuckets(5, 2, 10)` ms, and `ExponentialBuckets(0.001, 2, 16)` s for the search."""


def attached() -> ServiceMetrics:
    metrics = ServiceMetrics()
    metrics.attach("kairos", "r-1", None, Counters(), lambda: True)
    return metrics


def every_service() -> dict[str, ServiceMetrics]:
    """Each service's registry as its shell builds it, with one sample in every labelled series."""
    services = {name: attached() for name in ("placement", "binder", "queue", "state", "gpu-agent")}
    placement = PlacementMetrics(services["placement"])
    with placement.session_clock().action("allocate"):
        pass
    placement.plugin_opened("proportion", 0.001)
    placement.observe_actions(
        [ActionCounts(action="preempt", considered=2, scheduled=1, scenarios_simulated=3, evicted={"u": 1})],
        {"u": PodGroup(name="pg", namespace="ns", uid="u", queue="q")},
        "",
    )
    placement.search_duration.labels("preempt", "accumulated", "solved").observe(0.01)
    placement.observe_item(0.01, placed=1, pipelined=0, pending=0, task_latencies=[0.5])
    binder = BinderMetrics(services["binder"])
    with binder.proposal():
        binder.bind_answered()
    queue = QueueMetrics(services["queue"])
    queue.observe_plan([share("q", usage={"gpu": 0.5, "cpu": 0.25, "memory": 0.1})], pending=1)
    queue.usage_queried(0.002)
    StateMetrics(services["state"])
    GpuAgentMetrics(services["gpu-agent"])
    return services


def share(queue: str, usage: dict[str, float] | None = None) -> QueueFairShare:
    zero = {"gpu": 0.0, "cpu": 0.0, "memory": 0.0}
    return QueueFairShare(
        time=0.0,
        queue=queue,
        parent=None,
        fair_share={"gpu": 2.0, "cpu": 4000.0, "memory": 8e9},
        allocated=zero,
        requested=zero,
        deserved=zero,
        usage=usage or {},
    )


def text(metrics: ServiceMetrics) -> str:
    return metrics.expose()[0].decode()


def families(metrics: ServiceMetrics) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text(metrics))}


def kai_families() -> dict[str, tuple[str, Metric]]:
    """`kai_` family name -> (the service exporting it, the family); a name twice fails."""
    out: dict[str, tuple[str, Metric]] = {}
    for service, metrics in every_service().items():
        for name, family in families(metrics).items():
            if name.startswith("kai_"):
                assert name not in out, f"{name} exported by {out[name][0]} and {service}"
                out[name] = (service, family)
    return out


def family_of(name: str) -> str:
    """The family name the parser gives a KAI series (it drops a counter's `_total`)."""
    return name.removesuffix("_total") if KAI_SERIES[name][0] == "counter" else name


@pytest.mark.parametrize("name", sorted(KAI_SERIES))
def test_every_series_of_kai_is_exported_with_kais_type_and_label_names(name: str) -> None:
    kind, labels = KAI_SERIES[name]
    found = kai_families()
    family_name = f"kai_{family_of(name)}"
    assert family_name in found, f"kai_{name} is not exported"
    _, family = found[family_name]
    assert family.type == kind
    label_sets = {tuple(sorted(k for k in s.labels if k != "le")) for s in family.samples}
    assert label_sets == {tuple(sorted(labels))}, (name, family.samples)


@pytest.mark.parametrize("name", sorted(n for n, (kind, _) in KAI_SERIES.items() if kind == "counter"))
def test_each_kai_counter_is_written_under_kais_exact_name(name: str) -> None:
    body = "".join(text(m) for m in every_service().values())
    assert re.search(rf"^# TYPE kai_{name} counter$", body, re.MULTILINE), name
    assert re.search(rf"^kai_{name}[{{ ]", body, re.MULTILINE), name


@pytest.mark.parametrize(("name", "buckets"), sorted(KAI_BUCKETS.items()))
def test_kai_histograms_have_kais_buckets(name: str, buckets: tuple[float, ...]) -> None:
    _, family = kai_families()[f"kai_{name}"]
    bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
    assert bounds == [*buckets, float("inf")]


@pytest.mark.parametrize(
    ("service", "names"),
    [
        ("queue", ("queue_info", "queue_allocated_gpus", "queue_fair_share_gpu", "queue_gpu_usage")),
        ("placement", ("e2e_scheduling_latency_milliseconds", "podgroups_scheduled_by_action")),
        ("binder", ("task_bind_latency_milliseconds",)),
    ],
)
def test_the_service_that_owns_a_quantity_exports_it(service: str, names: tuple[str, ...]) -> None:
    found = kai_families()
    for name in names:
        assert found[f"kai_{family_of(name)}"][0] == service


# --- placement's per-action series from the core's values --------------------------------------------------
def group(name: str, queue: str) -> PodGroup:
    return podgroup(
        name, queue, namespace="ns", uid=f"uid-{name}", labels={"kai.scheduler/node-pool": "pool-a"}
    )


def reclaim_cluster() -> Snapshot:
    """Queue qa holds both GPUs of the only node with no quota; qb's pending pod deserves one."""
    running = tuple(
        Pod(
            name=f"a-{i}",
            namespace="ns",
            podgroup="uid-a",
            status=PodStatus.RUNNING,
            node="n1",
            gpu=GpuRequest(devices=1),
        )
        for i in range(2)
    )
    pending = Pod(
        name="b-0", namespace="ns", podgroup="uid-b", status=PodStatus.PENDING, gpu=GpuRequest(devices=1)
    )
    return Snapshot(
        nodes=(Node(name="n1", cpu_millis=8000, memory_bytes=32e9, gpus=2),),
        pods=(*running, pending),
        podgroups=(group("a", "qa"), group("b", "qb")),
        queues=(Queue(name="qa", gpu=QueueResource(quota=0)), Queue(name="qb", gpu=QueueResource(quota=2))),
    )


def test_the_cycle_counts_what_each_action_did_in_the_order_they_ran() -> None:
    result = schedule(reclaim_cluster(), 1000.0, Policy())
    assert [a.action for a in result.actions] == list(Policy().actions)
    reclaim = {a.action: a for a in result.actions}["reclaim"]
    assert (reclaim.considered, reclaim.scheduled) == (1, 1)
    assert reclaim.scenarios_simulated >= 1
    assert reclaim.evicted == {"uid-a": 1}
    assert all(not a.evicted for a in result.actions if a.action != "reclaim")


def test_a_reclaim_is_counted_in_kais_series_under_the_evicted_podgroups_names() -> None:
    snapshot = reclaim_cluster()
    result = schedule(snapshot, 1000.0, Policy())
    metrics = attached()
    placement = PlacementMetrics(metrics)
    placement.observe_actions(result.actions, {pg.key: pg for pg in snapshot.podgroups}, "pool-a")
    body = text(metrics)
    assert 'kai_podgroups_scheduled_by_action{action="reclaim"} 1.0' in body
    assert 'kai_podgroups_acted_on_by_action{action="reclaim"} 1.0' in body
    assert "kai_total_preemption_attempts 0.0" in body
    evicted = families(metrics)["kai_pod_group_evicted_pods"]
    assert [(s.labels, s.value) for s in evicted.samples] == [
        ({"podgroup": "a", "namespace": "ns", "uid": "uid-a", "nodepool": "pool-a", "action": "reclaim"}, 1.0)
    ]


def test_a_podgroup_without_a_node_pool_is_in_kais_default_pool() -> None:
    metrics = attached()
    placement = PlacementMetrics(metrics)
    placement.observe_actions([ActionCounts(action="preempt", scheduled=2, evicted={"k": 3})], {}, "")
    samples = families(metrics)["kai_pod_group_evicted_pods"].samples
    assert [(s.labels["nodepool"], s.labels["podgroup"], s.value) for s in samples] == [("default", "k", 3.0)]
    assert "kai_total_preemption_attempts 2.0" in text(metrics)


def test_the_session_clock_splits_a_work_item_into_open_actions_and_close() -> None:
    metrics = attached()
    placement = PlacementMetrics(metrics)
    clock = placement.session_clock()
    with clock.action("allocate"):
        pass
    with clock.action("reclaim"):
        pass
    clock.finish()
    found = families(metrics)
    for name in ("kai_open_session_latency_milliseconds", "kai_close_session_latency_milliseconds"):
        assert found[name].samples[0].value >= 0
    actions = {s.labels["action"] for s in found["kai_action_scheduling_latency_milliseconds"].samples}
    assert actions == {"allocate", "reclaim"}


def test_kairos_search_has_no_budget_so_every_configured_budget_is_unlimited() -> None:
    found = families(every_service()["placement"])
    for name in (
        "kai_scenario_search_action_budget_configured_seconds",
        "kai_scenario_search_job_budget_configured_seconds",
        "kai_scenario_search_generator_budget_configured_seconds",
    ):
        assert found[name].samples
        assert all(s.value == 0 for s in found[name].samples)


def test_queue_usage_is_exported_only_while_time_based_fair_share_is_on() -> None:
    metrics = attached()
    queue = QueueMetrics(metrics)
    queue.observe_plan([share("q")], pending=0)
    assert not families(metrics)["kai_queue_gpu_usage"].samples
    queue.observe_plan([share("q", usage={"gpu": 0.5, "cpu": 0.25, "memory": 0.125})], pending=0)
    found = families(metrics)
    labels = {"queue_name": "q", "queue_metadata_name": "q", "queue_display_name": ""}
    assert [(s.labels, s.value) for s in found["kai_queue_gpu_usage"].samples] == [(labels, 0.5)]


# --- KaiCounter: hostile input ------------------------------------------------------------------------------
def test_a_kai_counter_refuses_the_wrong_label_count_and_going_down() -> None:
    counter = KaiCounter("kai_x", "x", ("action",))
    with pytest.raises(ValueError, match="kai_x"):
        counter.inc()
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc("allocate", amount=-1)


@pytest.mark.parametrize("value", ['a"b', "a\\b", "a\nb", "ünï"])
def test_a_kai_counter_escapes_label_values_as_the_text_format_asks(value: str) -> None:
    metrics = attached()
    counter = metrics.kai_counter("kai_x", "help with \\ and \n", ("action",))
    counter.inc(value, amount=2)
    family = families(metrics)["kai_x"]
    assert [(s.labels, s.value) for s in family.samples] == [({"action": value}, 2.0)]


# --- NATS consumer lag ------------------------------------------------------------------------------------------
def delivery(sid: int, consumer: str, pending: int, waited: float) -> Msg:
    """A JetStream message as nats-py delivers it to subscription `sid`: its reply subject tells its
    stream, consumer, the messages pending behind it and when it was stored (`waited` seconds ago)."""
    stored = time.time_ns() - int(waited * 1e9)
    reply = f"$JS.ACK.KAIROS_WORK.{consumer}.1.41.41.{stored}.{pending}"
    return Msg(_client=cast(Any, None), subject="kairos.work.default", reply=reply, _sid=sid)


def test_each_consumers_lag_is_exported_per_stream_and_consumer() -> None:
    counters = Counters()
    counters.consumed(delivery(1, "placement", pending=7, waited=1.5))
    metrics = ServiceMetrics()
    metrics.attach("placement", "p-1", None, counters, lambda: True)
    found = families(metrics)
    labels = {"stream": "KAIROS_WORK", "consumer": "placement"}
    assert [(s.labels, s.value) for s in found["kairos_nats_consumer_pending_messages"].samples] == [
        (labels, 7)
    ]
    [(shown, waited)] = [
        (s.labels, s.value) for s in found["kairos_nats_consumer_message_age_seconds"].samples
    ]
    assert shown == labels
    assert waited == pytest.approx(1.5, abs=1.0)


def test_the_lag_is_the_last_delivery_of_the_newest_subscription_to_each_consumer() -> None:
    counters = Counters()
    counters.consumed(delivery(1, "state-work-3", pending=9, waited=0.0))
    counters.consumed(delivery(2, "placement", pending=4, waited=0.0))
    counters.consumed(delivery(1, "state-work-3", pending=8, waited=0.0))
    counters.consumed(delivery(5, "state-work-3", pending=2, waited=0.0))  # subscribed anew: the older left
    counters.consumed(
        delivery(1, "state-work-3", pending=6, waited=0.0)
    )  # a late one on the old subscription

    lags = counters.consumer_lag
    assert {key: behind for key, (behind, _) in lags.items()} == {
        ("KAIROS_WORK", "state-work-3"): 2,
        ("KAIROS_WORK", "placement"): 4,
    }
    assert len(counters.consumer_lag) == 2  # the older subscription forgotten


def test_a_message_that_is_no_jetstream_delivery_leaves_the_lag_alone() -> None:
    class Plain:
        reply = ""

        @property
        def metadata(self) -> object:
            raise AttributeError("no metadata")

    counters = Counters()
    counters.consumed(Plain())  # type: ignore[arg-type]  # a stand-in for nats' Msg
    assert counters.consumer_lag == {}
