"""Placing fractional and GPU-memory pods on shared devices (KAI `gpu_sharing`).

A shared pod goes onto existing shared devices with room, or opens a new shared device (a new GPU group)
on a whole idle or releasing GPU. Called by the allocation helper in `shared.core.allocation` (which
allocates or pipelines the pod on the devices chosen here), by the predicates, and by
`shared.core.statement.bind_on_free_room`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.scoring import WHOLE_GPU, fitting_gpus

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState


@dataclass(frozen=True)
class GpuChoice:
    groups: list[str]
    releasing: bool


def is_new_group(gid: str) -> bool:
    """KAI tells groups it created this cycle (non-numeric ids) from ones the cluster reported."""
    try:
        int(gid)
    except ValueError:
        return True
    return False


def _new_group_id(node: NodeState, taken: list[str]) -> str:
    k = 0
    while f"new-{node.name}-{k}" in node.groups or f"new-{node.name}-{k}" in taken:
        k += 1
    return f"new-{node.name}-{k}"


def preferable_gpus(
    ssn: Session, node: NodeState, task: TaskState, pipeline_only: bool, idle_only: bool = False
) -> GpuChoice | None:
    """KAI `getNodePreferableGpuForSharing`: the devices this pod would use on the node, best first. With
    `idle_only` the devices whose room is not idle now are passed over (the pod is to be bound at once,
    `shared.core.statement.bind_on_free_room`), so the choice, if any, is never releasing."""
    groups: list[str] = []
    releasing = False
    devices = task.gpu.devices
    for gid in fitting_gpus(ssn, node, task):
        if gid == WHOLE_GPU:
            whole_releasing = pipeline_only or not node.fits(task, with_releasing=False)
            if idle_only and whole_releasing:
                continue
            releasing = releasing or whole_releasing
            groups.append(_new_group_id(node, groups))
        else:
            group_releasing = not node.enough_idle_on_group(task, gid) or not node.fits(
                task, with_releasing=False
            )
            if idle_only and group_releasing:
                continue
            releasing = releasing or group_releasing
            groups.append(gid)
        if len(groups) == devices:
            return GpuChoice(groups, releasing)
    return None
