"""GPU sharing that reaches the container, end to end: KAI's own gpu-sharing examples (examples/kai/gpu-sharing,
unchanged) and two half-GPU pods applied with the real kubectl against `kairos up`'s stack. Each fractional
pod's NVIDIA_VISIBLE_DEVICES, resolved through its ConfigMap, names the device its group's reservation pod
holds, which is the device the simulated kubelet's device plugin gave that reservation container; the two
halves share one device; whole-GPU pods never get a device a reservation holds; a multi-device pod sees its
two devices; deleting the sharers deletes the reservations. A pod that fits no node carries
PodScheduled=False/Unschedulable for autoscalers. Bad input (a container name that names nothing, a pod
setting NVIDIA_VISIBLE_DEVICES itself, a deleted ConfigMap, a deleted reservation pod) gets a Warning Event
naming the field or object, and the group heals.

One stack for the module; each test works in its own namespaces.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubectl, kubesim_stack, listed
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tests.e2e.manifests import Manifest
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai" / "gpu-sharing"
RESERVATIONS = "kai-resource-reservation"
DEVICE_ANNOTATION = "run.ai/reserve_for_gpu_index"
GROUP = "runai-gpu-group"
SETTLE = 90.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(
        tmp_path_factory.mktemp("kairos"),
        nodes=2,
        gpus_per_node=4,
        # Short, so that a reservation whose sharers are gone goes within the test's patience.
        options={"binder": {"reservation_grace": "1", "reservation_sync": "1"}},
    ) as started:
        yield started


# --- what the cluster shows ----------------------------------------------------------------------------
def wait_for(what: str, check: Callable[[], Any], stack: Stack, namespace: str) -> Any:
    return kubectl_wait_for(
        what, check, lambda: kubectl(stack, "get", "pods", "-A", "-o", "wide"), settle=SETTLE
    )


def pod(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(stack, "get", "pod", name, "-n", namespace, "-o", "json"))
    return found


def running(stack: Stack, namespace: str, names: list[str]) -> bool:
    pods = {p["metadata"]["name"]: p for p in listed(stack, "pods", namespace)}
    return all((pods.get(n) or {}).get("status", {}).get("phase") == "Running" for n in names)


def running_check(stack: Stack, namespace: str, names: list[str]) -> Callable[[], bool]:
    return lambda: running(stack, namespace, names)


def fraction_container(p: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The container the device is for, and whether it is an init container."""
    name = (p["metadata"].get("annotations") or {}).get("gpu-fraction-container-name")
    for init, containers in ((True, p["spec"].get("initContainers") or []), (False, p["spec"]["containers"])):
        for container in containers:
            if (name is None and not init) or container["name"] == name:
                return container, init
    raise AssertionError(f"no fraction container in {p['metadata']['name']}")


def from_configmap(stack: Stack, p: dict[str, Any], variable: str) -> str:
    """`variable` of the fraction container as the kubelet resolves it: through its ConfigMap."""
    container, _ = fraction_container(p)
    ref = next(e["valueFrom"]["configMapKeyRef"] for e in container.get("env") or () if e["name"] == variable)
    configmap = json.loads(
        kubectl(stack, "get", "configmap", ref["name"], "-n", p["metadata"]["namespace"], "-o", "json")
    )
    return str(configmap["data"][ref["key"]])


def visible_through_configmap(stack: Stack, p: dict[str, Any]) -> str:
    return from_configmap(stack, p, "NVIDIA_VISIBLE_DEVICES")


def groups_of(p: dict[str, Any]) -> list[str]:
    labels = p["metadata"].get("labels") or {}
    if GROUP in labels:
        return [labels[GROUP]]
    return [v for k, v in sorted(labels.items()) if k.startswith(GROUP + "/")]


def reservations(stack: Stack) -> dict[str, dict[str, Any]]:
    """Reservation pods by their group."""
    return {p["metadata"]["labels"][GROUP]: p for p in listed(stack, "pods", RESERVATIONS)}


def kubesim_devices(stack: Stack, node: str) -> dict[str, Any]:
    """What the simulated kubelet's device plugin gave each container on `node`, and what it sees."""
    assert stack.kubeconfig is not None
    server = yaml.safe_load(stack.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(f"{server}/kubesim/v1/nodes/{node}/devices", timeout=10) as answer:
        shown: dict[str, Any] = json.load(answer)
    return shown


def seen_by(stack: Stack, p: dict[str, Any], container: str) -> dict[str, Any]:
    for seen in kubesim_devices(stack, p["spec"]["nodeName"])["containers"]:
        if (seen["namespace"], seen["pod"], seen["container"]) == (
            p["metadata"]["namespace"],
            p["metadata"]["name"],
            container,
        ):
            return dict(seen)
    raise AssertionError(f"{p['metadata']['name']}/{container} not on its node's device list")


def assert_reaches_its_reservation(stack: Stack, p: dict[str, Any]) -> list[str]:
    """The pod's ConfigMap names the devices its groups' reservation pods hold, which are what the device
    plugin gave those reservation containers, and what the pod's fraction container sees. Its devices."""
    visible = visible_through_configmap(stack, p).split(",")
    held = reservations(stack)
    groups = groups_of(p)
    assert len(groups) == len(visible), (groups, visible)
    for group, device in zip(groups, visible, strict=True):
        reservation = held[group]
        assert reservation["spec"]["nodeName"] == p["spec"]["nodeName"]
        assert reservation["metadata"]["annotations"][DEVICE_ANNOTATION] == device
        assert seen_by(stack, reservation, "resource-reservation")["devices"] == [device]
    container, _ = fraction_container(p)
    assert seen_by(stack, p, container["name"])["visible"] == ",".join(visible)
    return visible


def half(name: str, annotations: dict[str, str] | None = None) -> Manifest:
    """A pod on half a GPU, with more of KAI's gpu-fraction annotations."""
    return manifests.pod(name, annotations={"gpu-fraction": "0.5", **(annotations or {})})


# --- specs ---------------------------------------------------------------------------------------------
def test_fractional_pods_see_the_device_their_reservation_holds(stack: Stack) -> None:
    kubectl(stack, "create", "namespace", "pair")
    apply(stack, half("half-a"), half("half-b"), namespace="pair")
    wait_for("both halves running", lambda: running(stack, "pair", ["half-a", "half-b"]), stack, "pair")
    a, b = pod(stack, "pair", "half-a"), pod(stack, "pair", "half-b")
    assert groups_of(a) == groups_of(b), "two halves share one device"
    assert assert_reaches_its_reservation(stack, a) == assert_reaches_its_reservation(stack, b)

    # KAI's examples as KAI's users apply them (two are both named gpu-sharing: separate namespaces).
    placed = {
        "kai-fraction": ["gpu-sharing.yaml"],
        "kai-memory": ["gpu-memory.yaml"],
        "kai-containers": ["gpu-sharing-non-default-container.yaml", "gpu-sharing-init-container.yaml"],
    }
    for namespace, files in placed.items():
        kubectl(stack, "create", "namespace", namespace)
        for file in files:
            kubectl(stack, "apply", "-n", namespace, "-f", str(EXAMPLES / file))
    names = {
        "kai-fraction": ["gpu-sharing"],
        "kai-memory": ["gpu-sharing"],
        "kai-containers": ["gpu-sharing-non-default", "gpu-sharing-init-container"],
    }
    for namespace, pods in names.items():
        wait_for(f"{pods} running", running_check(stack, namespace, pods), stack, namespace)
        for name in pods:
            shown = pod(stack, namespace, name)
            assert assert_reaches_its_reservation(stack, shown)
            portion = from_configmap(stack, shown, "GPU_PORTION")
            assert portion == ("0.03" if namespace == "kai-memory" else "0.50")
    init = pod(stack, "kai-containers", "gpu-sharing-init-container")
    assert fraction_container(init) == (init["spec"]["initContainers"][0], True)

    # A pod on two half devices sees both.
    kubectl(stack, "create", "namespace", "multi")
    apply(stack, half("two", {"gpu-fraction-num-devices": "2"}), namespace="multi")
    wait_for("the two-device pod running", lambda: running(stack, "multi", ["two"]), stack, "multi")
    two = pod(stack, "multi", "two")
    assert len(set(assert_reaches_its_reservation(stack, two))) == 2
    assert all(key.startswith(GROUP + "/") for key in two["metadata"]["labels"] if key.startswith(GROUP))

    # Whole-GPU pods fill what is left; none is given a device a reservation holds.
    shared_devices = len(reservations(stack))
    whole = 8 - shared_devices
    kubectl(stack, "create", "namespace", "whole")
    apply(stack, *(manifests.pod(f"whole-{i}", gpus="1") for i in range(whole)), namespace="whole")
    wait_for(
        "every whole-GPU pod running",
        lambda: running(stack, "whole", [f"whole-{i}" for i in range(whole)]),
        stack,
        "whole",
    )
    held = {p["metadata"]["annotations"][DEVICE_ANNOTATION] for p in reservations(stack).values()}
    for i in range(whole):
        given = seen_by(stack, pod(stack, "whole", f"whole-{i}"), "main")["devices"]
        assert len(given) == 1
        assert not set(given) & held
    assert not [p for p in listed(stack, "pods", "whole") if p["status"].get("phase") == "Failed"]

    # The sharers go, and so do their reservations.
    for namespace in ("pair", "kai-fraction", "kai-memory", "kai-containers", "multi"):
        kubectl(stack, "delete", "pods", "--all", "-n", namespace, "--wait=false")
    wait_for("no reservation left", lambda: not reservations(stack), stack, RESERVATIONS)
    kubectl(stack, "delete", "pods", "--all", "-n", "whole", "--wait=false")


def test_a_pod_that_fits_no_node_is_marked_unschedulable_for_autoscalers(stack: Stack) -> None:
    kubectl(stack, "create", "namespace", "big")
    apply(stack, manifests.pod("huge", gpus="16"), namespace="big")

    def unschedulable() -> dict[str, Any] | None:
        for condition in pod(stack, "big", "huge")["status"].get("conditions") or ():
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return dict(condition)
        return None

    condition = wait_for("PodScheduled=False/Unschedulable", unschedulable, stack, "big")
    assert condition["status"] == "False"
    assert condition["message"].startswith("0/2 nodes are available")
    kubectl(stack, "delete", "pod", "huge", "-n", "big", "--wait=false")


def warnings(stack: Stack, namespace: str, reason: str) -> list[str]:
    return [
        str(e.get("message", ""))
        for e in listed(stack, "events", namespace)
        if e.get("reason") == reason and e.get("type") == "Warning"
    ]


def test_bad_gpu_sharing_input_is_named_and_the_group_heals(stack: Stack) -> None:
    kubectl(stack, "create", "namespace", "bad")
    apply(
        stack,
        half("no-such-container", {"gpu-fraction-container-name": "gpu"}),
        manifests.pod(
            "own-devices", annotations={"gpu-fraction": "0.5"}, env={"NVIDIA_VISIBLE_DEVICES": "all"}
        ),
        half("good"),
        namespace="bad",
    )
    wait_for(
        "a Warning naming gpu-fraction-container-name",
        lambda: any("gpu-fraction-container-name" in m for m in warnings(stack, "bad", "InvalidPod")),
        stack,
        "bad",
    )
    wait_for(
        "a Warning naming the pod's own NVIDIA_VISIBLE_DEVICES",
        lambda: any("spec.containers[0].env[0]" in m for m in warnings(stack, "bad", "InvalidPod")),
        stack,
        "bad",
    )
    wait_for("the good pod running beside them", lambda: running(stack, "bad", ["good"]), stack, "bad")
    for held in ("no-such-container", "own-devices"):
        assert not pod(stack, "bad", held)["spec"].get("nodeName")

    good = pod(stack, "bad", "good")
    device = assert_reaches_its_reservation(stack, good)
    container, _ = fraction_container(good)
    configmap = next(
        e["valueFrom"]["configMapKeyRef"]["name"]
        for e in container["env"]
        if e["name"] == "NVIDIA_VISIBLE_DEVICES"
    )
    kubectl(stack, "delete", "configmap", configmap, "-n", "bad")
    wait_for(
        "a Warning naming the deleted ConfigMap",
        lambda: any(configmap in m for m in warnings(stack, "bad", "GPUSharingConfigMapMissing")),
        stack,
        "bad",
    )
    wait_for(
        "the ConfigMap back", lambda: visible_through_configmap(stack, good) == ",".join(device), stack, "bad"
    )

    (reservation,) = [r for g, r in reservations(stack).items() if g in groups_of(good)]
    name = reservation["metadata"]["name"]
    uid = reservation["metadata"]["uid"]
    kubectl(stack, "delete", "pod", name, "-n", RESERVATIONS, "--wait=false")
    wait_for(
        "a Warning naming the deleted reservation pod",
        lambda: any(name in m for m in warnings(stack, "bad", "GPUReservationMissing")),
        stack,
        "bad",
    )

    def healed() -> bool:
        again = reservations(stack).get(groups_of(good)[0])
        return bool(
            again
            and again["metadata"]["uid"] != uid
            and again["metadata"].get("annotations", {}).get(DEVICE_ANNOTATION)
        )

    wait_for("the reservation recreated holding a device", healed, stack, RESERVATIONS)
    assert_reaches_its_reservation(stack, pod(stack, "bad", "good"))
    kubectl(stack, "delete", "pods", "--all", "-n", "bad", "--wait=false")
