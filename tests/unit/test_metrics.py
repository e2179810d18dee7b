"""Specifications of `shared.telemetry.metrics`: the process registry, the series read from a service's
heartbeat counters, each service's set under KAI's names, types, labels, units and buckets, and the
core's per-action hook. Every check reads the text exposition back through prometheus-client's parser,
as Prometheus would."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from shared.bus.middleware import Counters
from shared.contracts.events import QueueFairShare
from shared.core.cycle import run_session
from shared.core.policy import Policy
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import PodSet, SubGroupSet
from shared.telemetry.metrics import (
    KAI_LATENCY_BUCKETS_MS,
    BinderMetrics,
    Derived,
    GpuAgentMetrics,
    PlacementMetrics,
    QueueMetrics,
    ServiceMetrics,
    StateMetrics,
    count_kinds,
    subject_family,
)


def scrape(metrics: ServiceMetrics) -> dict[str, Metric]:
    body, content_type = metrics.expose()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def value(families: dict[str, Metric], family: str, sample: str | None = None, /, **labels: str) -> float:
    """The one sample of `family` (sample name `sample`, default the family's name) with `labels`."""
    wanted = sample or family
    found = [s.value for s in families[family].samples if s.name == wanted and s.labels == labels]
    assert len(found) == 1, (family, labels, families[family].samples)
    return found[0]


def attached(counters: Counters | None = None, *, ready: bool = True) -> ServiceMetrics:
    metrics = ServiceMetrics()
    metrics.attach("placement", "p-1", None, counters if counters is not None else Counters(), lambda: ready)
    return metrics


# --- subjects -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("subject", "family"),
    [
        ("kairos.work.default", "kairos.work"),
        ("kairos.proposals.pool-a", "kairos.proposals"),
        ("kairos.outcomes.default", "kairos.outcomes"),
        ("kairos.events.pod-bound.ns/pod-1", "kairos.events.pod-bound"),
        ("kairos.cluster.bind", "kairos.cluster.bind"),
        ("kairos.admin.default.cycle", "kairos.admin"),
        ("kairos.gpu.inventory.node-7", "kairos.gpu.inventory"),
        ("kairos.state.snapshot", "kairos.state.snapshot"),
        ("garbage", "garbage"),
    ],
)
def test_a_subject_family_keeps_the_bounded_tokens_and_drops_names(subject: str, family: str) -> None:
    assert subject_family(subject) == family


# --- the runner's series ------------------------------------------------------------------------------------
def test_before_a_service_attaches_only_readiness_and_the_process_are_exposed() -> None:
    families = scrape(ServiceMetrics())
    own = {name for name in families if not name.startswith(("process_", "python_gc_"))}
    assert own == {"kairos_service_ready"}
    assert value(families, "kairos_service_ready") == 0


def test_readiness_follows_the_service_at_every_scrape() -> None:
    state = {"ready": False}
    metrics = ServiceMetrics()
    metrics.attach("queue", "q-1", None, Counters(), lambda: state["ready"])
    assert value(scrape(metrics), "kairos_service_ready") == 0
    state["ready"] = True
    assert value(scrape(metrics), "kairos_service_ready") == 1


def info_series(metrics: ServiceMetrics) -> list[dict[str, str]]:
    return [sample.labels for sample in scrape(metrics)["kairos_service_info"].samples]


def test_the_info_series_names_service_replica_and_shard_without_a_service_label() -> None:
    # `service` is the label a ServiceMonitor scrape adds (the Kubernetes Service): never ours.
    assert info_series(attached()) == [
        {"kairos_service": "placement", "replica": "p-1", "shard": "default", "restricted": "false"}
    ]


def test_a_replica_serving_every_shard_has_one_info_series_per_shard_it_serves_as_they_come_and_go() -> None:
    metrics = attached()
    served = ["default", "pool-a"]
    metrics.serving(lambda: served, restricted=False)
    assert [(s["shard"], s["restricted"]) for s in info_series(metrics)] == [
        ("default", "false"),
        ("pool-a", "false"),
    ]
    served[:] = ["default", "pool-b"]
    assert [s["shard"] for s in info_series(metrics)] == ["default", "pool-b"]


def test_a_restricted_replica_s_info_series_say_it_is_restricted() -> None:
    metrics = ServiceMetrics()
    metrics.attach("binder", "b-1", "pool-a,pool-b", Counters(), lambda: True)
    assert [(s["shard"], s["restricted"]) for s in info_series(metrics)] == [("pool-a,pool-b", "true")]
    metrics.serving(lambda: ["pool-b", "pool-a"], restricted=True)
    assert [(s["shard"], s["restricted"]) for s in info_series(metrics)] == [
        ("pool-a", "true"),
        ("pool-b", "true"),
    ]


def test_a_replica_started_with_shard_default_is_restricted_to_it_and_says_so() -> None:
    # `--shard default` serves the default shard alone, where no `--shard` serves every shard.
    metrics = ServiceMetrics()
    metrics.attach("placement", "p-1", "default", Counters(), lambda: True)
    assert info_series(metrics) == [
        {"kairos_service": "placement", "replica": "p-1", "shard": "default", "restricted": "true"}
    ]


def test_every_service_exports_its_resident_memory_and_the_collectors_work() -> None:
    families = scrape(attached())
    assert value(families, "process_resident_memory_bytes") > 0
    collections = families["python_gc_collections"]
    assert {s.labels["generation"] for s in collections.samples} == {"0", "1", "2"}


def test_every_heartbeat_counter_is_a_prometheus_counter_by_name() -> None:
    counters = Counters(proposals=3, work_items=4)
    families = scrape(attached(counters))
    family = families["kairos_service_counter"]
    assert family.type == "counter"
    assert value(families, "kairos_service_counter", "kairos_service_counter_total", name="proposals") == 3
    counters["proposals"] += 2
    assert (
        value(
            scrape(attached(counters)),
            "kairos_service_counter",
            "kairos_service_counter_total",
            name="proposals",
        )
        == 5
    )


def test_a_heartbeat_value_that_is_set_not_counted_is_a_gauge() -> None:
    families = scrape(attached(Counters(unhealthy_devices=2)))
    assert value(families, "kairos_service_gauge", name="unhealthy_devices") == 2
    names = {s.labels.get("name") for s in families["kairos_service_counter"].samples}
    assert "unhealthy_devices" not in names


def test_middleware_outcomes_are_counted_by_subject_family_and_malformed_drops_in_total() -> None:
    counters = Counters()
    counters.message("handled", "kairos.work.default")
    counters.message("handled", "kairos.work.pool-b")
    counters.message("malformed", "kairos.work.default")
    counters["malformed"] += 1  # a request path outside the middleware
    families = scrape(attached(counters))
    total = "kairos_messages_total"
    assert value(families, "kairos_messages", total, subject="kairos.work", outcome="handled") == 2
    assert value(families, "kairos_messages", total, subject="kairos.work", outcome="malformed") == 1
    assert (
        value(families, "kairos_malformed_messages_dropped", "kairos_malformed_messages_dropped_total") == 2
    )


def test_each_process_registry_is_its_own() -> None:
    one, two = attached(Counters(proposals=1)), attached(Counters(proposals=7))
    PlacementMetrics(one)
    PlacementMetrics(two)  # the same names again, in another registry: no clash
    name = ("kairos_service_counter", "kairos_service_counter_total")
    assert value(scrape(one), *name, name="proposals") == 1
    assert value(scrape(two), *name, name="proposals") == 7


def test_no_created_series_are_written_as_in_kai_go_client() -> None:
    body, _ = attached(Counters(proposals=1)).expose()
    assert b"_created" not in body


# --- series derived from counters ---------------------------------------------------------------------------
def test_a_derived_counter_maps_label_values_to_counter_names() -> None:
    counters = Counters(committed=4, conflicts=1)
    metrics = attached(counters)
    metrics.derive(
        [
            Derived(
                "x_total", "x", label="status", keys=(("committed", "committed"), ("conflict", "conflicts"))
            )
        ]
    )
    families = scrape(metrics)
    assert value(families, "x", "x_total", status="committed") == 4
    assert value(families, "x", "x_total", status="conflict") == 1


def test_a_derived_counter_by_suffix_labels_each_matching_counter_with_the_rest_of_its_name() -> None:
    metrics = attached(Counters(bind_retries=3, evict_retries=1, binds=9))
    metrics.derive([Derived("r_total", "r", label="operation", suffix="_retries")])
    families = scrape(metrics)
    assert {s.labels["operation"]: s.value for s in families["r"].samples} == {"bind": 3, "evict": 1}


def test_a_derived_counter_never_counted_reads_zero() -> None:
    metrics = attached()
    metrics.derive([Derived("y_total", "y", key="never")])
    assert value(scrape(metrics), "y", "y_total") == 0


# --- placement ----------------------------------------------------------------------------------------------
def test_placement_exposes_kai_latencies_with_kai_types_and_buckets() -> None:
    metrics = attached()
    placement = PlacementMetrics(metrics)
    with placement.action_timer("allocate"):
        pass
    placement.observe_item(0.25, placed=2, pipelined=1, pending=3, task_latencies=[0.003, 0.040, 9.0])
    families = scrape(metrics)

    assert families["kai_e2e_scheduling_latency_milliseconds"].type == "gauge"
    assert value(families, "kai_e2e_scheduling_latency_milliseconds") == pytest.approx(250.0)
    assert families["kai_action_scheduling_latency_milliseconds"].type == "gauge"
    assert value(families, "kai_action_scheduling_latency_milliseconds", action="allocate") >= 0

    task = families["kai_task_scheduling_latency_milliseconds"]
    assert task.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in task.samples if s.name.endswith("_bucket")}
    assert list(buckets) == [*(str(b) for b in KAI_LATENCY_BUCKETS_MS), "+Inf"]
    assert list(KAI_LATENCY_BUCKETS_MS) == [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560]
    assert (buckets["5.0"], buckets["40.0"], buckets["2560.0"], buckets["+Inf"]) == (1, 2, 2, 3)


def test_placement_counts_podgroups_of_each_work_item_by_outcome() -> None:
    metrics = attached()
    placement = PlacementMetrics(metrics)
    placement.observe_item(0.1, placed=2, pipelined=0, pending=1)
    placement.observe_item(0.1, placed=1, pipelined=0, pending=0)
    families = scrape(metrics)
    assert value(families, "kairos_placement_cycle_podgroups", outcome="placed") == 1
    assert value(families, "kairos_placement_cycle_podgroups", outcome="pending") == 0
    total = "kairos_placement_podgroups_total"
    assert value(families, "kairos_placement_podgroups", total, outcome="placed") == 3
    assert value(families, "kairos_placement_podgroups", total, outcome="pending") == 1


def test_a_negative_task_latency_from_a_skewed_clock_counts_as_zero() -> None:
    metrics = attached()
    PlacementMetrics(metrics).observe_item(0.1, placed=1, pipelined=0, pending=0, task_latencies=[-2.0])
    families = scrape(metrics)
    name = "kai_task_scheduling_latency_milliseconds"
    assert value(families, name, f"{name}_bucket", le="5.0") == 1
    assert value(families, name, f"{name}_sum") == 0


# --- the core's hook -----------------------------------------------------------------------------------------
def small_cluster() -> Snapshot:
    group = PodGroup(
        name="g", namespace="ns", queue="q", root=SubGroupSet(name="root", pod_sets=(PodSet("default", 1),))
    )
    pod = Pod(name="g-0", namespace="ns", podgroup="g", status=PodStatus.PENDING, gpu=GpuRequest(devices=1))
    return Snapshot(
        nodes=(Node(name="n1", cpu_millis=8000, memory_bytes=32e9, gpus=2),),
        pods=(pod,),
        podgroups=(group,),
        queues=(Queue(name="q", gpu=QueueResource(quota=2)),),
    )


def test_run_session_wraps_each_action_it_runs_in_order() -> None:
    seen: list[str] = []

    @contextlib.contextmanager
    def around(name: str) -> Iterator[None]:
        seen.append(name)
        yield

    policy = Policy()
    run_session(small_cluster(), 1000.0, policy, around_action=around)
    assert seen == list(policy.actions)


def test_the_action_timer_is_what_placement_hands_the_core() -> None:
    metrics = attached()
    placement = PlacementMetrics(metrics)
    policy = Policy()
    run_session(small_cluster(), 1000.0, policy, around_action=placement.action_timer)
    families = scrape(metrics)
    timed = {s.labels["action"] for s in families["kai_action_scheduling_latency_milliseconds"].samples}
    assert timed == set(policy.actions)


# --- binder ---------------------------------------------------------------------------------------------------
def test_bind_latency_is_observed_only_inside_a_proposal() -> None:
    metrics = attached()
    binder = BinderMetrics(metrics)
    binder.bind_answered()  # the recovery scan's bind: no proposal, not KAI's bind latency
    with binder.proposal():
        binder.bind_answered()
        binder.bind_answered()
    families = scrape(metrics)
    name = "kai_task_bind_latency_milliseconds"
    assert families[name].type == "histogram"
    assert value(families, name, f"{name}_count") == 2
    assert value(families, "kairos_binder_proposal_seconds", "kairos_binder_proposal_seconds_count") == 1


def test_binder_proposals_by_status_and_cas_by_result() -> None:
    counters = Counters(committed=5, conflicts=2, fenced=1, bind_retries=4)
    metrics = attached(counters)
    binder = BinderMetrics(metrics)
    binder.cas_attempt("create", ok=True)
    binder.cas_attempt("update", ok=False)
    families = scrape(metrics)
    proposals = ("kairos_binder_proposals", "kairos_binder_proposals_total")
    assert value(families, *proposals, status="committed") == 5
    assert value(families, *proposals, status="conflict") == 2
    assert value(families, *proposals, status="fenced") == 1
    assert value(families, *proposals, status="failed") == 0
    cas = ("kairos_binder_ledger_cas", "kairos_binder_ledger_cas_total")
    assert value(families, *cas, operation="create", result="ok") == 1
    assert value(families, *cas, operation="update", result="conflict") == 1
    retries = ("kairos_binder_cluster_retries", "kairos_binder_cluster_retries_total")
    assert value(families, *retries, operation="bind") == 4


# --- queue ------------------------------------------------------------------------------------------------------
def share(queue: str, **numbers: dict[str, float]) -> QueueFairShare:
    zero = {"gpu": 0.0, "cpu": 0.0, "memory": 0.0}
    return QueueFairShare(
        time=0.0,
        queue=queue,
        parent=None,
        fair_share=numbers.get("fair_share", zero),
        allocated=numbers.get("allocated", zero),
        requested=numbers.get("requested", zero),
        deserved=numbers.get("deserved", zero),
    )


def test_queue_gauges_carry_kai_names_label_and_units() -> None:
    metrics = attached()
    queue = QueueMetrics(metrics)
    queue.observe_plan(
        [
            share(
                "team-a",
                fair_share={"gpu": 3.5, "cpu": 2500.0, "memory": 4e9},
                allocated={"gpu": 2.0, "cpu": 1000.0, "memory": 2e9},
                requested={"gpu": 6.0, "cpu": 3000.0, "memory": 8e9},
                deserved={"gpu": 4.0, "cpu": -1.0, "memory": 16e9},
            )
        ],
        pending=2,
    )
    f = scrape(metrics)
    q = {"queue_name": "team-a", "queue_metadata_name": "team-a", "queue_display_name": ""}
    assert value(f, "kai_queue_fair_share_gpu", **q) == 3.5
    assert value(f, "kai_queue_fair_share_cpu_cores", **q) == 2.5
    assert value(f, "kai_queue_fair_share_memory_gb", **q) == 4.0
    assert value(f, "kai_queue_allocated_gpus", **q) == 2.0
    assert value(f, "kai_queue_allocated_cpu_cores", **q) == 1.0
    assert value(f, "kai_queue_allocated_memory_bytes", **q) == 2e9
    assert value(f, "kai_queue_deserved_gpus", **q) == 4.0
    assert value(f, "kai_queue_quota_cpu_cores", **q) == -1  # unlimited stays -1, as in KAI
    assert value(f, "kai_queue_quota_memory_bytes", **q) == 16e9
    assert value(f, "kai_queue_info", **q) == 1
    assert value(f, "kairos_queue_requested_gpus", **q) == 6.0
    assert value(f, "kairos_queue_requested_cpu_cores", **q) == 3.0
    assert value(f, "kairos_queue_requested_memory_bytes", **q) == 8e9
    assert value(f, "kairos_queue_pending_podgroups") == 2


def test_a_queue_gone_from_the_plan_disappears_from_the_gauges() -> None:
    metrics = attached()
    queue = QueueMetrics(metrics)
    queue.observe_plan([share("a"), share("b")], pending=0)
    queue.observe_plan([share("a")], pending=0)
    names = {s.labels["queue_name"] for s in scrape(metrics)["kai_queue_fair_share_gpu"].samples}
    assert names == {"a"}


def test_losing_the_lease_clears_the_queues_and_counts_the_change() -> None:
    metrics = attached()
    queue = QueueMetrics(metrics)
    queue.leadership(True, term=4)
    queue.observe_plan([share("a")], pending=1)
    families = scrape(metrics)
    assert value(families, "kairos_queue_leader") == 1
    assert value(families, "kairos_queue_lease_term") == 4

    queue.leadership(False, term=4)
    families = scrape(metrics)
    assert value(families, "kairos_queue_leader") == 0
    assert families["kai_queue_fair_share_gpu"].samples == []
    changes = ("kairos_queue_lease_changes", "kairos_queue_lease_changes_total")
    assert value(families, *changes, change="acquired") == 1
    assert value(families, *changes, change="lost") == 1


def test_the_work_round_trip_is_a_histogram_in_seconds() -> None:
    metrics = attached()
    QueueMetrics(metrics).work_round_trip(0.02)
    families = scrape(metrics)
    name = "kairos_queue_work_round_trip_seconds"
    assert families[name].type == "histogram"
    assert value(families, name, f"{name}_bucket", le="0.025") == 1
    assert value(families, name, f"{name}_bucket", le="0.01") == 0


# --- state and GPU agent ----------------------------------------------------------------------------------------
class FakeInformer:
    def __init__(self, what: str, relists: int, errors: int) -> None:
        self.what, self.relists, self.errors = what, relists, errors


def test_state_reads_objects_revision_and_informers_at_scrape_time() -> None:
    metrics = attached(Counters(state_writes=12, kube_events=3, pods_grouped=2, snapshots=5))
    state = StateMetrics(metrics)
    keys = ["node.n1", "node.n2", "pod.ns.a", "queue.q"]
    state.watch(
        objects=lambda: count_kinds(k.partition(".")[0] for k in keys),
        revision=lambda: 42,
        informers=lambda: [FakeInformer("pods", relists=2, errors=1)],
    )
    keys.append("pod.ns.b")
    f = scrape(metrics)
    assert {s.labels["kind"]: s.value for s in f["kairos_state_objects"].samples} == {
        "node": 2,
        "pod": 2,
        "queue": 1,
    }
    assert value(f, "kairos_state_revision") == 42
    assert (
        value(f, "kairos_state_informer_relists", "kairos_state_informer_relists_total", resource="pods") == 2
    )
    assert (
        value(f, "kairos_state_informer_errors", "kairos_state_informer_errors_total", resource="pods") == 1
    )
    assert value(f, "kairos_state_kv_writes", "kairos_state_kv_writes_total", bucket="state") == 12
    assert value(f, "kairos_state_writeback", "kairos_state_writeback_total", kind="event") == 3
    assert value(f, "kairos_state_podgrouper", "kairos_state_podgrouper_total", result="grouped") == 2
    assert value(f, "kairos_state_snapshot_requests", "kairos_state_snapshot_requests_total") == 5


def test_state_without_a_kubernetes_source_exposes_no_informer_samples() -> None:
    metrics = attached()
    StateMetrics(metrics)
    families = scrape(metrics)
    assert families["kairos_state_informer_relists"].samples == []


def test_the_gpu_agent_exposes_unhealthy_devices_as_a_gauge() -> None:
    metrics = attached(Counters(inventories=3, unhealthy_devices=1))
    GpuAgentMetrics(metrics)
    families = scrape(metrics)
    assert families["kairos_gpu_unhealthy_devices"].type == "gauge"
    assert value(families, "kairos_gpu_unhealthy_devices") == 1
    total = "kairos_gpu_inventories_published_total"
    assert value(families, "kairos_gpu_inventories_published", total) == 3
