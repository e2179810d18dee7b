"""KAI's Statement: a log of tentative allocate / pipeline / evict operations on the session state.

An action opens a statement per job, tries placements, takes `checkpoint()`s and `rollback(cp)`s to try
alternatives, and finally `commit()`s (the operations become decisions in the session's proposal) or
`discard()`s (everything is undone exactly). Commit returns what was decided; it never calls an API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.model.status import PodStatus

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import TaskState


@dataclass(frozen=True)
class AllocateOp:
    task: TaskState
    node: str
    prev_status: PodStatus
    prev_node: str | None
    prev_groups: tuple[str, ...]
    prev_virtual: bool


@dataclass(frozen=True)
class PipelineOp:
    task: TaskState
    node: str
    prev_status: PodStatus
    prev_node: str | None
    prev_groups: tuple[str, ...]
    prev_virtual: bool
    # When the task was still recorded on the target node (evicted earlier in this session).
    was_on_node: bool
    prev_entry_groups: tuple[str, ...]
    prev_entry_status: PodStatus | None


@dataclass(frozen=True)
class EvictOp:
    task: TaskState
    node: str
    prev_status: PodStatus
    prev_groups: tuple[str, ...]
    prev_virtual: bool
    message: str


@dataclass(frozen=True)
class UnevictOp:
    task: TaskState
    node: str
    evict: EvictOp


Operation = AllocateOp | PipelineOp | EvictOp | UnevictOp


@dataclass(frozen=True)
class Decisions:
    """What a committed statement decided: binds, pipelines and evictions, in order."""

    binds: tuple[tuple[TaskState, str], ...] = ()
    pipelines: tuple[tuple[TaskState, str], ...] = ()
    evictions: tuple[tuple[TaskState, str, str], ...] = ()


class Statement:
    """The operation log of one job's attempt."""

    def __init__(self, session: Session) -> None:
        self.ssn = session
        self.ops: list[Operation] = []

    # --- checkpoints -------------------------------------------------------------------------------------
    def checkpoint(self) -> int:
        return len(self.ops)

    def rollback(self, cp: int) -> None:
        while len(self.ops) > cp:
            self._undo(self.ops.pop())

    def discard(self) -> None:
        self.rollback(0)

    # --- operations -------------------------------------------------------------------------------------
    def allocate(self, task: TaskState, node_name: str) -> None:
        op = AllocateOp(task, node_name, task.status, task.node, tuple(task.gpu_groups), task.is_virtual)
        self.ssn.set_status(task, PodStatus.ALLOCATED)
        task.node = node_name
        self.ssn.cluster.nodes[node_name].add_task(task)
        self.ssn.on_allocate(task)
        task.is_virtual = True
        self.ops.append(op)

    def pipeline(self, task: TaskState, node_name: str, update_if_on_node: bool) -> None:
        node = self.ssn.cluster.nodes[node_name]
        entry = node.tasks.get(task.key)
        gpu_moved = False
        if entry is not None:
            gpu_moved = (
                bool(task.gpu_groups)
                and task.is_shared
                and task.gpu_groups != ["-1"]
                and tuple(task.gpu_groups) != entry.groups
            )
        if entry is not None and not update_if_on_node and not gpu_moved:
            task.gpu_groups = list(entry.groups)
            self._unevict(task, node_name)
            return
        op = PipelineOp(
            task,
            node_name,
            task.status,
            task.node,
            tuple(task.gpu_groups),
            task.is_virtual,
            was_on_node=entry is not None,
            prev_entry_groups=entry.groups if entry is not None else (),
            prev_entry_status=entry.status if entry is not None else None,
        )
        self.ssn.set_status(task, PodStatus.PIPELINED)
        task.node = node_name
        if entry is not None:
            node.remove_task(task)
        node.add_task(task)
        self.ssn.on_allocate(task)
        self.ops.append(op)
        task.is_virtual = True

    def evict(self, task: TaskState, message: str) -> None:
        node_name = task.node
        if node_name is None or node_name not in self.ssn.cluster.nodes:
            raise ValueError(f"cannot evict {task.name}: not on a known node")
        op = EvictOp(task, node_name, task.status, tuple(task.gpu_groups), task.is_virtual, message)
        self.ssn.set_status(task, PodStatus.RELEASING)
        task.is_virtual = True
        self.ssn.cluster.nodes[node_name].update_task(task)
        self.ssn.on_deallocate(task)
        self.ops.append(op)

    def _unevict(self, task: TaskState, node_name: str) -> None:
        for i in range(len(self.ops) - 1, -1, -1):
            op = self.ops[i]
            if isinstance(op, EvictOp) and op.task is task:
                self._restore_evicted(op)
                self.ops.append(UnevictOp(task, node_name, op))
                return
        raise ValueError(f"cannot unevict {task.name}: no eviction of it in this statement")

    def _restore_evicted(self, op: EvictOp) -> None:
        task = op.task
        self.ssn.set_status(task, op.prev_status)
        task.gpu_groups = list(op.prev_groups)
        task.is_virtual = op.prev_virtual
        task.node = op.node
        node = self.ssn.cluster.nodes[op.node]
        if task.key in node.tasks:
            node.update_task(task)
        else:
            node.add_task(task)
        self.ssn.on_allocate(task)

    def convert_allocated_to_pipelined(self, job_key: str) -> None:
        """KAI `ConvertAllAllocatedToPipelined`: a gang that needs pipelined pods waits as a whole."""
        for i, op in enumerate(self.ops):
            if isinstance(op, AllocateOp) and op.task.job.key == job_key:
                task = op.task
                node = self.ssn.cluster.nodes[op.node]
                node.remove_task(task)
                self.ssn.on_deallocate(task)
                self.ssn.set_status(task, PodStatus.PIPELINED)
                node.add_task(task)
                self.ssn.on_allocate(task)
                self.ops[i] = PipelineOp(
                    task,
                    op.node,
                    op.prev_status,
                    op.prev_node,
                    op.prev_groups,
                    op.prev_virtual,
                    was_on_node=False,
                    prev_entry_groups=(),
                    prev_entry_status=None,
                )

    # --- undo --------------------------------------------------------------------------------------------
    def _undo(self, op: Operation) -> None:
        ssn = self.ssn
        match op:
            case AllocateOp(task=task, node=node_name):
                ssn.cluster.nodes[node_name].remove_task(task)
                ssn.on_deallocate(task)
                ssn.set_status(task, op.prev_status)
                task.node = op.prev_node
                task.gpu_groups = list(op.prev_groups)
                task.is_virtual = op.prev_virtual
            case PipelineOp(task=task, node=node_name):
                node = ssn.cluster.nodes[node_name]
                node.remove_task(task)
                ssn.on_deallocate(task)
                ssn.set_status(task, op.prev_status)
                task.node = op.prev_node
                task.is_virtual = op.prev_virtual
                if op.was_on_node:
                    task.gpu_groups = list(op.prev_entry_groups)
                    node.add_task(task)
                task.gpu_groups = list(op.prev_groups)
            case EvictOp(task=task, node=node_name):
                ssn.set_status(task, op.prev_status)
                task.gpu_groups = list(op.prev_groups)
                task.is_virtual = op.prev_virtual
                ssn.cluster.nodes[node_name].update_task(task)
                ssn.on_allocate(task)
            case UnevictOp(task=task, evict=ev):
                ssn.set_status(task, PodStatus.RELEASING)
                task.is_virtual = True
                ssn.cluster.nodes[ev.node].update_task(task)
                ssn.on_deallocate(task)

    # --- commit ------------------------------------------------------------------------------------------
    def commit(self) -> Decisions:
        """Turn the log into decisions: allocated pods become Binding, evictions final, pipelines kept."""
        binds: list[tuple[TaskState, str]] = []
        pipelines: list[tuple[TaskState, str]] = []
        evictions: list[tuple[TaskState, str, str]] = []
        for op in self.ops:
            match op:
                case EvictOp(task=task, node=node_name, message=msg):
                    if task.status == PodStatus.RELEASING:
                        evictions.append((task, node_name, msg))
                        task.is_virtual = False
                case PipelineOp(task=task, node=node_name):
                    if task.status == PodStatus.PIPELINED and task.node == node_name:
                        pipelines.append((task, node_name))
                case AllocateOp(task=task, node=node_name):
                    if task.status == PodStatus.ALLOCATED:
                        self.ssn.set_status(task, PodStatus.BINDING)
                        task.is_virtual = False
                        binds.append((task, node_name))
                case UnevictOp():
                    pass
        self.ops.clear()
        decisions = Decisions(tuple(binds), tuple(pipelines), tuple(evictions))
        self.ssn.record(decisions)
        return decisions
