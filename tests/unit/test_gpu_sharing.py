"""GPU sharing as values (`shared.kube.gpu_sharing`): KAI's ConfigMap names and environment, the admission
patch as the API server applies it, reservation pods, group labels and which reservations are orphaned."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import gpu_sharing as g
from shared.kube import keys, translate, wire
from tests import builders
from tools.kubesim.patch import json_patch

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def pod_doc(
    annotations: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    """Pending pod gpu-sharing of team asking for half a GPU, with `containers` (one, ``main``, by default),
    `init_containers`, and `meta`'s fields in its metadata."""
    spec: dict[str, Any] = {}
    if containers is not None:
        spec["containers"] = containers
    if init_containers:
        spec["initContainers"] = init_containers
    manifest = builders.pod_manifest(
        "gpu-sharing", "team", annotations={"gpu-fraction": "0.5", **(annotations or {})}, **spec
    )
    return builders.stored(manifest, uid="uid-1", resource_version=None, created=None, **meta)


def wire_pod(doc: dict[str, Any]) -> wire.Pod:
    return wire.convert(wire.Pod, doc)


def admit(doc: dict[str, Any], random: str = "abc2def") -> dict[str, Any]:
    """What the API server stores after applying the webhook's JSON patch."""
    stored: dict[str, Any] = json_patch(copy.deepcopy(doc), g.admission_patch(wire_pod(doc), random))
    return stored


def env_refs(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["configMapKeyRef"]["name"], e["valueFrom"]["configMapKeyRef"]["key"])
        for e in container.get("env") or ()
        if "valueFrom" in e
    }


# --- the fraction container ----------------------------------------------------------------------------
def test_the_device_is_for_the_first_container_by_default() -> None:
    assert g.fraction_container(wire_pod(pod_doc())) == g.ContainerRef("containers", 0, "main")


def test_gpu_fraction_container_name_picks_a_container_or_an_init_container() -> None:
    doc = pod_doc(
        {"gpu-fraction-container-name": "gpu-init"},
        containers=[{"name": "main"}],
        init_containers=[{"name": "setup"}, {"name": "gpu-init"}],
    )
    ref = g.fraction_container(wire_pod(doc))
    assert ref == g.ContainerRef("initContainers", 1, "gpu-init")
    assert ref.suffix == "i1"
    assert g.capabilities_configmap("p", ref) == "p-i1"
    assert g.direct_env_configmap("p", ref) == "p-i1-evar"


def test_a_container_name_that_names_no_container_is_an_error_naming_the_annotation() -> None:
    doc = pod_doc({"gpu-fraction-container-name": "gpu-workload"}, containers=[{"name": "main"}])
    with pytest.raises(InvalidObject) as info:
        g.fraction_container(wire_pod(doc))
    assert info.value.kind == "Pod"
    assert info.value.name == "team/gpu-sharing"
    assert info.value.field == "metadata.annotations[gpu-fraction-container-name]"
    assert "'gpu-workload'" in info.value.problem
    assert "'main'" in info.value.problem


# --- admission ----------------------------------------------------------------------------------------
def test_admission_gives_the_fraction_container_kais_environment_from_a_per_pod_configmap() -> None:
    doc = pod_doc(
        {"gpu-fraction-container-name": "gpu-workload"},
        containers=[{"name": "sidecar"}, {"name": "gpu-workload", "env": [{"name": "A", "value": "1"}]}],
    )
    stored = admit(doc, "abc2def")
    prefix = stored["metadata"]["annotations"][g.CONFIGMAP_ANNOTATION]
    assert prefix == "gpu-sharing-abc2def-shared-gpu"
    sidecar, workload = stored["spec"]["containers"]
    assert "env" not in sidecar
    assert env_refs(workload) == {
        name: (f"{prefix}-1", name) for name in (g.NVIDIA_VISIBLE_DEVICES, g.NUM_OF_GPUS, g.GPU_PORTION)
    }
    assert workload["env"][0] == {"name": "A", "value": "1"}
    assert workload["envFrom"] == [{"configMapRef": {"name": f"{prefix}-1-evar", "optional": False}}]
    assert stored["spec"]["volumes"] == [
        {"name": f"{prefix}-1-vol", "configMap": {"name": f"{prefix}-1"}},
    ]


def test_a_pod_made_by_a_controller_is_named_after_its_owner() -> None:
    doc = pod_doc(ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j"}])
    doc["metadata"]["name"] = ""
    doc["metadata"]["generateName"] = "train-"
    prefix = admit(doc, "zzzzzzz")["metadata"]["annotations"][g.CONFIGMAP_ANNOTATION]
    assert prefix == "train-zzzzzzz-shared-gpu"


def test_admission_is_idempotent_so_each_webhook_replica_may_see_the_pod() -> None:
    once = admit(pod_doc())
    assert g.admission_patch(wire_pod(once), "other99") == []


def test_a_pod_that_is_not_fractional_is_not_touched() -> None:
    doc = pod_doc()
    del doc["metadata"]["annotations"]["gpu-fraction"]
    assert g.admission_patch(wire_pod(doc), "abc2def") == []


def test_a_pod_that_sets_nvidia_visible_devices_itself_is_left_alone_and_named_as_the_problem() -> None:
    doc = pod_doc(containers=[{"name": "main", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}])
    assert g.admission_patch(wire_pod(doc), "abc2def") == []
    problem = g.sharing_env_problem(wire_pod(doc), g.fraction_container(wire_pod(doc)))
    assert problem is not None
    assert problem.field == "spec.containers[0].env[0]"
    assert "NVIDIA_VISIBLE_DEVICES" in problem.problem


def test_the_admitted_environment_is_not_a_problem() -> None:
    stored = wire_pod(admit(pod_doc()))
    assert g.sharing_env_problem(stored, g.fraction_container(stored)) is None


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=63).filter(
    lambda n: n[0].isalnum() and n[-1].isalnum()
)


@settings(max_examples=60, deadline=None)
@given(
    owner=names,
    containers=st.lists(names, min_size=1, max_size=12, unique=True),
    inits=st.lists(names, max_size=3, unique=True),
    pick=st.integers(min_value=0, max_value=20),
)
def test_admission_reaches_exactly_the_chosen_container_with_valid_names(
    owner: str, containers: list[str], inits: list[str], pick: int
) -> None:
    inits = [n for n in inits if n not in containers]
    everyone = [*inits, *containers]
    chosen = everyone[pick % len(everyone)]
    doc = pod_doc(
        {"gpu-fraction-container-name": chosen},
        containers=[{"name": n} for n in containers],
        init_containers=[{"name": n} for n in inits],
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": "r"}],
    )
    stored = admit(doc)
    with_env = [
        c["name"]
        for c in (*stored["spec"].get("initContainers", ()), *stored["spec"]["containers"])
        if g.NVIDIA_VISIBLE_DEVICES in env_refs(c)
    ]
    assert with_env == [chosen]
    for volume in stored["spec"]["volumes"]:
        assert DNS_LABEL.fullmatch(volume["name"]), volume["name"]
    configmap = stored["spec"]["volumes"][0]["configMap"]["name"]
    assert (
        len(g.direct_env_configmap(configmap.rsplit("-", 1)[0], g.fraction_container(wire_pod(stored)))) <= 63
    )


# --- translation holds a fractional pod that could not reach its device ----------------------------------
def bound_to_group(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"]["annotations"]["pod-group-name"] = "pg"
    return doc


def test_a_pending_fractional_pod_without_the_environment_is_held_naming_the_annotation() -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(wire_pod(bound_to_group(pod_doc())))
    assert info.value.field == f"metadata.annotations[{g.CONFIGMAP_ANNOTATION}]"
    assert "webhook" in info.value.problem


def test_a_running_fractional_pod_without_the_environment_stays_counted() -> None:
    doc = bound_to_group(pod_doc())
    doc["spec"]["nodeName"] = "n1"
    doc["status"]["phase"] = "Running"
    assert translate.pod_of(wire_pod(doc)).gpu.fraction == 0.5


def test_an_admitted_fractional_pod_translates() -> None:
    assert translate.pod_of(wire_pod(admit(bound_to_group(pod_doc())))).gpu.fraction == 0.5


def test_translation_names_a_wrong_container_name_and_an_own_visible_devices_variable() -> None:
    wrong = bound_to_group(pod_doc({"gpu-fraction-container-name": "nope"}))
    with pytest.raises(InvalidObject, match=r"gpu-fraction-container-name"):
        translate.pod_of(wire_pod(wrong))
    own = bound_to_group(
        pod_doc(containers=[{"name": "main", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}])
    )
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(wire_pod(own))
    assert info.value.field == "spec.containers[0].env[0]"


# --- reservations and labels ----------------------------------------------------------------------------
def test_reservation_names_are_per_node_and_group_and_stable() -> None:
    a = g.reservation_pod_name("node-1", "new-node-1-0")
    assert a == g.reservation_pod_name("node-1", "new-node-1-0")
    assert a != g.reservation_pod_name("node-2", "new-node-1-0")
    assert a != g.reservation_pod_name("node-1", "new-node-1-1")
    assert a.startswith("gpu-reservation-")
    assert DNS_LABEL.fullmatch(a)


def test_a_reservation_pod_holds_one_gpu_on_its_node_labelled_with_its_group() -> None:
    body = g.reservation_pod(
        "node-1",
        "new-node-1-0",
        image="kairos",
        command=["python", "-m", "x"],
        service_account="kairos-reservation",
        tolerations=[{"key": "gpu", "operator": "Exists"}],
    )
    assert body["metadata"]["namespace"] == "kai-resource-reservation"
    assert body["metadata"]["labels"][keys.KAI_GPU_GROUP_LABEL] == "new-node-1-0"
    assert body["spec"]["nodeName"] == "node-1"
    container = body["spec"]["containers"][0]
    assert container["name"] == "resource-reservation"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert body["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert g.is_reservation_pod(body["metadata"]["namespace"], body["metadata"]["labels"])


def test_one_device_gets_kais_group_label_several_get_one_label_per_group() -> None:
    assert g.group_labels_patch(["a"])["metadata"]["labels"] == {
        "runai-gpu-group": "a",
        g.SHARING_LABEL: "true",
    }
    labels = g.group_labels_patch(["a", "b"])["metadata"]["labels"]
    assert labels == {"runai-gpu-group/a": "a", "runai-gpu-group/b": "b", g.SHARING_LABEL: "true"}
    assert g.groups_of_labels(labels) == ["a", "b"]


def test_a_group_too_long_for_a_label_value_becomes_a_digest() -> None:
    long = "new-" + "x" * 80 + "-0"
    value = g.group_label_value(long)
    assert len(value) <= 63
    assert value == g.group_label_value(long)
    assert g.group_label_value("new-node-1-0") == "new-node-1-0"


def labelled(name: str, namespace: str, labels: dict[str, str], phase: str, created: str) -> wire.Pod:
    return wire.convert(
        wire.Pod,
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "creationTimestamp": created,
            },
            "status": {"phase": phase},
        },
    )


def test_a_reservation_no_live_pod_names_is_orphaned_after_the_grace() -> None:
    old = "2027-01-15T08:00:00Z"
    now = translate.parse_time(old) + 3600
    reservation = {"runai-gpu-group": "g1", "app": g.RESERVATION_APP}
    pods = [
        labelled("r1", g.RESERVATION_NAMESPACE, reservation, "Running", old),
        labelled("r2", g.RESERVATION_NAMESPACE, {**reservation, "runai-gpu-group": "g2"}, "Running", old),
        labelled("r3", g.RESERVATION_NAMESPACE, {**reservation, "runai-gpu-group": "g3"}, "Running", old),
        labelled("r4", g.RESERVATION_NAMESPACE, {**reservation, "runai-gpu-group": "g4"}, "Running", old),
        labelled("a", "team", {"runai-gpu-group": "g1"}, "Running", old),
        labelled("b", "team", {"runai-gpu-group/g2": "g2", "runai-gpu-group/g9": "g9"}, "Pending", old),
        labelled("c", "team", {"runai-gpu-group": "g3"}, "Succeeded", old),
    ]
    orphans = g.orphaned_reservations(pods, now=now, grace=60.0, busy=["g4"])
    assert [p.metadata.name for p in orphans] == ["r3"]


def test_a_young_reservation_is_kept_while_its_binder_labels_the_pod() -> None:
    created = "2027-01-15T08:00:00Z"
    pods = [labelled("r", g.RESERVATION_NAMESPACE, {"runai-gpu-group": "g"}, "Running", created)]
    assert g.orphaned_reservations(pods, now=translate.parse_time(created) + 10, grace=60.0) == []
    assert len(g.orphaned_reservations(pods, now=translate.parse_time(created) + 61, grace=60.0)) == 1


# --- the reservation container ---------------------------------------------------------------------------
class FakeNvml:
    def __init__(self, uuids: list[str | bytes]) -> None:
        self.uuids = uuids

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        return self.uuids[handle]


def test_the_reservation_container_reports_the_one_device_it_sees() -> None:
    uuids = g.visible_device_uuids(FakeNvml([b"GPU-1111"]))
    assert uuids == ["GPU-1111"]
    assert g.reserved_device_patch(uuids) == {
        "metadata": {"annotations": {g.RESERVED_DEVICE_ANNOTATION: "GPU-1111"}}
    }
    assert g.reserved_devices_of({g.RESERVED_DEVICE_ANNOTATION: "GPU-1111"}) == "GPU-1111"
    assert g.reserved_devices_of({}) is None


@pytest.mark.parametrize("seen", [[], ["GPU-1", "GPU-2"]])
def test_a_reservation_container_seeing_no_device_or_several_is_an_error(seen: list[str | bytes]) -> None:
    with pytest.raises(InvalidObject, match="expected exactly 1"):
        g.reserved_device_patch(g.visible_device_uuids(FakeNvml(seen)))


def test_gpu_portion_is_written_with_two_decimals() -> None:
    assert g.gpu_portion(0.5) == "0.50"
    assert g.gpu_portion(0.125) == "0.12"
