"""GPU isolation on `kairos up`, with the real kubectl (issue 29, deliverable 5; KAI v0.17's deviceaccess and
hamicore switches, on here: state `block_nvidia_visible_devices` and `hami_core_enabled`, binder
`hami_core_enabled`):

- a pod whose GPU container sets NVIDIA_VISIBLE_DEVICES=all is refused at creation: kubectl fails with the
  webhook's message naming the container; nothing is created;
- a pod's containers that ask for no GPU run with NVIDIA_VISIBLE_DEVICES=void, whatever they set, as the
  simulated kubelet shows what each running container sees;
- a gpu-fraction 0.5 pod runs with CUDA_DEVICE_MEMORY_LIMIT, resolved as the kubelet resolves it through its
  GPU-sharing ConfigMap, equal to half its node's GPU memory (nvidia.com/gpu.memory), in HAMi-core's
  ``<MiB>m``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubectl, kubesim_stack, wait_for
from tests.e2e.manifests import Manifest, documents
from tests.e2e.test_gpu_sharing import from_configmap, kubesim_devices, running
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(
        tmp_path_factory.mktemp("kairos"),
        nodes=1,
        gpus_per_node=2,
        options={
            "state": {"block_nvidia_visible_devices": "true", "hami_core_enabled": "true"},
            "binder": {"hami_core_enabled": "true"},
        },
    ) as started:
        yield started


def create_fails(stack: Stack, *objects: Manifest, namespace: str) -> str:
    """`kubectl create` of `objects`, which must fail; its error output."""
    assert stack.kubeconfig is not None
    done = subprocess.run(
        ["kubectl", "create", "-n", namespace, "-f", "-"],
        input=documents(*objects),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": str(stack.kubeconfig)},
    )
    assert done.returncode != 0, f"created: {done.stdout}"
    return done.stderr


def shown(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(stack, "get", "pod", name, "-n", namespace, "-o", "json"))
    return found


def test_a_gpu_container_setting_nvidia_visible_devices_is_refused_naming_it(stack: Stack) -> None:
    kubectl(stack, "create", "namespace", "refused")
    greedy = manifests.pod("greedy", gpus="1", env={VISIBLE: "all"})
    error = create_fails(stack, greedy, namespace="refused")
    assert "denied the request" in error
    assert "container 'main'" in error
    assert f"sets {VISIBLE} to 'all'" in error
    assert json.loads(kubectl(stack, "get", "pods", "-n", "refused", "-o", "json"))["items"] == []

    # void and none are allowed.
    apply(stack, manifests.pod("polite", gpus="1", env={VISIBLE: "none"}), namespace="refused")
    wait_for("the polite pod running", lambda: running(stack, "refused", ["polite"]))


def test_containers_that_ask_for_no_gpu_run_with_void(stack: Stack) -> None:
    kubectl(stack, "create", "namespace", "cpu")
    two = manifests.pod("two", env={VISIBLE: "all"})
    two["spec"]["containers"].append(manifests.container(image="busybox") | {"name": "side"})
    apply(stack, two, namespace="cpu")
    stored = shown(stack, "cpu", "two")
    for container in stored["spec"]["containers"]:
        assert [e for e in container["env"] if e["name"] == VISIBLE] == [{"name": VISIBLE, "value": "void"}]
    wait_for("the CPU pod running", lambda: running(stack, "cpu", ["two"]))
    node = shown(stack, "cpu", "two")["spec"]["nodeName"]
    seen = {
        c["container"]: c["visible"]
        for c in kubesim_devices(stack, node)["containers"]
        if (c["namespace"], c["pod"]) == ("cpu", "two")
    }
    assert seen == {"main": "void", "side": "void"}


def test_a_half_gpu_pod_runs_with_half_its_devices_memory_as_its_limit(stack: Stack) -> None:
    kubectl(stack, "create", "namespace", "half")
    apply(stack, manifests.pod("half", annotations={"gpu-fraction": "0.5"}), namespace="half")
    wait_for("the half-GPU pod running", lambda: running(stack, "half", ["half"]))
    placed = shown(stack, "half", "half")
    node = json.loads(kubectl(stack, "get", "node", placed["spec"]["nodeName"], "-o", "json"))
    memory = int(node["metadata"]["labels"]["nvidia.com/gpu.memory"])
    assert from_configmap(stack, placed, LIMIT) == f"{memory // 2}m"
    assert from_configmap(stack, placed, "GPU_PORTION") == "0.50"
