"""Kubernetes objects to Kairos's model, and the JSON written back, as KAI reads and writes them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import keys, translate, wire
from shared.model import GpuRequest, LabelSelectorTerm, NodeSelectorRequirement, PodStatus
from shared.model.objects import Taint, Toleration
from tests.admitted_pods import admitted
from tests.builders import READY, node_manifest, pod_manifest, podgroup_manifest, queue_manifest, stored

T = TypeVar("T")
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


# --- builders: objects as the API server returns them ------------------------------------------------------
def node_doc(**allocatable: str) -> dict[str, Any]:
    """An H100 node of Kubernetes' own making: allocatable `allocatable` (what its kubelet reserves taken off
    by default), and a capacity of 64 cores, 528 GiB, 110 pods and 8 GPUs."""
    labels = {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    status = {
        "allocatable": allocatable
        or {
            "cpu": "63900m",
            "memory": "527839264Ki",
            "pods": "110",
            "nvidia.com/gpu": "8",
            "ephemeral-storage": "1Ti",
        },
        "capacity": {"cpu": "64", "memory": "528Gi", "pods": "110", "nvidia.com/gpu": "8"},
        "conditions": [{**READY, "reason": "KubeletReady"}],
    }
    manifest = node_manifest("gpu-node-1", labels=labels)
    doc = stored(manifest, uid="7d1c", resource_version=None, created=None, status=status)
    return {**doc, "spec": {"podCIDR": "10.0.1.0/24"}}


def node(doc: dict[str, Any]) -> wire.Node:
    return wire.convert(wire.Node, doc)


def pod_doc(
    requests: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """Pending pod train-0 of podgroup pg-train in team-a asking for `requests` (one core and 1 GiB by
    default), with `spec`'s fields."""
    manifest = pod_manifest(
        "train-0",
        "team-a",
        labels=labels,
        annotations={keys.PODGROUP_ANNOTATION: "pg-train", **(annotations or {})},
        requests=requests or {"cpu": "1", "memory": "1Gi"},
        **spec,
    )
    return stored(manifest, uid="pod-uid-0", resource_version=None)


def pod(doc: dict[str, Any]) -> wire.Pod:
    """The pod as stored after admission (a fractional pod gets its GPU-sharing environment)."""
    doc = admitted(doc)
    return wire.convert(wire.Pod, doc)


def queue_doc(resources: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """Queue team-a under research with `resources` (none: its spec has none) and `spec`'s fields."""
    doc = queue_manifest("team-a", "research", resources=resources, **spec)
    if resources is None:
        del doc["spec"]["resources"]
    return doc


def podgroup_doc(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """PodGroup pg-train of team-a in queue team-a, without a minMember unless `spec` gives one."""
    manifest = podgroup_manifest("pg-train", None, "team-a", "team-a", annotations=annotations or {}, **spec)
    return stored(manifest, uid="pg-uid", resource_version=None)


def podgroup(doc: dict[str, Any], **kwargs: Any) -> Any:
    kwargs.setdefault("priority_classes", {"train": 50, "build": 100, "inference": 125})
    return translate.podgroup_of(wire.convert(wire.PodGroup, doc), **kwargs)


# --- nodes -----------------------------------------------------------------------------------------------
def test_a_node_has_its_allocatable_in_kairos_units() -> None:
    n = translate.node_of(node(node_doc()))
    assert n.name == "gpu-node-1"
    assert n.cpu_millis == 63_900
    assert n.memory_bytes == 527_839_264 * 1024
    assert n.max_pods == 110
    assert n.gpus == 8


def test_gpu_memory_comes_from_the_gfd_label_floored_to_100_mib() -> None:
    n = translate.node_of(node(node_doc()))
    assert (n.gpu_memory_mib, n.gpu_memory_synced) == (81_500, True)


def test_a_gpu_memory_label_in_bytes_is_read_as_bytes() -> None:
    doc = node_doc()
    doc["metadata"]["labels"]["nvidia.com/gpu.memory"] = str(40 * 1024**3)
    assert translate.node_of(node(doc)).gpu_memory_mib == 40_900


def test_without_the_gpu_memory_label_a_node_has_100_mib_unsynced() -> None:
    doc = node_doc()
    del doc["metadata"]["labels"]["nvidia.com/gpu.memory"]
    n = translate.node_of(node(doc))
    assert (n.gpu_memory_mib, n.gpu_memory_synced) == (100, False)


def test_a_gpu_node_with_less_than_100_mib_per_gpu_is_invalid() -> None:
    doc = node_doc()
    doc["metadata"]["labels"]["nvidia.com/gpu.memory"] = "50"
    with pytest.raises(InvalidObject) as info:
        translate.node_of(node(doc))
    assert info.value.field == "metadata.labels[nvidia.com/gpu.memory]"


def test_mig_instances_become_scalars_and_enable_mig() -> None:
    doc = node_doc(**{"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/mig-1g.10gb": "7"})
    doc["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    n = translate.node_of(node(doc))
    assert n.scalars == {"nvidia.com/mig-1g.10gb": 7.0}
    assert (n.mig_enabled, n.mig_strategy) == (True, "mixed")


def test_the_mig_enabled_role_label_decides_over_mig_resources() -> None:
    doc = node_doc(**{"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/mig-1g.10gb": "7"})
    doc["metadata"]["labels"][keys.MIG_ENABLED_LABEL] = "false"
    doc["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    n = translate.node_of(node(doc))
    assert (n.mig_enabled, n.mig_strategy) == (False, None)


def test_an_unknown_mig_strategy_is_none() -> None:
    doc = node_doc()
    doc["metadata"]["labels"].update({keys.MIG_ENABLED_LABEL: "true", "nvidia.com/mig.strategy": "none"})
    n = translate.node_of(node(doc))
    assert (n.mig_enabled, n.mig_strategy) == (True, None)


def test_extended_resources_huge_pages_and_ephemeral_storage_are_scalars_kubernetes_io_ones_are_not() -> None:
    doc = node_doc(
        **{
            "cpu": "8",
            "memory": "1Gi",
            "pods": "10",
            "rdma/hca": "1k",
            "ephemeral-storage": "1Ti",
            "hugepages-2Mi": "0",
            "kubernetes.io/batteries": "4",
        }
    )
    assert translate.node_of(node(doc)).scalars == {
        "ephemeral-storage": float(2**40),
        "hugepages-2Mi": 0.0,
        "rdma/hca": 1000.0,
    }


def test_a_node_without_a_pods_allocatable_takes_no_pods_as_in_kai() -> None:
    assert translate.node_of(node(node_doc(cpu="8", memory="1Gi"))).max_pods == 0


def test_every_node_carries_its_name_as_a_label_for_match_fields() -> None:
    n = translate.node_of(node(node_doc()))
    assert n.labels[keys.NODE_NAME_LABEL] == "gpu-node-1"
    assert n.labels["kubernetes.io/hostname"] == "gpu-node-1"


def test_a_cordoned_node_is_tainted_unschedulable() -> None:
    doc = node_doc()
    doc["spec"]["unschedulable"] = True
    assert translate.node_of(node(doc)).taints == (Taint(keys.UNSCHEDULABLE_TAINT, "", "NoSchedule"),)


@pytest.mark.parametrize(
    ("ready", "taint"),
    [("False", keys.NOT_READY_TAINT), ("Unknown", keys.UNREACHABLE_TAINT)],
)
def test_a_node_that_is_not_ready_is_tainted_like_the_node_controller_does(ready: str, taint: str) -> None:
    doc = node_doc()
    doc["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    assert translate.node_of(node(doc)).taints == (Taint(taint, "", "NoSchedule"),)


def test_a_node_without_a_ready_condition_is_taken_as_ready() -> None:
    doc = node_doc()
    doc["status"]["conditions"] = []
    assert translate.node_of(node(doc)).taints == ()


def test_spec_taints_are_kept_and_not_duplicated() -> None:
    doc = node_doc()
    doc["spec"]["unschedulable"] = True
    doc["spec"]["taints"] = [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": keys.UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
    ]
    assert translate.node_of(node(doc)).taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint(keys.UNSCHEDULABLE_TAINT, "", "NoSchedule"),
    )


def test_a_malformed_allocatable_quantity_names_its_field() -> None:
    with pytest.raises(InvalidObject) as info:
        translate.node_of(node(node_doc(cpu="lots", memory="1Gi", pods="10")))
    assert (info.value.kind, info.value.name, info.value.field) == (
        "Node",
        "gpu-node-1",
        "status.allocatable[cpu]",
    )


def test_a_fractional_gpu_allocatable_is_invalid() -> None:
    with pytest.raises(InvalidObject, match="whole number"):
        translate.node_of(node(node_doc(cpu="8", memory="1Gi", pods="10", **{"nvidia.com/gpu": "1.5"})))


# --- pod requests ----------------------------------------------------------------------------------------
def test_requests_are_the_larger_of_the_containers_sum_and_each_init_container_plus_overhead() -> None:
    doc = pod_doc(
        initContainers=[{"name": "init", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}],
        overhead={"cpu": "250m", "memory": "64Mi"},
    )
    doc["spec"]["containers"].append(
        {"name": "side", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    )
    p = translate.pod_of(pod(doc))
    assert p.cpu_millis == 3000 + 250
    assert p.memory_bytes == 2 * 2**30 + 64 * 2**20


def test_a_limit_without_a_request_requests_the_limit() -> None:
    doc = pod_doc()
    doc["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}
    p = translate.pod_of(pod(doc))
    assert (p.cpu_millis, p.gpu) == (2000, GpuRequest(devices=1))


def test_cpu_is_rounded_up_to_whole_millicores() -> None:
    assert translate.pod_of(pod(pod_doc({"cpu": "100.5m"}))).cpu_millis == 101


def test_overhead_adds_no_gpus() -> None:
    doc = pod_doc({"cpu": "1", "nvidia.com/gpu": "2"}, overhead={"nvidia.com/gpu": "1"})
    assert translate.pod_requests(pod(doc)).gpus == 2


def test_pod_requests_summarise_a_foreign_pod_for_node_accounting() -> None:
    doc = pod_doc({"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"})
    assert translate.pod_requests(pod(doc)) == translate.PodRequests(
        cpu_millis=2000, memory_bytes=4 * 2**30, gpus=1
    )


def test_a_negative_request_names_the_container_and_resource() -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(pod_doc({"cpu": "-1"})))
    assert info.value.field == "spec.containers[0].resources.requests[cpu]"


def test_a_fractional_gpu_request_is_invalid() -> None:
    with pytest.raises(InvalidObject, match="whole number of devices"):
        translate.pod_of(pod(pod_doc({"nvidia.com/gpu": "500m"})))


# --- pod identity and status -----------------------------------------------------------------------------
def test_a_pod_belongs_to_the_podgroup_its_annotation_names_in_its_namespace() -> None:
    p = translate.pod_of(pod(pod_doc()))
    assert (p.name, p.namespace, p.uid, p.podgroup) == ("train-0", "team-a", "pod-uid-0", "team-a/pg-train")
    assert p.creation_time == T0


def test_an_explicit_podgroup_key_wins_over_the_annotation() -> None:
    assert translate.pod_of(pod(pod_doc()), podgroup="other/pg").podgroup == "other/pg"


def test_a_pod_without_a_podgroup_cannot_be_translated() -> None:
    doc = pod_doc()
    del doc["metadata"]["annotations"][keys.PODGROUP_ANNOTATION]
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(doc))
    assert info.value.field == "metadata.annotations[pod-group-name]"
    assert translate.podgroup_name_of(pod(doc)) is None


@pytest.mark.parametrize(
    ("phase", "node_name", "deleting", "gated", "status"),
    [
        ("Pending", "", False, False, PodStatus.PENDING),
        ("Pending", "", False, True, PodStatus.GATED),
        ("Pending", "n1", False, False, PodStatus.BOUND),
        ("Pending", "n1", True, False, PodStatus.RELEASING),
        ("Running", "n1", False, False, PodStatus.RUNNING),
        ("Running", "n1", True, False, PodStatus.RELEASING),
        ("Succeeded", "n1", False, False, PodStatus.SUCCEEDED),
        ("Failed", "n1", True, False, PodStatus.FAILED),
        ("Unknown", "n1", False, False, PodStatus.UNKNOWN),
        ("", "", False, False, PodStatus.PENDING),
    ],
)
def test_pod_status_follows_kais_mapping(
    phase: str, node_name: str, deleting: bool, gated: bool, status: PodStatus
) -> None:
    doc = pod_doc()
    doc["status"]["phase"] = phase
    if node_name:
        doc["spec"]["nodeName"] = node_name
    if deleting:
        doc["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    if gated:
        doc["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    p = translate.pod_of(pod(doc))
    assert p.status == status
    assert p.node == (node_name or None)


def test_a_malformed_creation_timestamp_names_its_field() -> None:
    doc = pod_doc()
    doc["metadata"]["creationTimestamp"] = "yesterday"
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(doc))
    assert info.value.field == "metadata.creationTimestamp"


# --- GPU requests ----------------------------------------------------------------------------------------
def test_whole_gpus_come_from_the_nvidia_gpu_request() -> None:
    assert translate.pod_of(pod(pod_doc({"nvidia.com/gpu": "4"}))).gpu == GpuRequest(devices=4)


def test_a_gpu_fraction_annotation_asks_for_a_share_of_one_device() -> None:
    p = translate.pod_of(pod(pod_doc(annotations={"gpu-fraction": "0.5"})))
    assert p.gpu == GpuRequest(devices=1, fraction=0.5)


def test_a_fraction_of_several_devices_uses_the_num_devices_annotation() -> None:
    doc = pod_doc(annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"})
    assert translate.pod_of(pod(doc)).gpu == GpuRequest(devices=2, fraction=0.25)


def test_a_whole_device_written_as_fraction_one_is_accepted_as_in_kai() -> None:
    assert translate.pod_of(pod(pod_doc(annotations={"gpu-fraction": "1"}))).gpu.fraction == 1.0


@pytest.mark.parametrize("fraction", ["abc", "1.5", "0", "-0.5", "nan", "inf", "0.5 "])
def test_a_gpu_fraction_outside_zero_to_one_is_invalid(fraction: str) -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(pod_doc(annotations={"gpu-fraction": fraction})))
    assert info.value.field == "metadata.annotations[gpu-fraction]"
    assert info.value.name == "team-a/train-0"


def test_a_gpu_fraction_together_with_whole_gpus_is_invalid() -> None:
    doc = pod_doc({"cpu": "1", "nvidia.com/gpu": "1"}, annotations={"gpu-fraction": "0.5"})
    with pytest.raises(InvalidObject, match=r"nvidia\.com/gpu"):
        translate.pod_of(pod(doc))


def test_a_gpu_memory_annotation_asks_for_mib_on_each_device() -> None:
    p = translate.pod_of(pod(pod_doc(annotations={"gpu-memory": "20000"})))
    assert p.gpu == GpuRequest(devices=1, memory_mib=20000)


def test_a_zero_gpu_memory_annotation_asks_for_nothing() -> None:
    assert translate.pod_of(pod(pod_doc(annotations={"gpu-memory": "0"}))).gpu == GpuRequest()


@pytest.mark.parametrize("memory", ["-1", "1.5", "lots"])
def test_a_malformed_gpu_memory_annotation_is_invalid(memory: str) -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(pod_doc(annotations={"gpu-memory": memory})))
    assert info.value.field == "metadata.annotations[gpu-memory]"


def test_a_gpu_fraction_together_with_gpu_memory_is_invalid() -> None:
    with pytest.raises(InvalidObject, match="gpu-memory"):
        translate.pod_of(pod(pod_doc(annotations={"gpu-fraction": "0.5", "gpu-memory": "1000"})))


def test_a_malformed_num_devices_annotation_is_invalid() -> None:
    doc = pod_doc(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"})
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(doc))
    assert info.value.field == "metadata.annotations[gpu-fraction-num-devices]"


def test_mig_resources_are_a_mig_request() -> None:
    p = translate.pod_of(pod(pod_doc({"cpu": "1", "nvidia.com/mig-2g.20gb": "1"})))
    assert (p.gpu, p.legacy_mig) == (GpuRequest(mig={"nvidia.com/mig-2g.20gb": 1}), False)


def test_a_mig_annotation_is_a_legacy_mig_request() -> None:
    p = translate.pod_of(pod(pod_doc(annotations={"nvidia.com/mig-1g.10gb": "1"})))
    assert (p.gpu, p.legacy_mig) == (GpuRequest(mig={"nvidia.com/mig-1g.10gb": 1}), True)


def test_mig_together_with_whole_gpus_is_invalid() -> None:
    with pytest.raises(InvalidObject, match="MIG"):
        translate.pod_of(pod(pod_doc({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"})))


def test_gpu_groups_come_from_kairos_annotation_first() -> None:
    doc = pod_doc(
        annotations={keys.GPU_GROUPS_ANNOTATION: "g-1, g-2"},
        labels={keys.KAI_GPU_GROUP_LABEL: "other"},
    )
    assert translate.pod_of(pod(doc)).gpu_groups == ("g-1", "g-2")


def test_gpu_groups_fall_back_to_kais_labels() -> None:
    doc = pod_doc(
        labels={keys.KAI_GPU_GROUP_LABEL: "g-a", "runai-gpu-group/g-b": "g-b", "runai-gpu-group/g-a": "g-a"}
    )
    assert translate.pod_of(pod(doc)).gpu_groups == ("g-a", "g-b")


# --- placement constraints -------------------------------------------------------------------------------
def test_labels_subgroup_task_priority_and_selector_are_carried_over() -> None:
    doc = pod_doc(
        labels={keys.SUBGROUP_LABEL: "worker", keys.TASK_PRIORITY_LABEL: "5", "app": "x"},
        nodeSelector={"zone": "a"},
    )
    p = translate.pod_of(pod(doc))
    assert (p.sub_group, p.task_priority, p.node_selector) == ("worker", 5, {"zone": "a"})
    assert p.labels["app"] == "x"


def test_a_malformed_task_priority_label_is_invalid() -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(pod_doc(labels={keys.TASK_PRIORITY_LABEL: "high"})))
    assert info.value.field == "metadata.labels[kai.scheduler/task-priority]"


def required_node_affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def test_required_node_affinity_terms_are_kept() -> None:
    affinity = required_node_affinity(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
    )
    p = translate.pod_of(pod(pod_doc(affinity=affinity)))
    assert p.node_affinity == (
        LabelSelectorTerm((NodeSelectorRequirement("zone", "In", ("a", "b")),)),
        LabelSelectorTerm((NodeSelectorRequirement("gpu", "Exists", ()),)),
    )


def test_match_fields_on_the_node_name_become_a_node_name_label_requirement() -> None:
    affinity = required_node_affinity(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}
    )
    p = translate.pod_of(pod(pod_doc(affinity=affinity)))
    assert p.node_affinity == (
        LabelSelectorTerm((NodeSelectorRequirement(keys.NODE_NAME_LABEL, "In", ("n7",)),)),
    )


def test_only_empty_node_selector_terms_match_no_node() -> None:
    p = translate.pod_of(pod(pod_doc(affinity=required_node_affinity({}))))
    assert p.node_affinity == (LabelSelectorTerm((NodeSelectorRequirement(keys.NODE_NAME_LABEL, "In", ()),)),)


def test_match_fields_on_anything_but_the_name_are_invalid() -> None:
    affinity = required_node_affinity({"matchFields": [{"key": "spec.x", "operator": "In", "values": ["a"]}]})
    with pytest.raises(InvalidObject, match=r"metadata\.name"):
        translate.pod_of(pod(pod_doc(affinity=affinity)))


def test_tolerations_default_to_the_equal_operator() -> None:
    doc = pod_doc(
        tolerations=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}, {"operator": "Exists"}]
    )
    assert translate.pod_of(pod(doc)).tolerations == (
        Toleration("gpu", "Equal", "yes", "NoSchedule"),
        Toleration("", "Exists", "", ""),
    )


# --- queues ----------------------------------------------------------------------------------------------
def test_a_queue_keeps_kai_units_except_memory_megabytes_become_bytes() -> None:
    resources = {
        "gpu": {"quota": 2.5, "overQuotaWeight": 1, "limit": -1},
        "cpu": {"quota": 16000, "overQuotaWeight": 2, "limit": 32000},
        "memory": {"quota": 64000, "overQuotaWeight": 1, "limit": -1},
    }
    q = translate.queue_of(wire.convert(wire.Queue, queue_doc(resources, priority=150)), creation_index=4)
    assert (q.name, q.parent, q.priority, q.creation_index) == ("team-a", "research", 150, 4)
    assert (q.gpu.quota, q.gpu.over_quota_weight, q.gpu.limit) == (2.5, 1.0, -1.0)
    assert (q.cpu.quota, q.cpu.over_quota_weight, q.cpu.limit) == (16000.0, 2.0, 32000.0)
    assert (q.memory.quota, q.memory.limit) == (64_000 * 10**6, -1.0)


def test_unset_queue_fields_are_kais_zero_values_and_priority_100() -> None:
    q = translate.queue_of(wire.convert(wire.Queue, queue_doc({"gpu": {"quota": 1}})), creation_index=0)
    assert q.priority == 100
    assert (q.gpu.quota, q.gpu.over_quota_weight, q.gpu.limit) == (1.0, 0.0, 0.0)
    assert (q.cpu.quota, q.cpu.limit) == (0.0, 0.0)


def test_a_queue_without_resources_has_zero_quota_weight_and_limit() -> None:
    q = translate.queue_of(wire.convert(wire.Queue, queue_doc()), creation_index=0)
    assert (q.gpu.quota, q.gpu.over_quota_weight, q.gpu.limit) == (0.0, 0.0, 0.0)


def test_a_top_level_queue_has_no_parent() -> None:
    doc = queue_doc()
    del doc["spec"]["parentQueue"]
    assert translate.queue_of(wire.convert(wire.Queue, doc), creation_index=0).parent is None


@pytest.mark.parametrize(("field", "value"), [("quota", -2), ("limit", -0.5)])
def test_a_negative_quota_or_limit_other_than_minus_one_is_invalid(field: str, value: float) -> None:
    doc = queue_doc({"memory": {field: value}})
    with pytest.raises(InvalidObject) as info:
        translate.queue_of(wire.convert(wire.Queue, doc), creation_index=0)
    assert (info.value.kind, info.value.name, info.value.field) == (
        "Queue",
        "team-a",
        f"spec.resources.memory.{field}",
    )


def test_a_negative_over_quota_weight_is_invalid() -> None:
    doc = queue_doc({"gpu": {"overQuotaWeight": -1}})
    with pytest.raises(InvalidObject) as info:
        translate.queue_of(wire.convert(wire.Queue, doc), creation_index=0)
    assert info.value.field == "spec.resources.gpu.overQuotaWeight"


def test_queue_min_runtimes_are_seconds() -> None:
    doc = queue_doc(preemptMinRuntime="5m", reclaimMinRuntime="1h30m")
    q = translate.queue_of(wire.convert(wire.Queue, doc), creation_index=0)
    assert (q.preempt_min_runtime, q.reclaim_min_runtime) == (300.0, 5400.0)


def test_a_malformed_min_runtime_names_its_field() -> None:
    doc = queue_doc(preemptMinRuntime="five minutes")
    with pytest.raises(InvalidObject) as info:
        translate.queue_of(wire.convert(wire.Queue, doc), creation_index=0)
    assert info.value.field == "spec.preemptMinRuntime"


# --- podgroups -------------------------------------------------------------------------------------------
def test_a_podgroup_is_keyed_by_namespace_and_name() -> None:
    g = podgroup(podgroup_doc(minMember=3, priorityClassName="train"))
    assert (g.name, g.namespace, g.uid, g.queue) == ("pg-train", "team-a", "team-a/pg-train", "team-a")
    assert g.creation_time == T0


def test_priority_comes_from_the_priority_class() -> None:
    assert podgroup(podgroup_doc(priorityClassName="inference")).priority == 125


def test_an_unknown_or_missing_priority_class_gets_the_default_priority() -> None:
    assert podgroup(podgroup_doc(priorityClassName="nope")).priority == 50
    assert podgroup(podgroup_doc(), default_priority=1000).priority == 1000


def test_the_default_priority_is_the_global_default_class_else_50() -> None:
    classes = [
        wire.PriorityClass(metadata=wire.ObjectMeta(name="a"), value=10),
        wire.PriorityClass(metadata=wire.ObjectMeta(name="b"), value=70, global_default=True),
    ]
    assert translate.default_priority(classes) == 70
    assert translate.default_priority(classes[:1]) == 50


@pytest.mark.parametrize(
    ("priority_class", "preemptibility", "preemptible"),
    [
        ("train", "", True),
        ("build", "", False),
        ("inference", "", False),
        ("inference", "preemptible", True),
        ("train", "non-preemptible", False),
    ],
)
def test_preemptibility_is_explicit_or_priority_below_100(
    priority_class: str, preemptibility: str, preemptible: bool
) -> None:
    doc = podgroup_doc(priorityClassName=priority_class, preemptibility=preemptibility)
    assert podgroup(doc).preemptible is preemptible


def test_without_sub_groups_a_podgroup_is_one_default_pod_set_of_min_member() -> None:
    g = podgroup(
        podgroup_doc(minMember=4, topologyConstraint={"topology": "dc", "requiredTopologyLevel": "rack"})
    )
    assert [(ps.name, ps.min_available) for ps in g.root.all_pod_sets()] == [("default", 4)]
    assert g.root.topology_constraint is not None
    assert (g.root.topology_constraint.topology, g.root.topology_constraint.required_level) == ("dc", "rack")


def test_an_unset_min_member_is_one() -> None:
    assert podgroup(podgroup_doc()).root.pod_sets[0].min_available == 1


def test_sub_groups_form_the_tree_their_parents_describe() -> None:
    sub_groups = [
        {"name": "master", "minMember": 1},
        {"name": "workers"},
        {
            "name": "worker-0",
            "parent": "Workers",
            "minMember": 4,
            "topologyConstraint": {"topology": "dc", "preferredTopologyLevel": "rack"},
        },
        {"name": "worker-1", "parent": "workers", "minMember": 0},
    ]
    g = podgroup(podgroup_doc(minMember=9, subGroups=sub_groups))
    assert [ps.name for ps in g.root.pod_sets] == ["master"]
    (workers,) = g.root.children
    assert workers.name == "workers"
    # A sub-group of minMember 0 is all elastic pods (KAI v0.17).
    assert [(ps.name, ps.min_available) for ps in workers.pod_sets] == [("worker-0", 4), ("worker-1", 0)]
    constraint = workers.pod_sets[0].topology_constraint
    assert constraint is not None
    assert (constraint.topology, constraint.preferred_level) == ("dc", "rack")


@pytest.mark.parametrize(
    ("sub_groups", "field", "problem"),
    [
        ([{"name": "a"}, {"name": "a"}], "spec.subGroups[1].name", "duplicate"),
        ([{"name": "a", "parent": "ghost"}], "spec.subGroups[0].parent", "no sub-group"),
        ([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}], "spec.subGroups[0].parent", "cycle"),
        ([{"name": "a", "minMember": -1}], "spec.subGroups[0].minMember", ">= 0"),
    ],
)
def test_an_inconsistent_sub_group_tree_is_invalid(
    sub_groups: list[dict[str, Any]], field: str, problem: str
) -> None:
    with pytest.raises(InvalidObject, match=problem) as info:
        podgroup(podgroup_doc(subGroups=sub_groups))
    assert info.value.field == field


def test_start_and_stale_timestamps_come_from_kais_annotations() -> None:
    doc = podgroup_doc(
        annotations={
            keys.LAST_START_ANNOTATION: "2026-01-01T00:10:00Z",
            keys.STALE_SINCE_ANNOTATION: "2026-01-01T00:20:00+00:00",
        }
    )
    g = podgroup(doc)
    assert (g.last_start_time, g.stale_since) == (T0 + 600, T0 + 1200)


def test_a_malformed_timestamp_annotation_names_its_field() -> None:
    with pytest.raises(InvalidObject) as info:
        podgroup(podgroup_doc(annotations={keys.LAST_START_ANNOTATION: "2026-01-01"}))
    assert info.value.field == "metadata.annotations[kai.scheduler/last-start-timestamp]"


def test_the_staleness_grace_period_is_read_from_spec_then_annotation() -> None:
    assert podgroup(podgroup_doc(stalenessGracePeriod="2m")).staleness_grace_period == 120.0
    doc = podgroup_doc(annotations={keys.STALENESS_GRACE_PERIOD_ANNOTATION: "-1s"})
    assert podgroup(doc).staleness_grace_period == -1.0
    assert podgroup(podgroup_doc()).staleness_grace_period is None


def test_creation_time_can_be_given() -> None:
    assert podgroup(podgroup_doc(), creation_time=42.0).creation_time == 42.0


# --- topologies ------------------------------------------------------------------------------------------
def topology_doc(*labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "dc"}, "spec": {"levels": [{"nodeLabel": label} for label in labels]}}


def test_a_topology_is_its_levels_coarsest_first() -> None:
    t = translate.topology_of(
        wire.convert(wire.Topology, topology_doc("zone", "rack", "kubernetes.io/hostname"))
    )
    assert (t.name, t.levels) == ("dc", ("zone", "rack", "kubernetes.io/hostname"))


@pytest.mark.parametrize(("labels", "problem"), [(("zone", ""), "missing"), (("zone", "zone"), "duplicate")])
def test_a_topology_level_must_name_a_distinct_label(labels: tuple[str, ...], problem: str) -> None:
    with pytest.raises(InvalidObject, match=problem) as info:
        translate.topology_of(wire.convert(wire.Topology, topology_doc(*labels)))
    assert info.value.field == "spec.levels[1].nodeLabel"


# --- time ------------------------------------------------------------------------------------------------
def test_timestamps_are_written_as_kubernetes_writes_them_and_read_back() -> None:
    assert translate.rfc3339(T0 + 61.9) == "2026-01-01T00:01:01Z"
    assert translate.parse_time("2026-01-01T00:01:01Z") == T0 + 61
    assert translate.parse_time("2026-01-01T02:01:01.5+02:00") == T0 + 61.5


@pytest.mark.parametrize("text", ["2026-01-01", "2026-01-01T00:00:00", "tomorrow"])
def test_timestamps_without_a_zone_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        translate.parse_time(text)


# --- write-back ------------------------------------------------------------------------------------------
def test_an_event_about_a_pod_is_a_core_v1_event() -> None:
    about = translate.involved_object(pod(pod_doc()))
    ev = translate.event(about, reason="Unschedulable", message="no node fits", type="Warning", now=T0 + 5)
    assert ev["apiVersion"] == "v1"
    assert ev["kind"] == "Event"
    assert ev["metadata"] == {"name": f"train-0.{int((T0 + 5) * 1e9):x}", "namespace": "team-a"}
    assert ev["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "train-0",
        "namespace": "team-a",
        "uid": "pod-uid-0",
    }
    assert (ev["reason"], ev["message"], ev["type"]) == ("Unschedulable", "no node fits", "Warning")
    assert ev["source"] == {"component": "kairos"}
    assert (ev["count"], ev["firstTimestamp"], ev["lastTimestamp"]) == (
        1,
        "2026-01-01T00:00:05Z",
        "2026-01-01T00:00:05Z",
    )


def test_an_event_about_a_cluster_scoped_object_goes_to_the_default_namespace() -> None:
    about = translate.involved_object(wire.convert(wire.Queue, queue_doc()))
    ev = translate.event(about, reason="FairShare", message="m", now=T0, count=3, first_seen=T0 - 60)
    assert ev["metadata"]["namespace"] == "default"
    assert "namespace" not in ev["involvedObject"]
    assert (ev["count"], ev["firstTimestamp"]) == (3, "2025-12-31T23:59:00Z")


def test_long_event_messages_are_truncated() -> None:
    about = translate.involved_object(pod(pod_doc()))
    ev = translate.event(about, reason="R", message="x" * 5000, now=T0)
    assert len(ev["message"]) == translate.MAX_EVENT_MESSAGE
    assert ev["message"].endswith("...")


def podgroup_with_conditions(*conditions: dict[str, Any], **status: Any) -> wire.PodGroup:
    doc = podgroup_doc()
    doc["status"] = {"schedulingConditions": list(conditions), **status}
    return wire.convert(wire.PodGroup, doc)


def test_a_status_patch_sets_only_counts_that_changed() -> None:
    pg = podgroup_with_conditions(running=2, pending=1)
    assert translate.podgroup_status_patch(pg, now=T0, running=3, pending=1) == {"status": {"running": 3}}
    assert translate.podgroup_status_patch(pg, now=T0, running=2, pending=1) is None


def test_an_unschedulable_podgroup_gets_kais_condition() -> None:
    patch = translate.podgroup_status_patch(
        podgroup_with_conditions(),
        now=T0,
        unschedulable="1 pod could not fit",
        reasons=[("OverLimit", "queue team-a is over its GPU limit")],
    )
    assert patch == {
        "status": {
            "schedulingConditions": [
                {
                    "type": "UnschedulableOnNodePool",
                    "nodePool": "default",
                    "reason": "Unschedulable",
                    "message": "1 pod could not fit",
                    "reasons": [{"reason": "OverLimit", "message": "queue team-a is over its GPU limit"}],
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "status": "True",
                    "transitionID": "1",
                }
            ]
        }
    }


def condition(node_pool: str, transition: str, message: str = "old") -> dict[str, Any]:
    return {
        "type": "UnschedulableOnNodePool",
        "nodePool": node_pool,
        "reason": "Unschedulable",
        "message": message,
        "status": "True",
        "transitionID": transition,
    }


def test_a_new_condition_squashes_its_node_pools_and_takes_the_next_transition_id() -> None:
    pg = podgroup_with_conditions(condition("default", "4"), condition("gpu-pool", "7"))
    patch = translate.podgroup_status_patch(pg, now=T0, unschedulable="new")
    assert patch is not None
    conditions = patch["status"]["schedulingConditions"]
    assert [(c["nodePool"], c["transitionID"], c["message"]) for c in conditions] == [
        ("gpu-pool", "7", "old"),
        ("default", "8", "new"),
    ]


def test_a_condition_equal_to_the_latest_is_not_rewritten() -> None:
    pg = podgroup_with_conditions(condition("gpu-pool", "1"), condition("default", "2", "same"))
    assert translate.podgroup_status_patch(pg, now=T0, unschedulable="same") is None


def test_clearing_removes_every_scheduling_condition() -> None:
    pg = podgroup_with_conditions(condition("default", "1"))
    patch = translate.podgroup_status_patch(pg, now=T0, clear_unschedulable=True)
    assert patch == {"status": {"schedulingConditions": None}}
    assert (
        translate.podgroup_status_patch(podgroup_with_conditions(), now=T0, clear_unschedulable=True) is None
    )


def test_the_timestamps_patch_sets_and_removes_kais_annotations() -> None:
    pg = wire.convert(
        wire.PodGroup, podgroup_doc(annotations={keys.STALE_SINCE_ANNOTATION: "2026-01-01T00:00:00Z"})
    )
    patch = translate.podgroup_annotations_patch(pg, last_start_time=T0 + 30, stale_since=None)
    assert patch == {
        "metadata": {
            "annotations": {
                keys.LAST_START_ANNOTATION: "2026-01-01T00:00:30Z",
                keys.STALE_SINCE_ANNOTATION: None,
            }
        }
    }
    assert translate.podgroup_annotations_patch(pg, last_start_time=None, stale_since=T0) is None


def test_a_queue_status_patch_writes_resource_lists_and_fair_share() -> None:
    patch = translate.queue_status_patch(
        allocated=(1.5, 2500.0, 3 * 2**30),
        allocated_non_preemptible=(0.0, 0.0, 0.0),
        requested=(2.0, 4000.0, 1e9),
        fair_share=(1.0 / 3.0, 1000.0, 0.0),
    )
    assert patch == {
        "status": {
            "allocated": {"nvidia.com/gpu": "1500m", "cpu": "2500m", "memory": str(3 * 2**30)},
            "allocatedNonPreemptible": {"nvidia.com/gpu": "0", "cpu": "0", "memory": "0"},
            "requested": {"nvidia.com/gpu": "2", "cpu": "4", "memory": "1000000000"},
            "fairShare": {"nvidia.com/gpu": "333m", "cpu": "1", "memory": "0"},
        }
    }


def test_the_gpu_groups_patch_records_the_devices_in_order() -> None:
    assert translate.gpu_groups_patch(["g-1", "g-2"]) == {
        "metadata": {"annotations": {keys.GPU_GROUPS_ANNOTATION: "g-1,g-2"}}
    }
    assert translate.gpu_groups_patch([]) == {"metadata": {"annotations": {keys.GPU_GROUPS_ANNOTATION: None}}}


def test_the_gpu_groups_patch_round_trips_through_pod_of() -> None:
    doc = copy.deepcopy(pod_doc(annotations={"gpu-fraction": "0.5"}))
    doc["metadata"]["annotations"].update(translate.gpu_groups_patch(["g-1"])["metadata"]["annotations"])
    assert translate.pod_of(pod(doc)).gpu_groups == ("g-1",)


# --- robustness: bad input is an InvalidObject, never a crash ------------------------------------------------
def outcome(make: Callable[[], T]) -> T | InvalidObject:
    """What `make()` returns, or the InvalidObject it raises (any other exception fails the test)."""
    try:
        return make()
    except InvalidObject as exc:
        return exc


annotation_text = st.one_of(
    st.text(max_size=12), st.from_regex(r"-?[0-9]{0,4}(\.[0-9]{0,3})?", fullmatch=True)
)


@settings(max_examples=200)
@given(
    fraction=st.none() | annotation_text,
    memory=st.none() | annotation_text,
    devices=st.none() | annotation_text,
    cpu=st.one_of(st.text(max_size=8), st.from_regex(r"[0-9]{1,4}(m|Mi|k|e[0-9])?", fullmatch=True)),
)
def test_any_annotation_or_quantity_text_translates_or_is_an_invalid_object(
    fraction: str | None, memory: str | None, devices: str | None, cpu: str
) -> None:
    values = {"gpu-fraction": fraction, "gpu-memory": memory, "gpu-fraction-num-devices": devices}
    doc = pod_doc({"cpu": cpu}, annotations={k: v for k, v in values.items() if v is not None})
    result = outcome(lambda: translate.pod_of(pod(doc)))
    if isinstance(result, InvalidObject):
        assert (result.kind, result.name) == ("Pod", "team-a/train-0")
    else:
        assert result.cpu_millis >= 0
        assert 0 <= result.gpu.fraction <= 1
