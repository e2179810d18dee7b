"""Decoding Kubernetes JSON into Kairos's wire structs: what is read, what is ignored, how errors name things."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import wire

# A pod as `kubectl get pod -o json` prints it (trimmed of nothing Kairos must survive).
POD_JSON = """
{
  "apiVersion": "v1",
  "kind": "Pod",
  "metadata": {
    "annotations": {"gpu-fraction": "0.5", "pod-group-name": "pg-train-0b5e"},
    "creationTimestamp": "2026-03-01T10:00:00Z",
    "generateName": "train-",
    "labels": {"app": "train", "kai.scheduler/queue": "research"},
    "managedFields": [{"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kubectl", "operation": "Update"}],
    "name": "train-abcde",
    "namespace": "team-a",
    "ownerReferences": [
      {"apiVersion": "batch/v1", "blockOwnerDeletion": true, "controller": true, "kind": "Job",
       "name": "train", "uid": "0b5e0c5a-1111-2222-3333-444455556666"}
    ],
    "resourceVersion": "81234",
    "uid": "9c2f7e1a-aaaa-bbbb-cccc-ddddeeeeffff"
  },
  "spec": {
    "containers": [
      {"image": "pytorch:2", "imagePullPolicy": "IfNotPresent", "name": "main",
       "resources": {"limits": {"memory": "8Gi"}, "requests": {"cpu": "2", "memory": "8Gi"}},
       "terminationMessagePath": "/dev/termination-log",
       "volumeMounts": [{"mountPath": "/data", "name": "data"}]}
    ],
    "dnsPolicy": "ClusterFirst",
    "enableServiceLinks": true,
    "initContainers": [{"name": "fetch", "image": "busybox", "resources": {"requests": {"cpu": "500m"}}}],
    "nodeSelector": {"nvidia.com/gpu.product": "H100"},
    "preemptionPolicy": "PreemptLowerPriority",
    "priority": 0,
    "restartPolicy": "Never",
    "schedulerName": "kai-scheduler",
    "securityContext": {},
    "serviceAccountName": "default",
    "terminationGracePeriodSeconds": 30,
    "tolerations": [
      {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300}
    ],
    "volumes": [{"name": "data", "emptyDir": {}}]
  },
  "status": {
    "conditions": [
      {"lastProbeTime": null, "lastTransitionTime": "2026-03-01T10:00:00Z", "message": "0/4 nodes are available",
       "reason": "Unschedulable", "status": "False", "type": "PodScheduled"}
    ],
    "phase": "Pending",
    "qosClass": "Burstable"
  }
}
"""


def test_a_pod_decodes_with_what_kairos_reads() -> None:
    pod = wire.decode_pod(POD_JSON.encode())
    assert pod.metadata.name == "train-abcde"
    assert pod.metadata.namespace == "team-a"
    assert pod.metadata.uid == "9c2f7e1a-aaaa-bbbb-cccc-ddddeeeeffff"
    assert pod.metadata.resource_version == "81234"
    assert pod.metadata.creation_timestamp == "2026-03-01T10:00:00Z"
    assert pod.metadata.owner_references[0].kind == "Job"
    assert pod.metadata.owner_references[0].controller is True
    assert pod.spec.containers[0].resources.requests == {"cpu": "2", "memory": "8Gi"}
    assert pod.spec.init_containers[0].resources.requests == {"cpu": "500m"}
    assert pod.spec.scheduler_name == "kai-scheduler"
    assert pod.spec.node_selector == {"nvidia.com/gpu.product": "H100"}
    assert pod.spec.tolerations[0].toleration_seconds == 300
    assert pod.status.phase == "Pending"
    assert pod.status.conditions[0].reason == "Unschedulable"


def test_fields_kairos_does_not_read_are_ignored() -> None:
    doc = json.loads(POD_JSON)
    doc["spec"]["someFutureField"] = {"x": [1, 2]}
    doc["metadata"]["anotherOne"] = "y"
    pod = wire.convert(wire.Pod, doc)
    assert pod.metadata.name == "train-abcde"


def test_absent_sections_take_kubernetes_defaults() -> None:
    pod = wire.decode_pod(b'{"metadata": {"name": "bare"}}')
    assert pod.spec.containers == []
    assert pod.metadata.labels == {}
    assert pod.status.phase == ""
    assert pod.spec.affinity is None


def test_decode_accepts_kinds_resources_and_types() -> None:
    raw = b'{"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}}}'
    for kind in ("Node", "node", "nodes", wire.Node):
        node = wire.decode(kind, raw)
        assert isinstance(node, wire.Node)
        assert node.status.allocatable == {"cpu": "4"}


def test_an_unknown_kind_is_an_invalid_object() -> None:
    with pytest.raises(InvalidObject, match="not a kind Kairos decodes"):
        wire.decode("deployments", b"{}")


def test_a_wrong_type_names_kind_object_and_field_path() -> None:
    doc = json.loads(POD_JSON)
    doc["spec"]["containers"][0]["resources"]["requests"]["cpu"] = ["2"]
    with pytest.raises(InvalidObject) as info:
        wire.decode(wire.Pod, json.dumps(doc))
    err = info.value
    assert err.kind == "Pod"
    assert err.name == "team-a/train-abcde"
    assert err.field.startswith("spec.containers[0].resources.requests")
    assert "Expected" in err.problem


def test_a_converted_dict_reports_errors_like_decoded_bytes() -> None:
    doc: dict[str, Any] = {"metadata": {"name": "pg1", "namespace": "ns"}, "spec": {"minMember": "two"}}
    with pytest.raises(InvalidObject) as info:
        wire.convert(wire.PodGroup, doc)
    assert (info.value.kind, info.value.name, info.value.field) == ("PodGroup", "ns/pg1", "spec.minMember")


def test_a_cluster_scoped_object_is_named_without_a_namespace() -> None:
    with pytest.raises(InvalidObject) as info:
        wire.decode("queues", b'{"metadata": {"name": "research"}, "spec": {"priority": "high"}}')
    assert info.value.name == "research"
    assert info.value.field == "spec.priority"


def test_malformed_json_is_an_invalid_object() -> None:
    with pytest.raises(InvalidObject, match="not a valid JSON document"):
        wire.decode_pod(b'{"metadata": ')


def test_an_unknown_preemptibility_is_rejected_by_name() -> None:
    with pytest.raises(InvalidObject) as info:
        wire.decode_podgroup(
            b'{"metadata": {"name": "g", "namespace": "n"}, "spec": {"preemptibility": "maybe"}}'
        )
    assert info.value.field == "spec.preemptibility"


def test_podgroup_scheduling_conditions_keep_kais_transition_id_spelling() -> None:
    raw = json.dumps(
        {
            "metadata": {"name": "g", "namespace": "n"},
            "status": {
                "schedulingConditions": [
                    {
                        "type": "UnschedulableOnNodePool",
                        "nodePool": "default",
                        "transitionID": "7",
                        "status": "True",
                    }
                ]
            },
        }
    )
    pg = wire.decode_podgroup(raw)
    assert pg.status.scheduling_conditions[0].transition_id == "7"


def test_a_queue_leaves_unset_resource_fields_at_go_zero_values() -> None:
    queue = wire.decode_queue(b'{"metadata": {"name": "q"}, "spec": {"resources": {"gpu": {"quota": 2}}}}')
    assert queue.spec.resources is not None
    assert queue.spec.resources.gpu == wire.QueueResource(quota=2.0, over_quota_weight=0.0, limit=0.0)
    assert queue.spec.resources.cpu == wire.QueueResource()


def test_a_topology_reads_its_levels() -> None:
    raw = json.dumps(
        {
            "apiVersion": "kai.scheduler/v1alpha1",
            "kind": "Topology",
            "metadata": {"name": "dc"},
            "spec": {"levels": [{"nodeLabel": "zone"}, {"nodeLabel": "kubernetes.io/hostname"}]},
        }
    )
    topology = wire.decode_topology(raw)
    assert [level.node_label for level in topology.spec.levels] == ["zone", "kubernetes.io/hostname"]


# A SchedulingShard as KAI's docs write one (kubectl apply -f), every spec field set.
SHARD = {
    "apiVersion": "kai.scheduler/v1",
    "kind": "SchedulingShard",
    "metadata": {"name": "pool-a"},
    "spec": {
        "partitionLabelValue": "pool-a",
        "placementStrategy": {"gpu": "spread", "cpu": "binpack"},
        "queueDepthPerAction": {"allocate": 25, "reclaim": 8},
        "minRuntime": {"preemptMinRuntime": "5m", "reclaimMinRuntime": "10m"},
        "kValue": 2.5,
        "usageDBConfig": {
            "clientType": "prometheus",
            "connectionString": "http://prometheus:9090",
            "usageParams": {"halfLifePeriod": "30m", "windowSize": "1h", "windowType": "sliding"},
        },
        "plugins": {"elastic": {"enabled": False}, "proportion": {"arguments": {"kValue": "2.0"}}},
        "actions": {"consolidation": {"enabled": True, "priority": 450}},
        "args": {"detailed-fit-errors": "true"},
    },
}


def test_a_scheduling_shard_reads_kai_s_whole_spec() -> None:
    shard = wire.decode("schedulingshards", json.dumps(SHARD))
    assert isinstance(shard, wire.SchedulingShard)
    spec = shard.spec
    assert spec.placement_strategy == wire.PlacementStrategy(gpu="spread", cpu="binpack")
    assert (spec.partition_label_value, spec.k_value) == ("pool-a", 2.5)
    assert spec.min_runtime == wire.MinRuntime(preempt_min_runtime="5m", reclaim_min_runtime="10m")
    assert spec.usage_db_config is not None
    assert spec.usage_db_config.usage_params is not None
    assert spec.usage_db_config.usage_params.half_life_period == "30m"
    assert spec.plugins["elastic"] == wire.PluginConfig(enabled=False)
    assert spec.actions["consolidation"] == wire.ActionConfig(enabled=True, priority=450)
    assert spec.queue_depth_per_action == {"allocate": 25, "reclaim": 8}
    assert json.loads(wire.msgspec.json.encode(shard))["spec"] == SHARD["spec"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"kvalue": 1}, "spec.kvalue"),
        ({"placementStrategy": {"gpuu": "spread"}}, "spec.placementStrategy.gpuu"),
        # msgspec names a map value by "[...]", not by its key
        ({"plugins": {"elastic": {"enable": False}}}, "spec.plugins[...].enable"),
        ({"usageDBConfig": {"usageParams": {"halflife": "1h"}}}, "spec.usageDBConfig.usageParams.halflife"),
    ],
)
def test_an_unknown_field_of_a_scheduling_shard_spec_is_named(spec: dict[str, Any], field: str) -> None:
    raw = json.dumps({"kind": "SchedulingShard", "metadata": {"name": "s"}, "spec": spec})
    with pytest.raises(InvalidObject) as info:
        wire.decode_scheduling_shard(raw)
    assert (info.value.kind, info.value.name, info.value.field) == ("SchedulingShard", "s", field)
    assert info.value.problem == "unknown field"


def test_an_owner_of_any_kind_keeps_its_spec_as_raw_json() -> None:
    raw = json.dumps(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "ddp", "namespace": "ml", "uid": "u-1"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}},
            "status": {"conditions": []},
        }
    )
    owner = wire.decode_owner(raw)
    assert owner.kind == "PyTorchJob"
    assert owner.spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3


def test_priority_class_reads_value_and_global_default() -> None:
    raw = b'{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "train"}, "value": 50, "globalDefault": true, "preemptionPolicy": "Never"}'
    pc = wire.decode_priority_class(raw)
    assert (pc.value, pc.global_default, pc.preemption_policy) == (50, True, "Never")


@settings(max_examples=300)
@given(
    st.binary(max_size=64)
    | st.from_regex(r'\{"metadata": \{"name": [0-9"a-z\[\]{}]{0,6}\}, "spec": .{0,12}\}', fullmatch=True)
)
def test_any_bytes_decode_or_raise_an_invalid_object(data: bytes | str) -> None:
    for kind in (wire.Pod, wire.Node, wire.Queue, wire.PodGroup, wire.Topology, wire.Owner):
        error: InvalidObject | None = None
        try:
            wire.decode(kind, data)
        except InvalidObject as exc:
            error = exc
        assert error is None or error.kind == kind.KIND
