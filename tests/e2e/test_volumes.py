"""Persistent volumes through the real kubectl against `kairos up` (issue 30, deliverable 1): kube-scheduler's
volume binding rules decide where a pod goes, the binder binds its volumes before the pod, and a pod whose
claims cannot be met waits, saying why in kube-scheduler's words.

- a WaitForFirstConsumer claim only a local volume on node-2 can satisfy: the pod runs on node-2 and the
  volume is bound to the claim;
- a claim bound to a volume pinned to a tainted node: the pod waits, FailedScheduling naming the volume
  node affinity conflict;
- a pod naming a claim that does not exist, or a claim of a class that does not exist: Pending, with a
  Warning and PodScheduled=False naming the claim (and the class and the field);
- dynamic provisioning: the claim gets the pod's node as selected-node, kubesim's provisioner makes a
  volume there, the pod runs;
- a provisioner that gives up (a class marked to fail): the binder waits for the claim before binding the
  pod, so the pod stays Pending and unbound, with a Warning naming the claim; once the class is fixed (made
  again without the mark: a class's parameters cannot change) the pod runs;
- a generic ephemeral volume whose claim ``<pod>-<volume>`` was made by hand, not owned by the pod: the pod
  waits, saying the claim was not created for it (kube-scheduler's words);
- the default StorageClass: a claim applied without a class while no class is the default holds its pod as
  an unbound Immediate claim; once a class annotated as the default is applied the claim gets it
  (kube-controller-manager's retroactive assignment) and the pod runs; a claim applied afterwards without a
  class gets it at creation (the DefaultStorageClass admission plugin). Last: it makes a class the default.

Four generated nodes, node-3 tainted by kubectl first. One stack for the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubectl, kubesim_stack
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tools.kubesim.storage import DRIVER, FAIL_PARAMETER
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TAINTED = "node-3"
SETTLE = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=4, gpus_per_node=0) as started:
        kubectl(started, "taint", "node", TAINTED, "dedicated=storage:NoSchedule")
        apply(
            started,
            storage_class("local", "kubernetes.io/no-provisioner"),
            storage_class("fast", DRIVER),
        )
        yield started


def storage_class(name: str, provisioner: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def local_volume(name: str, node: str, claim: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": "10Gi"},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local",
        "local": {"path": f"/mnt/{name}"},
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                        ]
                    }
                ]
            }
        },
    }
    if claim:
        spec["claimRef"] = {"namespace": "default", "name": claim}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def claim(name: str, cls: str, volume: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "5Gi"}},
        "storageClassName": cls,
    }
    if volume:
        spec["volumeName"] = volume
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def pod_with(name: str, claim_name: str) -> dict[str, Any]:
    out = manifests.pod(name, cpu="1")
    out["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    return out


def get(stack: Stack, kind: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl(stack, "get", kind, name, "-o", "json"))  # type: ignore[no-any-return]


def wait_for(stack: Stack, what: str, check: Any, name: str) -> Any:
    return kubectl_wait_for(what, check, lambda: json.dumps(get(stack, "pod", name), indent=1), settle=SETTLE)


def running_on(stack: Stack, name: str) -> str | None:
    found = get(stack, "pod", name)
    return found["spec"].get("nodeName") if found["status"].get("phase") == "Running" else None


def unschedulable(stack: Stack, name: str) -> str | None:
    found = get(stack, "pod", name)
    if found["spec"].get("nodeName"):
        pytest.fail(f"pod {name} was bound to {found['spec']['nodeName']}")
    for condition in found["status"].get("conditions", []):
        if (
            condition["type"] == "PodScheduled"
            and condition["status"] == "False"
            and condition.get("message")
        ):
            return str(condition["message"])
    return None


def warnings(stack: Stack, name: str) -> str:
    listed = json.loads(
        kubectl(stack, "get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    )
    return "\n".join(e.get("message", "") for e in listed["items"] if e.get("type") == "Warning")


def test_a_claim_only_a_local_volume_on_node_2_can_satisfy_takes_the_pod_to_node_2(stack: Stack) -> None:
    apply(stack, local_volume("local-2", "node-2"), claim("data", "local"), pod_with("trainer", "data"))
    assert wait_for(stack, "trainer Running", lambda: running_on(stack, "trainer"), "trainer") == "node-2"
    bound = get(stack, "pvc", "data")
    assert (bound["spec"]["volumeName"], bound["status"]["phase"]) == ("local-2", "Bound")
    assert get(stack, "pv", "local-2")["spec"]["claimRef"]["name"] == "data"


def test_a_bound_volume_pinned_to_a_tainted_node_keeps_the_pod_waiting(stack: Stack) -> None:
    apply(
        stack, local_volume("pinned-3", TAINTED, claim="pinned"), claim("pinned", "local", volume="pinned-3")
    )
    kubectl_wait_for(
        "claim pinned Bound", lambda: get(stack, "pvc", "pinned")["status"].get("phase") == "Bound"
    )
    apply(stack, pod_with("stuck", "pinned"))
    message = wait_for(stack, "stuck explained", lambda: unschedulable(stack, "stuck"), "stuck")
    assert "node(s) had volume node affinity conflict" in message
    assert "node(s) had volume node affinity conflict" in warnings(stack, "stuck")


def test_a_pod_naming_a_missing_claim_is_pending_with_a_warning_naming_it(stack: Stack) -> None:
    apply(stack, pod_with("orphan", "nowhere"))
    message = wait_for(stack, "orphan explained", lambda: unschedulable(stack, "orphan"), "orphan")
    assert 'persistentvolumeclaim "nowhere" not found' in message
    assert 'persistentvolumeclaim "nowhere" not found' in warnings(stack, "orphan")


def test_a_claim_of_a_class_that_does_not_exist_holds_its_pod_naming_class_and_field(stack: Stack) -> None:
    apply(stack, claim("classless", "no-such-class"), pod_with("odd", "classless"))
    message = wait_for(stack, "odd explained", lambda: unschedulable(stack, "odd"), "odd")
    assert 'persistentvolumeclaim "classless": spec.storageClassName' in message
    assert 'storageclass.storage.k8s.io "no-such-class" not found' in message


def test_dynamic_provisioning_on_the_node_the_pod_goes_to(stack: Stack) -> None:
    apply(stack, claim("scratch", "fast"), pod_with("builder", "scratch"))
    node = wait_for(stack, "builder Running", lambda: running_on(stack, "builder"), "builder")
    provisioned = get(stack, "pvc", "scratch")
    assert provisioned["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
    assert provisioned["status"]["phase"] == "Bound"
    volume = get(stack, "pv", provisioned["spec"]["volumeName"])
    (term,) = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == [node]


def test_a_pod_whose_provisioning_fails_waits_unbound_until_its_class_is_fixed(stack: Stack) -> None:
    failing = storage_class("flaky", DRIVER) | {"parameters": {FAIL_PARAMETER: "true"}}
    apply(stack, failing, claim("brittle", "flaky"), pod_with("fragile", "brittle"))
    said = 'provisioning failed for PVC "brittle"'
    message = wait_for(
        stack, "fragile refused", lambda: said in warnings(stack, "fragile") or None, "fragile"
    )
    assert message
    found = get(stack, "pod", "fragile")
    assert not found["spec"].get("nodeName")
    assert found["status"].get("phase") == "Pending"
    assert 'failed to provision volume with StorageClass "flaky"' in warnings(stack, "fragile")
    kubectl(stack, "delete", "storageclass", "flaky")
    apply(stack, storage_class("flaky", DRIVER))
    node = wait_for(stack, "fragile Running", lambda: running_on(stack, "fragile"), "fragile")
    assert (
        get(stack, "pvc", "brittle")["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
    )


def test_an_ephemeral_volumes_claim_the_pod_does_not_own_keeps_the_pod_waiting(stack: Stack) -> None:
    # The claim <pod>-<volume> made by hand: no ownerReference to the pod, so it is not the pod's volume.
    apply(stack, claim("borrower-scratch", "fast"))
    out = manifests.pod("borrower", cpu="1")
    template = {"spec": claim("", "fast")["spec"]}
    out["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}]
    apply(stack, out)
    said = "PVC default/borrower-scratch was not created for pod default/borrower (pod is not owner)"
    message = wait_for(stack, "borrower explained", lambda: unschedulable(stack, "borrower"), "borrower")
    assert said in message
    assert said in warnings(stack, "borrower")


def test_an_ephemeral_volume_gets_its_claim_owned_by_the_pod_and_the_pod_runs_where_it_is_provisioned(
    stack: Stack,
) -> None:
    out = manifests.pod("scratcher", cpu="1")
    template = {"metadata": {"labels": {"role": "scratch"}}, "spec": claim("", "fast")["spec"]}
    out["spec"]["volumes"] = [{"name": "tmp", "ephemeral": {"volumeClaimTemplate": template}}]
    apply(stack, out)
    node = wait_for(stack, "scratcher Running", lambda: running_on(stack, "scratcher"), "scratcher")
    made = get(stack, "pvc", "scratcher-tmp")
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod",
        "scratcher",
        get(stack, "pod", "scratcher")["metadata"]["uid"],
        True,
    )
    assert made["metadata"]["labels"] == {"role": "scratch"}
    assert made["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
    assert made["status"]["phase"] == "Bound"


def test_a_claim_without_a_class_gets_the_default_class_and_its_pod_runs(stack: Stack) -> None:
    unnamed = claim("plain", "")
    del unnamed["spec"]["storageClassName"]
    apply(stack, unnamed, pod_with("waiter", "plain"))
    message = wait_for(stack, "waiter explained", lambda: unschedulable(stack, "waiter"), "waiter")
    assert "pod has unbound immediate PersistentVolumeClaims" in message
    assert "storageClassName" not in get(stack, "pvc", "plain")["spec"]
    default = storage_class("standard", DRIVER)
    default["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    apply(stack, default)
    node = wait_for(stack, "waiter Running", lambda: running_on(stack, "waiter"), "waiter")
    given = get(stack, "pvc", "plain")
    assert given["spec"]["storageClassName"] == "standard"
    assert given["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
    later = claim("later", "")
    del later["spec"]["storageClassName"]
    apply(stack, later, pod_with("latecomer", "later"))
    assert get(stack, "pvc", "later")["spec"]["storageClassName"] == "standard"
    wait_for(stack, "latecomer Running", lambda: running_on(stack, "latecomer"), "latecomer")
