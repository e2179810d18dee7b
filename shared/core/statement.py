"""KAI's Statement: a log of tentative allocate / pipeline / evict operations on the session state.

An action opens a statement per job, tries placements, takes `checkpoint()`s and `rollback(cp)`s to try
alternatives, and finally `commit()`s (the operations become decisions in the session's proposal) or
`discard()`s (everything is undone exactly). Commit returns what was decided; it never calls an API.

Private to the core: the actions and the victim solver open statements (`Statement(ssn)`); a commit
records its decisions in the session's log (`Session.record`), which `shared.core.cycle` reads out.

After a victim action's commit: binding at once the pods it pipelined onto room nothing in the cluster holds.
A victim action (consolidation, reclaim, preempt) pipelines the pods it places: they wait for their
victims to leave the node. A victim an earlier action of this session had just bound (or pipelined) never
ran, though: the cluster has nothing to evict, its bind is taken back (`shared.core.cycle.result_of`), and
its room is free at once. Left pipelined on that room, the cycle would order nothing at all and the next
cycle would decide the same again, for good. KAI does not stand still there, because its allocate has
already created the victim's bind request when the later action evicts (deletes) it; the pipelined pods
bind the cycle after. `bind_on_free_room` binds such pods instead, where they were pipelined, when the
node's idle resources, counting the room of victims that never ran as idle, hold them: the pipelined pods
of one podgroup all together or none of them; only pods that hold no node in the cluster (a running pod
that is moved has to leave its node first), on nodes no pod that ran has been evicted from this session
(its room is busy until it has left); shared-GPU pods on the best devices with their share idle now; pods
with resource claims left pipelined. Called by the victim solver's `JobIndex.take_turn`
(`shared.core.solver.jobs`) after each statement consolidation, reclaim or preempt commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.fractional_gpus import preferable_gpus
from shared.core.proportion import ancestors_and_self
from shared.core.session import Decisions
from shared.model.status import ACTIVE_USED, PodStatus

if TYPE_CHECKING:
    from shared.core.cluster import NodeMemento, NodeState
    from shared.core.proportion import QueueState
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState


@dataclass(frozen=True)
class Memento:
    """The state one operation changes: the task, the node(s) it touched, its queue chain."""

    task: TaskState
    status: PodStatus
    node: str | None
    groups: tuple[str, ...]
    virtual: bool
    nodes: tuple[NodeMemento, ...]
    queues: tuple[tuple[QueueState, tuple[float, ...], tuple[float, ...]], ...]


@dataclass(frozen=True)
class AllocateOp:
    memento: Memento
    task: TaskState
    node: str


@dataclass(frozen=True)
class PipelineOp:
    memento: Memento
    task: TaskState
    node: str


@dataclass(frozen=True)
class EvictOp:
    memento: Memento
    task: TaskState
    node: str
    message: str


@dataclass(frozen=True)
class UnevictOp:
    memento: Memento
    task: TaskState
    node: str
    evict: EvictOp


Operation = AllocateOp | PipelineOp | EvictOp | UnevictOp


def remember(ssn: Session, task: TaskState, *node_names: str | None) -> Memento:
    """What an operation on `task` touching `node_names` may change, as it is now (`restore` puts it back)."""
    nodes = ssn.cluster.nodes
    touched = tuple(nodes[n].save() for n in dict.fromkeys(node_names) if n is not None and n in nodes)
    chain = tuple(
        (q, tuple(q.allocated), tuple(q.allocated_non_preemptible))
        for q in ancestors_and_self(ssn.queues, task.job.queue)
    )
    return Memento(task, task.status, task.node, task.gpu_groups, task.is_virtual, touched, chain)


def restore(ssn: Session, m: Memento, *, node: str | None) -> None:
    """Put back what `m` remembered: the task (on `node`), the nodes, the queue chain's allocations."""
    task = m.task
    task.status = m.status
    task.node = node
    task.gpu_groups = m.groups
    task.is_virtual = m.virtual
    task.job.version += 1
    for node_memento in m.nodes:
        node_memento.node.restore(node_memento)
    for q, allocated, non_preemptible in m.queues:
        q.allocated = list(allocated)
        q.allocated_non_preemptible = list(non_preemptible)
        q.version += 1
    ssn.alloc_version += 1


def pipeline_in_place(ssn: Session, task: TaskState, node_name: str) -> None:
    """A pod placed on `node_name` this session waits there instead: it is pipelined, its node and queue
    accounting moved from placed to pipelined."""
    node = ssn.cluster.nodes[node_name]
    node.remove_task(task)
    ssn.on_deallocate(task)
    ssn.set_status(task, PodStatus.PIPELINED)
    node.add_task(task)
    ssn.on_allocate(task)


class Statement:
    """The operation log of one job's attempt: `Statement(ssn)`."""

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
    def _memento(self, task: TaskState, *node_names: str | None) -> Memento:
        return remember(self.ssn, task, *node_names)

    def allocate(self, task: TaskState, node_name: str) -> None:
        op = AllocateOp(self._memento(task, node_name), task, node_name)
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
                bool(task.gpu_groups) and task.is_shared and task.gpu_groups not in (("-1",), entry.groups)
            )
        if entry is not None and not update_if_on_node and not gpu_moved:
            task.gpu_groups = entry.groups
            self._unevict(task, node_name)
            return
        op = PipelineOp(self._memento(task, node_name), task, node_name)
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
        op = EvictOp(self._memento(task, node_name), task, node_name, message)
        self.ssn.set_status(task, PodStatus.RELEASING)
        task.is_virtual = True
        self.ssn.cluster.nodes[node_name].update_task(task)
        self.ssn.on_deallocate(task)
        self.ops.append(op)

    def _unevict(self, task: TaskState, node_name: str) -> None:
        for i in range(len(self.ops) - 1, -1, -1):
            op = self.ops[i]
            if isinstance(op, EvictOp) and op.task is task:
                memento = self._memento(task, op.node, node_name)
                self._restore_evicted(op)
                self.ops.append(UnevictOp(memento, task, node_name, op))
                return
        raise ValueError(f"cannot unevict {task.name}: no eviction of it in this statement")

    def _restore_evicted(self, op: EvictOp) -> None:
        task = op.task
        self.ssn.set_status(task, op.memento.status)
        task.gpu_groups = op.memento.groups
        task.is_virtual = op.memento.virtual
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
                pipeline_in_place(self.ssn, op.task, op.node)
                # The original memento still describes the state before this pod was placed.
                self.ops[i] = PipelineOp(op.memento, op.task, op.node)

    # --- undo --------------------------------------------------------------------------------------------
    def _undo(self, op: Operation) -> None:
        """Restore exactly what the operation found (later operations are already undone), except that a
        pending pod whose placement is undone is left with no node, as KAI unallocates it (SEMANTICS §13.3
        item 2), even when its pod named one."""
        m = op.memento
        unplaced = m.status == PodStatus.PENDING and isinstance(op, AllocateOp | PipelineOp)
        restore(self.ssn, m, node=None if unplaced else m.node)

    # --- commit ------------------------------------------------------------------------------------------
    def commit(self) -> Decisions:
        """Turn the log into decisions: allocated pods become Binding, evictions final, pipelines kept."""
        binds: list[tuple[TaskState, str]] = []
        pipelines: list[tuple[TaskState, str]] = []
        evictions: list[tuple[TaskState, str, str]] = []
        # An eviction stands unless the pod was put back on its node; a pod evicted and then pipelined to
        # another node (consolidation) must still leave its old one.
        unevicted = {id(op.evict) for op in self.ops if isinstance(op, UnevictOp)}
        for op in self.ops:
            match op:
                case EvictOp(task=task, node=node_name, message=msg):
                    if id(op) not in unevicted:
                        evictions.append((task, node_name, msg))
                    if task.status == PodStatus.RELEASING:
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


# --- after a victim action's commit: binding on room that never held a pod (see the module docstring) ---
HOLDS_NODE = ACTIVE_USED - {PodStatus.PIPELINED}
"""A pod in one of these statuses when the snapshot was taken occupies its node in the cluster."""


def bind_on_free_room(ssn: Session, pipelines: Sequence[tuple[TaskState, str]]) -> Decisions:
    """Bind in place the podgroups of `pipelines` (what a statement just pipelined) whose pipelined pods all
    fit their nodes' free room now; the binds recorded in the session's log."""
    jobs: dict[str, JobState] = {}
    for task, node in pipelines:
        if task.status == PodStatus.PIPELINED and task.node == node:
            jobs.setdefault(task.job.key, task.job)
    # A pod that ran and was evicted (or moved) this session still holds its room in the cluster, even
    # where the session's accounting has moved it off its device: no pod binds on its node.
    held = {node for t, node, _ in ssn.log.evictions if t.pod.status in HOLDS_NODE}
    binds: list[tuple[TaskState, str]] = []
    for job in jobs.values():
        pods = [t for t in job.tasks.values() if t.status == PodStatus.PIPELINED]
        if any(t.pod.claims or t.pod.status in HOLDS_NODE or t.node is None or t.node in held for t in pods):
            continue
        binds += _bind_all_or_none(ssn, pods)
    decisions = Decisions(binds=tuple(binds))
    ssn.record(decisions)
    return decisions


def _bind_all_or_none(ssn: Session, pods: list[TaskState]) -> list[tuple[TaskState, str]]:
    """Bind every pod of `pods` on its node, or leave the session exactly as it was (`remember`, `restore`,
    as a statement's rollback does); what was bound."""
    placements = [(t, t.node) for t in pods if t.node is not None]
    names = list(dict.fromkeys(name for _, name in placements))
    # Each memento holds every node before any change: restored last to first, the first puts them back.
    saved = [remember(ssn, t, *names) for t, _ in placements]
    for name in names:
        _free_unheld_room(ssn.cluster.nodes[name])
    if all(_bind_in_place(ssn, t, name) for t, name in placements):
        return placements
    for memento in reversed(saved):
        restore(ssn, memento, node=memento.node)
    return []


def _free_unheld_room(node: NodeState) -> None:
    """Take off the node the victims that never ran there (evicted pods that held no node in the cluster):
    their room is idle at once, not releasing."""
    for key, entry in list(node.tasks.items()):
        if entry.status == PodStatus.RELEASING and entry.task.pod.status not in HOLDS_NODE:
            node.remove_task(node.tasks[key].task)


def _bind_in_place(ssn: Session, task: TaskState, node_name: str) -> bool:
    """A pod pipelined on `node_name` is bound there instead if the node's idle resources hold it (its
    accounting moved from pipelined to placed); whether it was."""
    node = ssn.cluster.nodes[node_name]
    node.remove_task(task)
    ssn.on_deallocate(task)
    if task.is_shared:
        # A shared pod takes the best devices that have its share free now (a device only pipelined pods
        # use is passed over).
        choice = preferable_gpus(ssn, node, task, pipeline_only=False, idle_only=True)
        fits = choice is not None
        if choice is not None:
            task.gpu_groups = tuple(choice.groups)
    else:
        fits = node.fits(task, with_releasing=False)
    ssn.set_status(task, PodStatus.BINDING if fits else PodStatus.PIPELINED)
    node.add_task(task)
    ssn.on_allocate(task)
    if fits:
        task.is_virtual = False
    return fits
