"""Specs for reading Kubernetes storage objects (`shared.kube.volumes`) and mirroring them into the state
bucket (`services.state.mirror.volume_mirror`, through `services.state.mirror.cache.Mirror`): what each field becomes in
the model, and that bad input (a malformed quantity, an unknown binding mode, a document that does not
decode) names the object and the field without stopping anything else.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.mirror.cache import Mirror
from services.state.mirror.volume_mirror import StorageMirror
from shared.contracts import subjects as s
from shared.kube import translate, wire
from shared.kube import volumes as kv
from shared.model import LabelSelector, LabelSelectorTerm, NodeSelectorRequirement
from shared.model.volumes import Claim, CsiNode, PersistentVolume, StorageCapacity, StorageClass, TopologyTerm
from tests.builders import claim_manifest, stored

GI = 1024**3


def claim_json(name: str = "data", **spec: Any) -> dict[str, Any]:
    manifest = claim_manifest(name, "local", "ns", size="5Gi", **spec)
    return stored(manifest, uid="u-1", resource_version=None, created=None)


def raw(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


# --- translation ----------------------------------------------------------------------------------------
def test_a_claim_becomes_the_model_claim() -> None:
    obj = claim_json(selector={"matchLabels": {"tier": "gold"}})
    obj["metadata"]["annotations"] = {kv.SELECTED_NODE: "node-2"}
    got = kv.claim_of(kv.decode("persistentvolumeclaims", raw(obj)))  # type: ignore[arg-type]
    assert got == Claim(
        name="data",
        namespace="ns",
        uid="u-1",
        storage_class="local",
        access_modes=("ReadWriteOnce",),
        request_bytes=5 * GI,
        selector=LabelSelector(match_labels={"tier": "gold"}),
        selected_node="node-2",
    )


@pytest.mark.parametrize(
    ("status", "annotations", "bound"),
    [
        pytest.param({"phase": "Bound"}, {}, True, id="phase Bound with a volume name is bound"),
        pytest.param({}, {kv.BIND_COMPLETED: "yes"}, True, id="bind-completed with a volume name is bound"),
        pytest.param({"phase": "Pending"}, {}, False, id="a volume name alone is only prebound"),
    ],
)
def test_a_claim_is_bound_once_its_binding_completed(
    status: dict[str, str], annotations: dict[str, str], bound: bool
) -> None:
    obj = claim_json(volumeName="pv-1")
    obj["status"] = status
    obj["metadata"]["annotations"] = annotations
    got = kv.claim_of(kv.decode("persistentvolumeclaims", raw(obj)))  # type: ignore[arg-type]
    assert (got.volume_name, got.bound) == ("pv-1", bound)


def test_the_legacy_class_annotation_comes_before_the_field() -> None:
    obj = claim_json()
    obj["metadata"]["annotations"] = {kv.STORAGE_CLASS_ANNOTATION: "old"}
    assert kv.claim_of(kv.decode("persistentvolumeclaims", raw(obj))).storage_class == "old"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param(
            {"resources": {"requests": {"storage": "lots"}}}, "spec.resources.requests.storage", id="bad size"
        ),
        pytest.param(
            {"resources": {"requests": {"storage": "-1Gi"}}}, "spec.resources.requests.storage", id="negative"
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
            "spec.selector.matchExpressions[0].operator",
            id="selector operator",
        ),
        pytest.param({"volumeMode": "Raw"}, "spec.volumeMode", id="a volume mode Kubernetes does not know"),
    ],
)
def test_a_claim_that_does_not_translate_carries_a_problem_naming_object_and_field(
    spec: dict[str, Any], field: str
) -> None:
    got = kv.claim_of(kv.decode("persistentvolumeclaims", raw(claim_json(**spec))))  # type: ignore[arg-type]
    assert got.name == "data"
    assert "PersistentVolumeClaim 'ns/data'" in got.problem
    assert field in got.problem


def test_a_volume_becomes_the_model_volume() -> None:
    obj = {
        "kind": "PersistentVolume",
        "metadata": {"name": "local-2", "labels": {"topology.kubernetes.io/zone": "b"}},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local",
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-2"]}
                            ]
                        }
                    ]
                }
            },
            "claimRef": {"namespace": "ns", "name": "data", "uid": "u-1"},
            "csi": {"driver": "csi.example.com", "volumeHandle": "h"},
        },
        "status": {"phase": "Bound"},
    }
    got = kv.volume_of(kv.decode("persistentvolumes", raw(obj)))  # type: ignore[arg-type]
    assert got == PersistentVolume(
        name="local-2",
        capacity_bytes=10 * GI,
        access_modes=("ReadWriteOnce",),
        storage_class="local",
        node_affinity=(
            LabelSelectorTerm((NodeSelectorRequirement("kubernetes.io/hostname", "In", ("node-2",)),)),
        ),
        claim_ref="ns/data",
        claim_uid="u-1",
        phase="Bound",
        csi_driver="csi.example.com",
        volume_handle="h",
        labels={"topology.kubernetes.io/zone": "b"},
    )


@pytest.mark.parametrize(
    ("spec", "mode"),
    [
        pytest.param({}, "Filesystem", id="unset is Filesystem, the API server's default"),
        pytest.param({"volumeMode": "Filesystem"}, "Filesystem", id="Filesystem"),
        pytest.param({"volumeMode": "Block"}, "Block", id="Block"),
    ],
)
def test_a_claims_and_a_volumes_volume_mode_is_read(spec: dict[str, Any], mode: str) -> None:
    claim = kv.claim_of(kv.decode("persistentvolumeclaims", raw(claim_json(**spec))))  # type: ignore[arg-type]
    pv = {"kind": "PersistentVolume", "metadata": {"name": "pv"}, "spec": spec}
    volume = kv.volume_of(kv.decode("persistentvolumes", raw(pv)))  # type: ignore[arg-type]
    assert (claim.volume_mode, volume.volume_mode) == (mode, mode)


def test_a_volume_of_an_unknown_volume_mode_is_refused_naming_the_field() -> None:
    obj = {"kind": "PersistentVolume", "metadata": {"name": "pv"}, "spec": {"volumeMode": "Raw"}}
    with pytest.raises(
        Exception, match=r"PersistentVolume 'pv': spec.volumeMode: must be Block or Filesystem"
    ):
        kv.volume_of(kv.decode("persistentvolumes", raw(obj)))  # type: ignore[arg-type]


def test_a_volume_with_a_malformed_capacity_is_refused_naming_the_field() -> None:
    obj = {"kind": "PersistentVolume", "metadata": {"name": "pv"}, "spec": {"capacity": {"storage": "big"}}}
    with pytest.raises(Exception, match=r"PersistentVolume 'pv': spec.capacity.storage"):
        kv.volume_of(kv.decode("persistentvolumes", raw(obj)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(
            {
                "metadata": {"name": "local"},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
            },
            StorageClass(
                name="local", provisioner="kubernetes.io/no-provisioner", binding_mode="WaitForFirstConsumer"
            ),
            id="WaitForFirstConsumer",
        ),
        pytest.param(
            {"metadata": {"name": "std"}, "provisioner": "csi.example.com"},
            StorageClass(name="std", provisioner="csi.example.com"),
            id="the default binding mode is Immediate",
        ),
        pytest.param(
            {
                "metadata": {"name": "zonal"},
                "provisioner": "csi.example.com",
                "allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}]}],
            },
            StorageClass(
                name="zonal",
                provisioner="csi.example.com",
                allowed_topologies=(TopologyTerm({"zone": ("a", "b")}),),
            ),
            id="allowed topologies",
        ),
    ],
)
def test_a_storage_class_becomes_the_model_class(obj: dict[str, Any], expected: StorageClass) -> None:
    assert kv.class_of(kv.decode("storageclasses", raw(obj))) == expected  # type: ignore[arg-type]


def test_an_unknown_binding_mode_names_the_class_and_the_field() -> None:
    obj = {"metadata": {"name": "odd"}, "provisioner": "x", "volumeBindingMode": "Eventually"}
    got = kv.class_of(kv.decode("storageclasses", raw(obj)))  # type: ignore[arg-type]
    assert got.name == "odd"
    assert "StorageClass 'odd': volumeBindingMode: must be Immediate or WaitForFirstConsumer" in got.problem


def test_csi_nodes_and_capacities() -> None:
    node = {
        "metadata": {"name": "n1"},
        "spec": {
            "drivers": [
                {"name": "a", "nodeID": "n1", "allocatable": {"count": 3}},
                {"name": "b", "nodeID": "n1"},
            ]
        },
    }
    assert kv.csi_node_of(kv.decode("csinodes", raw(node))) == CsiNode(name="n1", limits={"a": 3})  # type: ignore[arg-type]
    cap = {
        "metadata": {"name": "c", "namespace": "kube-system"},
        "storageClassName": "fast",
        "nodeTopology": {"matchLabels": {"zone": "a"}},
        "capacity": "100Gi",
        "maximumVolumeSize": "10Gi",
    }
    assert kv.capacity_of(kv.decode("csistoragecapacities", raw(cap))) == StorageCapacity(  # type: ignore[arg-type]
        name="c",
        namespace="kube-system",
        storage_class="fast",
        node_topology=LabelSelector(match_labels={"zone": "a"}),
        capacity_bytes=100 * GI,
        maximum_volume_size=10 * GI,
    )


@pytest.mark.parametrize(
    ("volume", "claims"),
    [
        pytest.param(
            {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}, ("data",), id="a claim by name"
        ),
        pytest.param(
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}, ("p-scratch",), id="ephemeral"
        ),
        pytest.param({"name": "cfg", "configMap": {"name": "x"}}, (), id="other volumes name no claim"),
    ],
)
def test_a_pods_claims_are_read_from_its_volumes(volume: dict[str, Any], claims: tuple[str, ...]) -> None:
    pod = wire.convert(
        "Pod",
        {
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"pod-group-name": "g"}},
            "spec": {"volumes": [volume]},
        },
    )
    assert translate.pod_of(pod).claims == claims


# --- the mirror -----------------------------------------------------------------------------------------
def test_storage_objects_reach_the_state_bucket_and_leave_it() -> None:
    mirror = Mirror()
    mirror.storage.relist("persistentvolumeclaims", [raw(claim_json())])
    mirror.storage.relist("storageclasses", [raw({"metadata": {"name": "local"}, "provisioner": "p"})])
    changes = {c.key: c.after for c in mirror.flush(0.0)}
    assert isinstance(changes[s.volume_key("pvc", "ns", "data")], Claim)
    assert isinstance(changes[s.volume_key("storageclass", "", "local")], StorageClass)
    mirror.storage.change("persistentvolumeclaims", "DELETED", raw(claim_json()))
    (gone,) = mirror.flush(0.0)
    assert (gone.key, gone.after) == (s.volume_key("pvc", "ns", "data"), None)
    assert mirror.flush(0.0) == []


def test_a_claim_that_does_not_decode_is_kept_with_its_problem_and_others_go_on() -> None:
    storage = StorageMirror()
    broken = claim_json("broken", accessModes="ReadWriteOnce")
    storage.relist("persistentvolumeclaims", [raw(broken), raw(claim_json("fine"))])
    by_name = {o.name: o for o in storage.objects.values() if isinstance(o, Claim)}
    assert by_name["fine"].problem == ""
    assert "PersistentVolumeClaim 'ns/broken'" in by_name["broken"].problem
    assert "spec.accessModes" in by_name["broken"].problem


def test_a_volume_that_does_not_translate_is_left_out_and_noted() -> None:
    storage = StorageMirror()
    bad = {"metadata": {"name": "pv-bad"}, "spec": {"capacity": {"storage": "?"}}}
    good = {"metadata": {"name": "pv-good"}, "spec": {"capacity": {"storage": "1Gi"}}}
    storage.relist("persistentvolumes", [raw(bad), raw(good)])
    assert [o.name for o in storage.objects.values()] == ["pv-good"]
    assert "spec.capacity.storage" in storage.problems["persistentvolumes pv-bad"]


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["spec", "metadata", "status", "kind"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    )
)
def test_hostile_storage_documents_never_raise_anything_but_a_noted_problem(doc: dict[str, Any]) -> None:
    storage = StorageMirror()
    for resource in kv.KINDS:
        storage.relist(resource, [json.dumps(doc).encode()])
        storage.change(resource, "MODIFIED", json.dumps(doc).encode())
