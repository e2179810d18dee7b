"""Kubernetes Node objects for the simulated cluster: from a cluster file's nodes, or generated.

`node_object(node)` converts a model `Node` (`shared.model`, as `shared.clusterfile.load_cluster` reads
it) into the Node a kubelet with NVIDIA's device plugin and GPU feature discovery would report:
capacity and allocatable cpu, memory, pods, `nvidia.com/gpu`, MIG and other extended resources
(`scalars`); labels (the file's, plus `kubernetes.io/hostname`, `kubernetes.io/os`, and on GPU nodes
`nvidia.com/gpu.count`, `nvidia.com/gpu.memory` in MiB, `nvidia.com/gpu.present`, and
`nvidia.com/mig.strategy` / `node-role.kubernetes.io/mig-enabled` for MIG nodes); taints; a Ready
condition and nodeInfo with a kubelet version. `generated_nodes(n, gpus_per_node)` builds a uniform
GPU cluster. Used by `tools.kubesim.cluster.Cluster.add_nodes` (start-up). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.model import Node
from tools.kubesim.objects import format_cpu, format_memory

__all__ = ["KUBELET_VERSION", "generated_nodes", "node_object"]

Obj = dict[str, Any]

KUBELET_VERSION = "v1.32.0-kubesim"
GPU_RESOURCE = "nvidia.com/gpu"
NUMA_ANNOTATION = "kubesim.kairos.io/numa"
"""A node's NUMA zones and Topology Manager setting (`Node.numa` as JSON), for the simulated kubelet."""


def _scalar(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def node_object(node: Node) -> Obj:
    """The Kubernetes Node for a model node (without uid, resourceVersion or timestamps)."""
    resources: dict[str, str] = {
        "cpu": format_cpu(node.cpu_millis),
        "memory": format_memory(node.memory_bytes),
        "pods": str(node.max_pods),
        "ephemeral-storage": "100Gi",
    }
    if node.gpus:
        resources[GPU_RESOURCE] = str(node.gpus)
    for name, value in sorted(node.scalars.items()):
        resources[name] = _scalar(value)
    labels: dict[str, str] = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if node.gpus or any(k.startswith("nvidia.com/mig-") for k in node.scalars):
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.count"] = str(node.gpus)
        labels["nvidia.com/gpu.memory"] = str(node.gpu_memory_mib)
    if node.mig_strategy:
        labels["nvidia.com/mig.strategy"] = node.mig_strategy
    if node.mig_enabled:
        labels["node-role.kubernetes.io/mig-enabled"] = "true"
    labels.update(node.labels)
    spec: Obj = {}
    if node.taints:
        spec["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints]
    annotations = {"kwok.x-k8s.io/node": "fake"}
    if node.numa is not None:  # the simulated kubelet's zones (`tools.kubesim.operators.numa`)
        annotations[NUMA_ANNOTATION] = msgspec.json.encode(node.numa).decode()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def generated_nodes(count: int, gpus_per_node: int, *, prefix: str = "node") -> list[Node]:
    """`count` identical GPU nodes (`gpus_per_node` 80 GiB GPUs, 8 CPU cores and 64 GiB per GPU)."""
    width = max(1, len(str(max(count - 1, 0))))
    per = max(gpus_per_node, 1)
    return [
        Node(
            name=f"{prefix}-{i:0{width}d}",
            cpu_millis=8000.0 * per,
            memory_bytes=float(64 * 2**30 * per),
            gpus=gpus_per_node,
            gpu_memory_mib=81920,
        )
        for i in range(count)
    ]
