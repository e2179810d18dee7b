"""What a plugin may read of the cycle: a typed, read-only view (`CycleView`), instead of the core's Session.

The extension points (`shared.core.plugins.points`) hand a plugin the session as their first argument; a
plugin outside the core types that argument as `CycleView` (and the pod as `TaskView`), so it reads only
what this module names and cannot change any of it. The fields are what the built-in plugins read of the
session themselves: the nodes in their fixed order (every score is a vector over `cluster.order`), the
node and pod objects, the policy, the cycle's time, the jobs, and the proportion plugin's queue capacity
answers. The core's `Session` satisfies the protocol (checked in `shared.core.builtin_plugins`), so the
runtime passes it as is: no copy per call. The built-in plugins, part of the core, still type it as the
Session, to hand it to the core's own filters and scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.policy import Policy
    from shared.core.proportion import CapacityResult
    from shared.core.tasks import JobState, TaskState
    from shared.model import Node, Pod

__all__ = ["ClusterView", "CycleView", "NodeView", "TaskView"]


class NodeView(Protocol):
    """One node of the cycle."""

    @property
    def name(self) -> str: ...

    @property
    def idx(self) -> int:
        """Its position in `ClusterView.order` (and in every score vector)."""
        ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def node(self) -> Node:
        """The node as the snapshot gave it (allocatable, taints, devices...)."""
        ...

    def idle(self, r: int) -> float:
        """Idle resource `r` (0 CPU millis, 1 memory bytes, 2 GPUs) after this cycle's decisions so far."""
        ...


class ClusterView(Protocol):
    """The cycle's nodes."""

    @property
    def order(self) -> Sequence[NodeView]:
        """Every node, in the fixed order score vectors follow."""
        ...

    @property
    def nodes(self) -> Mapping[str, NodeView]:
        """Node name -> node."""
        ...


class TaskView(Protocol):
    """One pod of the cycle, as a plugin sees it."""

    @property
    def key(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def pod(self) -> Pod:
        """The pod as the snapshot gave it (requests, labels, affinity...)."""
        ...


class CycleView(Protocol):
    """The scheduling cycle a plugin is asked about, read-only."""

    @property
    def now(self) -> float:
        """The cycle's time (seconds)."""
        ...

    @property
    def policy(self) -> Policy: ...

    @property
    def cluster(self) -> ClusterView: ...

    @property
    def jobs(self) -> Mapping[str, JobState]:
        """Podgroup key -> its job (its pods, queue, priority)."""
        ...

    def queue_job_capacity(self, job: JobState, tasks: list[TaskState]) -> CapacityResult:
        """KAI proportion's answer: whether the job's next `tasks` fit its queue's limit (and quota, when
        not preemptible)."""
        ...

    def queue_node_capacity(self, task: TaskState, node: NodeState) -> CapacityResult:
        """As `queue_job_capacity`, for one pod on one node."""
        ...
