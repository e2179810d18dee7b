"""VolumeBinding and DRAGPUClaims (issue 30): pods with WaitForFirstConsumer claims and pods with a DRA GPU
claim from a template, as benchmark workloads. The objects the bus run creates translate into exactly the
snapshot the in-process core reads; the slices written for the in-process snapshot are the ones the
simulated GPU driver publishes; a tiny size runs in process and reports every figure, with every claim
bound, provisioned or allocated as the cluster would. No speed is asserted."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import msgspec
import pytest

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.kube import translate, wire
from shared.kubeapi.paths import collection_path
from shared.model import PodStatus, Snapshot
from shared.model.volumes import Claim, PersistentVolume
from tests.admitted_pods import admitted
from tools.bench import claims, workloads
from tools.bench.bus import _objects_wanted
from tools.bench.inprocess import run_inprocess
from tools.bench.manifests import NAMESPACE, pod_manifest
from tools.bench.workload import Workload
from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import SimOptions
from tools.kubesim.nodes import node_object

NAMES = ("VolumeBinding", "DRAGPUClaims")
FIGURES = {
    "workload",
    "mode",
    "nodes",
    "pods",
    "bound",
    "throughput_pods_s",
    "p50_ms",
    "p99_ms",
    "cpu_s",
    "cpu_s_by_process",
    "cpu_ms_per_pod",
    "peak_rss_mib",
    "duration_s",
    "cycles",
}


@pytest.fixture(scope="module")
def volume() -> Workload:
    return claims.volume_binding(nodes=12, initial=3, measured=12)


@pytest.fixture(scope="module")
def dra() -> Workload:
    return claims.dra_gpu_claims(nodes=4, initial=2, measured=12)


# --- the shapes ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_both_workloads_are_registered_at_5000_nodes_with_a_small_quick_size(name: str) -> None:
    assert name in workloads.NAMES
    full, quick = workloads.build(name), workloads.build(name, quick=True)
    assert (full.name, quick.name) == (name, name)
    assert (len(full.nodes), len(full.counted)) == (5000, 5000)
    assert len(quick.nodes) < len(full.nodes)
    assert 0 < len(quick.counted) < len(full.counted)


def test_every_measured_volume_pod_has_one_claim_static_and_dynamic_in_turn(volume: Workload) -> None:
    classes = {c.key: c.storage_class for c in volume.volumes.claims}
    pods = [p for g in volume.measured for p in g.pods]
    assert all(len(p.claims) == 1 for p in pods)
    kinds = [classes[f"{NAMESPACE}/{p.claims[0]}"] for p in pods]
    assert kinds == [claims.STATIC_CLASS, claims.DYNAMIC_CLASS] * (len(pods) // 2)
    assert not [p for g in volume.initial for p in g.pods if p.claims]


def test_both_classes_wait_for_the_first_consumer_and_only_the_dynamic_one_provisions(
    volume: Workload,
) -> None:
    by_name = {c.name: c for c in volume.volumes.classes}
    assert {c.binding_mode for c in by_name.values()} == {"WaitForFirstConsumer"}
    assert not by_name[claims.STATIC_CLASS].provisions
    assert by_name[claims.DYNAMIC_CLASS].provisions
    zones = by_name[claims.DYNAMIC_CLASS].allowed_topologies
    assert [t.requirements for t in zones] == [{claims.ZONE_LABEL: ("zone1", "zone2")}]


def test_every_node_has_one_free_local_volume_pinned_to_it_and_an_attach_limit(volume: Workload) -> None:
    pinned = Counter(v.node_affinity[0].requirements[0].values for v in volume.volumes.volumes)
    assert pinned == Counter((n.name,) for n in volume.nodes)
    assert {(v.claim_ref, v.storage_class) for v in volume.volumes.volumes} == {("", claims.STATIC_CLASS)}
    assert {n.name: n.limits for n in volume.volumes.csi_nodes} == {
        n.name: {claims.CSI_DRIVER: claims.ATTACH_LIMIT} for n in volume.nodes
    }


def test_every_measured_dra_pod_asks_one_gpu_through_its_templates_claim_and_none_otherwise(
    dra: Workload,
) -> None:
    made = {c.key: c for c in dra.dra.claims}
    for pod in (p for g in dra.measured for p in g.pods):
        assert pod.gpu.devices == 0
        [entry] = pod.resource_claims
        assert entry.template == claims.TEMPLATE
        [request] = made[f"{NAMESPACE}/{entry.claim}"].requests
        assert (request.device_class, request.count, request.mode) == ("gpu.nvidia.com", 1, "ExactCount")
    assert {p.gpu.devices for g in dra.initial for p in g.pods} == {0}


def test_the_in_process_slices_are_the_ones_the_simulated_driver_publishes() -> None:
    workload = claims.dra_gpu_claims(nodes=3, initial=0, measured=1)
    cluster = build_cluster(SimOptions(seed=1, default_scheduler=False), clock=lambda: 0.0)
    for node in workload.nodes:
        cluster.create(cluster.type_of("nodes"), None, node_object(node))
    cluster.settle()
    published = sorted(
        (claims.dra_object(s) for s in cluster.objects("resource.k8s.io/resourceslices")),
        key=lambda s: s.name,
    )
    published_classes = sorted(
        (claims.dra_object(c) for c in cluster.objects("resource.k8s.io/deviceclasses")),
        key=lambda c: c.name,
    )
    assert tuple(published) == workload.dra.slices
    assert tuple(published_classes) == workload.dra.classes


def test_the_in_process_csi_nodes_are_the_ones_the_simulated_cluster_makes() -> None:
    workload = claims.volume_binding(nodes=3, initial=0, measured=2)
    cluster = build_cluster(SimOptions(seed=1, default_scheduler=False), clock=lambda: 0.0)
    for node in workload.nodes:
        cluster.create(cluster.type_of("nodes"), None, node_object(node))
    cluster.settle()
    made = sorted(
        (claims.storage_object(n) for n in cluster.objects("storage.k8s.io/csinodes")), key=lambda n: n.name
    )
    assert tuple(made) == workload.volumes.csi_nodes


@pytest.mark.parametrize(
    ("api_version", "kind", "namespace", "path"),
    [
        ("storage.k8s.io/v1", "StorageClass", None, "/apis/storage.k8s.io/v1/storageclasses"),
        ("v1", "PersistentVolume", None, "/api/v1/persistentvolumes"),
        ("v1", "PersistentVolumeClaim", "default", "/api/v1/namespaces/default/persistentvolumeclaims"),
        (
            "resource.k8s.io/v1",
            "ResourceClaimTemplate",
            "default",
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates",
        ),
    ],
)
def test_the_bus_run_creates_each_kind_at_its_collection(
    api_version: str, kind: str, namespace: str | None, path: str
) -> None:
    assert collection_path(api_version, kind, namespace) == path


def test_the_bus_run_waits_for_every_object_but_the_claims(volume: Workload, dra: Workload) -> None:
    assert _objects_wanted(volume) == {
        "PersistentVolume": len(volume.nodes),
        "StorageClass": 2,
        "CsiNode": len(volume.nodes),
    }
    assert _objects_wanted(dra) == {
        "DeviceClass": 2,
        "ResourceSlice": 2 * len(dra.nodes),
        "ResourceClaimTemplate": 1,
    }


@pytest.mark.parametrize("name", NAMES)
def test_the_pods_manifests_translate_back_to_their_claims(name: str) -> None:
    workload = workloads.build(name, quick=True)
    for group in workload.measured[:10]:
        for pod in group.pods:
            back = translate.pod_of(
                wire.decode("pods", json.dumps(admitted(pod_manifest(pod, group.podgroup))))
            )
            assert back.claims == pod.claims
            # Over the bus the template's claim is not made yet: the controller names it in the status.
            assert [(c.name, c.template) for c in back.resource_claims] == [
                (c.name, c.template) for c in pod.resource_claims
            ]


def test_the_setup_objects_are_the_ones_in_the_in_process_snapshot(volume: Workload, dra: Workload) -> None:
    setup = Counter(o["kind"] for o in volume.setup)
    assert setup == {"StorageClass": 2, "PersistentVolume": len(volume.nodes)}
    assert [o["kind"] for g in volume.measured for o in g.setup] == ["PersistentVolumeClaim"] * len(
        volume.measured
    )
    assert [claims.storage_object(o) for g in volume.measured for o in g.setup] == list(volume.volumes.claims)
    assert [claims.dra_object(o) for o in dra.setup] == list(dra.dra.templates)


# --- in process -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [claims.volume_binding, claims.dra_gpu_claims])
def test_a_tiny_size_binds_every_pod_in_process_and_reports_every_figure(
    build: Callable[[int, int, int], Workload],
) -> None:
    workload = build(8, 2, 8)
    record = run_inprocess(workload)
    assert set(msgspec.to_builtins(record)) >= FIGURES
    assert (record.mode, record.nodes, record.pods, record.bound) == ("inprocess", 8, 8, 8)
    assert record.throughput_pods_s > 0
    assert 0 < record.p50_ms <= record.p99_ms
    assert record.cpu_s > 0
    assert record.cpu_ms_per_pod["inprocess"] > 0
    assert record.note == ""


def _bound_state(workload: Workload) -> claims.ClaimsState:
    """The claims once every measured pod is bound, by replaying one in-process cycle's bindings."""
    state = claims.ClaimsState(workload)
    snapshot = Snapshot(
        nodes=workload.nodes,
        pods=tuple(p for g in (*workload.initial, *workload.measured) for p in g.pods),
        podgroups=tuple(g.podgroup for g in (*workload.initial, *workload.measured)),
        queues=workload.queues,
        volumes=state.volumes,
        dra=state.dra,
    )
    result = schedule(snapshot, 0.0, Policy())
    for proposal in result.binds:
        for binding in proposal.bindings:
            state.bound(binding)
    state.refresh()
    assert sum(len(p.bindings) for p in result.binds) == len(workload.counted)
    return state


def test_in_process_every_claim_ends_bound_static_ones_on_their_nodes_volume(volume: Workload) -> None:
    state = _bound_state(volume)
    pvs = {v.name: v for v in state.volumes.volumes}
    bound: list[tuple[Claim, PersistentVolume]] = [(c, pvs[c.volume_name]) for c in state.volumes.claims]
    assert all(c.bound for c, _ in bound)
    assert all(pv.claim_ref == c.key and pv.phase == "Bound" for c, pv in bound)
    static = [pv for c, pv in bound if c.storage_class == claims.STATIC_CLASS]
    dynamic = [pv for c, pv in bound if c.storage_class == claims.DYNAMIC_CLASS]
    assert static
    assert dynamic
    assert all(pv.name.startswith("local-") for pv in static)
    assert all(pv.name.startswith("pvc-") and pv.csi_driver == claims.CSI_DRIVER for pv in dynamic)
    assert len({pv.name for _, pv in bound}) == len(bound)


def test_in_process_every_dra_claim_ends_allocated_one_gpu_each_none_shared(dra: Workload) -> None:
    state = _bound_state(dra)
    made = state.dra.claims
    assert all(c.allocated and len(c.devices) == 1 and len(c.reserved_for) == 1 for c in made)
    devices = [d.id for c in made for d in c.devices]
    assert len(set(devices)) == len(devices) == len(dra.counted)
    assert {driver for driver, _, _ in devices} == {"gpu.nvidia.com"}
    assert all(c.node and c.devices[0].pool == c.node for c in made)


def test_pods_before_the_measurement_run_on_distinct_nodes(volume: Workload, dra: Workload) -> None:
    for workload in (volume, dra):
        running = [p for g in workload.initial for p in g.pods]
        assert {p.status for p in running} == {PodStatus.RUNNING}
        assert len({p.node for p in running}) == len(running)
