"""NUMA-aware scheduling on `kairos up`, with the real kubectl (issue 29, deliverable 6; KAI v0.16's opt-in
``numa`` plugin, enabled on KAI's default SchedulingShard):

- the cluster file gives two GPU nodes NUMA zones under single-numa-node: ``a-split`` has 2 GPUs, one on
  each NUMA node, ``b-together`` 4, 3 on the first and 1 on the second; kubesim publishes their
  NodeResourceTopology objects;
- a Guaranteed 2-GPU pod is bound to ``b-together`` (the only node with a zone holding 2 free GPUs) and
  runs, where GPU binpacking alone picks ``a-split`` (the pod fills it), whose kubelet refuses it with
  TopologyAffinityError; the node's object then shows the pod's GPUs taken from its first zone;
- a second such pod stays Pending (``b-together`` still has 2 GPUs free, 1 per zone), and says that no node
  could fit it in one NUMA node;
- a NodeResourceTopology that does not add up (a zone with more GPUs than its node) gets a Warning naming
  the field, and its node schedules as without one.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import QUEUE_PERIOD, RUN_DELAY, apply, kairos, kubectl, wait_for
from tools.stack.supervisor import DEFAULT_REPLICAS, ClusterChoice, Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GPU = "nvidia.com/gpu"
CLUSTER = """
nodes:
  - name: a-split
    cpu_millis: 32000
    memory_bytes: 137438953472
    gpus: 2
    gpu_memory_mib: 81920
    numa:
      policy: single-numa-node
      zones:
        - {name: node-0, allocatable: {cpu: 16000, memory: 68719476736, nvidia.com/gpu: 1}}
        - {name: node-1, allocatable: {cpu: 16000, memory: 68719476736, nvidia.com/gpu: 1}}
  - name: b-together
    cpu_millis: 32000
    memory_bytes: 137438953472
    gpus: 4
    gpu_memory_mib: 81920
    numa:
      policy: single-numa-node
      zones:
        - {name: node-0, allocatable: {cpu: 16000, memory: 68719476736, nvidia.com/gpu: 3}}
        - {name: node-1, allocatable: {cpu: 16000, memory: 68719476736, nvidia.com/gpu: 1}}
  - name: c-plain
    cpu_millis: 8000
    memory_bytes: 17179869184
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("numa")
    cluster_file = state_dir / "cluster.yaml"
    cluster_file.write_text(CLUSTER)
    started = start_stack(
        state_dir,
        replicas=dict(DEFAULT_REPLICAS),
        cluster=ClusterChoice(kind="kubesim", cluster_file=Path(cluster_file), run_delay=RUN_DELAY),
        options={"queue": {"period": QUEUE_PERIOD}},
    )
    try:
        yield started
    finally:
        started.stop()


def guaranteed_pod(name: str, gpus: int) -> dict[str, Any]:
    pod = manifests.pod(name)
    amounts = {"cpu": "2", "memory": "1Gi", GPU: str(gpus)}
    pod["spec"]["containers"][0]["resources"] = {"requests": amounts, "limits": amounts}
    return pod


def got(stack: Stack, *args: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(kubectl(stack, "get", *args, "-o", "json"))
    return answer


def enable_numa(stack: Stack) -> None:
    """The numa plugin on KAI's default SchedulingShard, waited for until the state service has it in KV."""
    kubectl(
        stack, "patch", "schedulingshard", "default", "--type=merge", "-p", '{"spec":{"plugins":{"numa":{}}}}'
    )
    version = int(got(stack, "schedulingshard", "default")["metadata"]["resourceVersion"])

    def in_force() -> bool:
        # The record may be read after the state service's own status patch (the Served condition), so it
        # can carry a later resourceVersion than the spec patch's (kubesim's are increasing integers).
        shown = re.findall(r"shard default, resourceVersion (\d+)\)", kairos(stack, "status"))
        return bool(shown) and int(shown[0]) >= version

    wait_for("the numa plugin in force", in_force)
    time.sleep(2 * float(QUEUE_PERIOD))  # the placement workers read the record at their next cycle


def test_a_guaranteed_two_gpu_pod_is_bound_where_one_numa_node_has_both_gpus(stack: Stack) -> None:
    zones = got(stack, "noderesourcetopologies", "b-together")["zones"]
    assert [z["name"] for z in zones] == ["node-0", "node-1"]
    enable_numa(stack)

    apply(stack, guaranteed_pod("train", 2))

    def running() -> dict[str, Any] | None:
        pod = got(stack, "pod", "train", "-n", "default")
        return pod if pod["status"].get("phase") in ("Running", "Failed") else None

    pod = wait_for("the pod running", running)
    assert (pod["spec"]["nodeName"], pod["status"]["phase"]) == ("b-together", "Running")

    def taken() -> list[str] | None:
        zone = got(stack, "noderesourcetopologies", "b-together")["zones"][0]
        gpus = next(r for r in zone["resources"] if r["name"] == GPU)
        return gpus if gpus["available"] == "1" else None

    wait_for("the zone's GPUs shown taken", taken)


def test_a_pod_no_node_can_align_stays_pending_and_says_why(stack: Stack) -> None:
    apply(stack, guaranteed_pod("second", 2))

    def told() -> str | None:
        events = got(stack, "events", "-n", "default")["items"]
        text = " ".join(e.get("message", "") for e in events if e["involvedObject"]["name"] == "second")
        text += " ".join(
            c.get("message", "")
            for c in got(stack, "pod", "second", "-n", "default")["status"].get("conditions", [])
        )
        return text if "could not fit the pod in one NUMA node" in text else None

    wait_for("the pod's reason", told)
    assert got(stack, "pod", "second", "-n", "default")["status"].get("phase") == "Pending"


def test_an_object_that_does_not_add_up_gets_a_warning_naming_the_field(stack: Stack) -> None:
    bad = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "c-plain"},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": [
            {
                "name": "node-0",
                "type": "Node",
                "resources": [{"name": GPU, "capacity": "9", "allocatable": "9", "available": "9"}],
            }
        ],
    }
    apply(stack, bad)

    def warned() -> str | None:
        for event in got(stack, "events", "-n", "default")["items"]:
            if event["involvedObject"].get("kind") == "NodeResourceTopology" and event["reason"] == (
                "InvalidNodeResourceTopology"
            ):
                return str(event["message"])
        return None

    message = wait_for("the Warning", warned)
    assert "zones[0].resources[0].allocatable" in message
    assert "c-plain" in message
