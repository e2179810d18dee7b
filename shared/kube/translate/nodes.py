"""Kubernetes Nodes to the model's `Node`: allocatable resources, GPU memory and MIG layout from the GFD
labels, taints (KAI ``pkg/scheduler/api/node_info``).

Called by the state service's mirror for every Node it sees (`node_of`). CPU is millicores (rounded up),
memory bytes, GPUs whole devices; extended resources, huge pages and ephemeral storage whole units rounded
up (`Node.scalars`). A node that must not get work is tainted the way Kubernetes' node controller taints it
(so a pod's tolerations decide, as with KAI): ``spec.unschedulable`` adds
``node.kubernetes.io/unschedulable``; a ``Ready`` condition of ``False`` adds
``node.kubernetes.io/not-ready`` and ``Unknown`` adds ``node.kubernetes.io/unreachable`` (both
NoSchedule). A node with no Ready condition is taken as ready.
"""

from __future__ import annotations

from fractions import Fraction

from shared.kube import keys, values, wire
from shared.kube.quantity import ceil_int
from shared.kube.translate.fields import Where, is_mig, is_scalar, read_quantity, read_whole, where_of
from shared.model import Node
from shared.model.objects import Taint


def node_of(node: wire.Node) -> Node:
    """The model node: allocatable resources, GPU memory and MIG layout from the GFD labels, taints."""
    where = where_of(node)
    labels = node.metadata.labels
    alloc = node.status.allocatable
    cpu = Fraction(0)
    memory = Fraction(0)
    gpus = 0
    pods = 0
    scalars: dict[str, float] = {}
    has_mig = False
    for resource, raw in sorted(alloc.items()):
        field = f"status.allocatable[{resource}]"
        if resource == keys.CPU:
            cpu = read_quantity(where, field, raw)
        elif resource == keys.MEMORY:
            memory = read_quantity(where, field, raw)
        elif resource == keys.PODS:
            pods = ceil_int(read_quantity(where, field, raw))
        elif resource in keys.GPU_RESOURCES:
            gpus += read_whole(where, field, raw)
        elif is_mig(resource):
            scalars[resource] = float(read_whole(where, field, raw))
            has_mig = True
        elif is_scalar(resource):
            scalars[resource] = float(ceil_int(read_quantity(where, field, raw)))
    gpu_memory, synced = _node_gpu_memory(where, labels.get(keys.GPU_MEMORY_LABEL), gpus)
    mig_enabled = _mig_enabled(labels.get(keys.MIG_ENABLED_LABEL), has_mig)
    strategy = labels.get(keys.MIG_STRATEGY_LABEL) if mig_enabled else None
    return Node(
        name=node.metadata.name,
        cpu_millis=float(ceil_int(cpu * 1000)),
        memory_bytes=float(ceil_int(memory)),
        gpus=gpus,
        gpu_memory_mib=gpu_memory,
        gpu_memory_synced=synced,
        max_pods=pods,
        scalars=scalars,
        labels={**labels, keys.NODE_NAME_LABEL: node.metadata.name},
        taints=_node_taints(node),
        mig_enabled=mig_enabled,
        mig_strategy=strategy if strategy in ("single", "mixed") else None,
    )


def _node_gpu_memory(where: Where, label: str | None, gpus: int) -> tuple[int, bool]:
    """KAI ``getNodeGpuMemory``: MiB per GPU from GFD, floored to 100; values >= 1 TiB in MiB are bytes."""
    try:
        mib = values.whole(label or "", low=-(2**63), high=2**63 - 1)
    except values.InvalidValueError:
        return 100, False
    if mib >= 1024 * 1024:
        mib //= 1024 * 1024
    mib -= mib % 100
    if gpus and mib <= 0:
        field = f"metadata.labels[{keys.GPU_MEMORY_LABEL}]"
        raise where.error(field, f"GPU memory of at least 100 MiB expected on a GPU node, got {label!r}")
    return mib, True


def _mig_enabled(label: str | None, has_mig_resources: bool) -> bool:
    """KAI ``IsMIGEnabled``: the mig-enabled role label when present, else any MIG resource."""
    if label is not None:
        return label in values.GO_TRUE
    return has_mig_resources


def _node_taints(node: wire.Node) -> tuple[Taint, ...]:
    taints = [Taint(t.key, t.value, t.effect) for t in node.spec.taints]
    present = {(t.key, t.effect) for t in taints}

    def add(key: str) -> None:
        if (key, "NoSchedule") not in present:
            taints.append(Taint(key, "", "NoSchedule"))
            present.add((key, "NoSchedule"))

    if node.spec.unschedulable:
        add(keys.UNSCHEDULABLE_TAINT)
    ready = next((c for c in node.status.conditions if c.type == "Ready"), None)
    if ready is not None and ready.status == "False":
        add(keys.NOT_READY_TAINT)
    elif ready is not None and ready.status != "True":
        add(keys.UNREACHABLE_TAINT)
    return tuple(taints)
