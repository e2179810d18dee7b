"""Session-time node accounting: idle, used and releasing resources, shared GPU groups and scalars.

Per-resource NumPy arrays over all nodes (CPU, memory, whole GPUs, pod slots) make the resource-fit
filter one vector expression; shared (fractional) GPUs are tracked per node and per GPU group the way
KAI does it, so that idle/releasing whole-GPU counts come out identical. The node's other countable
resources (`Node.scalars`: MIG instances, extended resources, huge pages, ephemeral storage) are per-node
dicts (`alloc_scalars`, `idle_scalars`, `used_scalars`, `releasing_scalars`) that a pod's MIG instances and
`Pod.scalars` fill. Only `Statement` and the session builder call the mutating methods.

What is worked out from immutable records alone is kept from one session to the next while the records
are the same objects: the nodes' static figures (`_static`), what each node's pods left in its accounting
(`_Placed`), and the whole cluster with no pods that the queue's plan reads (`empty_cluster`, given back
untouched by `give_back_empty`).
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from shared.core.tasks import CPU, GPU, MEM, N_BASE, PODS, TaskState, mig_gpu_portion
from shared.model import Node, Pod
from shared.model.status import ACTIVE_USED, PodStatus

EPS = 1e-9
_NONE: frozenset[str] = frozenset()
"""One empty set for every node's legacy MIG pods (an empty frozenset is a new object each time)."""
FloatArray = npt.NDArray[np.float64]


@dataclass(eq=False)
class SharedGroup:
    """One shared GPU device on a node, known by its group id (KAI `GpuSharingNodeInfo` per group)."""

    used: int = 0
    releasing: int = 0
    allocated: int = 0
    marked_releasing: bool = False
    # KAI tells a device that only pipelined pods use by its absence from the allocated map.
    has_allocated: bool = False


class _Entry(NamedTuple):
    """What the node recorded when it added a task, so removal undoes exactly that (a tuple: a session
    makes one per placed pod, and everything but `task` is what `_Placed` keeps between sessions)."""

    status: PodStatus
    groups: tuple[str, ...]
    vector: tuple[float, float, float, float]
    scalars: tuple[tuple[str, float], ...]
    shared: bool
    gpu_memory: int
    task: TaskState


@dataclass(frozen=True)
class NodeMemento:
    """Everything about one node a statement operation may change, to restore it exactly."""

    node: NodeState
    arrays: tuple[tuple[float, float, float], ...]
    tasks: dict[str, _Entry]
    groups: dict[str, SharedGroup]
    sharing: bool
    idle_scalars: dict[str, float]
    used_scalars: dict[str, float]
    releasing_scalars: dict[str, float]
    legacy_mig_tasks: frozenset[str]


class ClusterState:
    """All nodes of a session: per-resource arrays plus a `NodeState` per node."""

    def __init__(
        self,
        nodes: tuple[Node, ...],
        tie_break_seed: int | None = None,
        placed: Iterable[TaskState] = (),
    ) -> None:
        """`placed`: the snapshot's pods that hold resources on a node of `nodes`, in the order the nodes
        take them (`NodeState.add_task` for each)."""
        n = len(nodes)
        static = self._static = _static(nodes, tie_break_seed)
        self.names: list[str] = list(static.names)
        self.nodes: dict[str, NodeState] = {}
        self.order: list[NodeState] = []
        # Nodes that have (or had) a shared GPU group: the only ones the GPU-sharing score looks at.
        self.sharing_nodes: set[int] = set()
        # Set once any node has releasing resources; until then idle-only and idle+releasing fits agree.
        self.has_releasing = False
        self.generation = 0
        self.changed_nodes: set[int] | None = None
        """Indices of the nodes that took, released or restored pods since an index over placed pods
        (`shared.core.pod_affinity`) last looked; None while no such index exists."""
        """Moves whenever any node takes, releases or restores pods: answers computed from where pods are
        (inter-pod affinity) are cached until it moves."""
        self._label_codes = static.label_codes
        # The accounting starts in Python lists and becomes NumPy arrays once the snapshot's pods are on
        # their nodes: element access to a list is several times cheaper than to an array, and float
        # arithmetic on either is IEEE double, so the arrays come out bit for bit the same. Only
        # `NodeState.add_task` runs in between, and it reads and writes single elements.
        alloc = [list(row) for row in static.alloc_rows]
        idle = [list(row) for row in static.alloc_rows]
        used = [[0.0] * n for _ in range(N_BASE)]
        releasing = [[0.0] * n for _ in range(N_BASE)]
        versions = [0] * n
        self.alloc = cast("list[FloatArray]", alloc)
        self.idle = cast("list[FloatArray]", idle)
        self.used = cast("list[FloatArray]", used)
        self.releasing = cast("list[FloatArray]", releasing)
        # Bumped whenever a node's accounting changes (a task added or removed, a restore), so per-node
        # answers computed in Python can be cached until their node changes (`Session.resource_fit_mask`).
        self.versions = cast("npt.NDArray[np.int64]", versions)
        for i, nd in enumerate(nodes):
            state = NodeState(self, i, nd)
            self.nodes[nd.name] = state
            self.order.append(state)
        _place(self, placed)
        self.alloc = [row.copy() for row in static.alloc]
        self.idle = [np.array(row, dtype=np.float64) for row in idle]
        self.used = [np.array(row, dtype=np.float64) for row in used]
        self.releasing = [np.array(row, dtype=np.float64) for row in releasing]
        self.versions = np.array(versions, dtype=np.int64)
        # Static per-node facts the scores read on every pod (shared with the sessions before while the
        # node records are the same: read-only).
        self.has_resource = static.has_resource
        self.gpu_count = static.gpu_count
        self.prefer_no_schedule_nodes = static.prefer_no_schedule_nodes
        """Nodes with a PreferNoSchedule taint: the only ones the TaintToleration score looks at."""
        self.cpu_only_nodes = static.cpu_only_nodes
        self.name_rank = static.name_rank
        self.mig_gpus = static.mig_gpus
        """The GPUs the nodes' MIG instances make up, as the queues' total counts them."""

    def untouched(self) -> bool:
        """Whether nothing was placed, removed or restored on any node since it was built with no pods, and
        nothing indexed where pods are: it is still what `ClusterState(nodes, seed)` makes."""
        return (
            self.generation == 0
            and self.changed_nodes is None
            and not self.has_releasing
            and not self.sharing_nodes
            and not self.versions.any()
        )

    def label_codes(self, key: str) -> tuple[npt.NDArray[np.int64], dict[str, int]]:
        """Every node's value of label `key` as a code (0: the node has no such label), in node order, and
        the codes of the values; labels do not change within a session, so each key is coded once. A set
        of values becomes a node mask with one lookup: `domain_mask`."""
        coded = self._label_codes.get(key)
        if coded is None:
            vocabulary: dict[str, int] = {}
            codes = np.zeros(len(self.order), dtype=np.int64)
            for i, node in enumerate(self.order):
                value = node.labels.get(key)
                if value is not None:
                    codes[i] = vocabulary.setdefault(value, len(vocabulary) + 1)
            coded = self._label_codes[key] = (codes, vocabulary)
        return coded

    def domain_mask(self, key: str, values: Iterable[str]) -> npt.NDArray[np.bool_]:
        """The nodes whose label `key` has one of `values`."""
        codes, vocabulary = self.label_codes(key)
        table = np.zeros(len(vocabulary) + 1, dtype=bool)
        for value in values:
            code = vocabulary.get(value)
            if code is not None:
                table[code] = True
        return table[codes]


class NodeState:
    """One node's resources and the tasks placed on it, with KAI's accounting rules."""

    def __init__(self, cluster: ClusterState, idx: int, node: Node) -> None:
        self.cluster = cluster
        self.idx = idx
        self.node = node
        self.name = node.name
        self.labels = node.labels
        self.gpu_memory = node.gpu_memory_mib
        self.gpu_count = node.gpus
        self.tasks: dict[str, _Entry] = {}
        self.groups: dict[str, SharedGroup] = {}
        scalars = node.scalars
        self.alloc_scalars: dict[str, float] = scalars
        """The node record's own (read-only: nothing changes what a node has)."""
        self.idle_scalars: dict[str, float] = dict(scalars) if scalars else {}
        self.used_scalars: dict[str, float] = {}
        self.releasing_scalars: dict[str, float] = {}
        self.legacy_mig_tasks: frozenset[str] = _NONE
        """The pods on it that ask for MIG instances the legacy way (few nodes have any: a new set each time
        one comes or goes)."""
        self.has_mig = bool(scalars) and any("mig-" in name for name in scalars)
        """Whether the node reports MIG instances (the only scalars that count as GPUs)."""

    # --- array views ---------------------------------------------------------------------------------
    def idle(self, r: int) -> float:
        return float(self.cluster.idle[r][self.idx])

    def releasing(self, r: int) -> float:
        return float(self.cluster.releasing[r][self.idx])

    def used(self, r: int) -> float:
        return float(self.cluster.used[r][self.idx])

    def alloc(self, r: int) -> float:
        return float(self.cluster.alloc[r][self.idx])

    def _add(self, arrs: list[FloatArray], r: int, v: float) -> None:
        arrs[r][self.idx] += v

    @property
    def mig_enabled(self) -> bool:
        return self.node.mig_enabled

    @property
    def is_cpu_only(self) -> bool:
        return not self.node.mig_enabled and self.alloc(GPU) <= 0

    # --- tracked vector of a task ---------------------------------------------------------------------
    def _vector(
        self, task: TaskState
    ) -> tuple[tuple[float, float, float, float], tuple[tuple[str, float], ...]]:
        gpu = 0.0 if task.is_shared else task.whole_gpus
        vec = [task.cpu, task.mem, gpu, 1.0]
        for r in range(N_BASE):
            if self.alloc(r) == 0:
                vec[r] = 0.0
        scalars = tuple(
            (name, float(cnt)) for name, cnt in task.gpu.mig.items() if self.alloc_scalars.get(name, 0) > 0
        )
        if task.scalars:
            # As for MIG: a node that does not report the resource holds none of it for the pod.
            scalars += tuple(
                (name, cnt) for name, cnt in task.scalars.items() if self.alloc_scalars.get(name, 0) > 0
            )
        return (vec[0], vec[1], vec[2], vec[3]), scalars

    # --- add / remove (KAI addTask / RemoveTask) -------------------------------------------------------
    def add_task(self, task: TaskState) -> None:
        if task.key in self.tasks:
            raise ValueError(f"task {task.name} already on node {self.name}")
        self.cluster.versions[self.idx] += 1
        self.cluster.generation += 1
        if self.cluster.changed_nodes is not None:
            self.cluster.changed_nodes.add(self.idx)
        vec, scalars = self._vector(task)
        entry = _Entry(
            status=task.status,
            groups=task.gpu_groups,
            vector=vec,
            scalars=scalars,
            shared=task.is_shared,
            gpu_memory=task.gpu_memory_on(self.gpu_memory),
            task=task,
        )
        self.tasks[task.key] = entry
        if entry.status in ACTIVE_USED:
            # KAI sets the accepted resources whenever a node takes an active pod, also for a tentative
            # placement, and nothing clears them when a statement is undone (SEMANTICS §13.3 item 5).
            task.accepted_gpus = self.accepted_gpus(task)
        if task.pod.legacy_mig:
            self.legacy_mig_tasks = self.legacy_mig_tasks | {task.key}
        c = self.cluster
        for r in range(N_BASE):
            v = vec[r]
            if v == 0:
                continue
            self._add(c.used, r, v)
            if entry.status == PodStatus.RELEASING:
                self._add(c.releasing, r, v)
                self._add(c.idle, r, -v)
                c.has_releasing = True
            elif entry.status == PodStatus.PIPELINED:
                self._add(c.releasing, r, -v)
                c.has_releasing = True
            else:
                self._add(c.idle, r, -v)
        for name, v in scalars:
            self.used_scalars[name] = self.used_scalars.get(name, 0.0) + v
            if entry.status == PodStatus.RELEASING:
                self.releasing_scalars[name] = self.releasing_scalars.get(name, 0.0) + v
                self.idle_scalars[name] = self.idle_scalars.get(name, 0.0) - v
            elif entry.status == PodStatus.PIPELINED:
                self.releasing_scalars[name] = self.releasing_scalars.get(name, 0.0) - v
            else:
                self.idle_scalars[name] = self.idle_scalars.get(name, 0.0) - v
        if entry.shared:
            for g in entry.groups:
                self._add_shared(entry, g)

    def remove_task(self, task: TaskState) -> None:
        entry = self.tasks.pop(task.key)
        self.cluster.versions[self.idx] += 1
        self.cluster.generation += 1
        if self.cluster.changed_nodes is not None:
            self.cluster.changed_nodes.add(self.idx)
        if task.key in self.legacy_mig_tasks:
            self.legacy_mig_tasks = self.legacy_mig_tasks - {task.key}
        c = self.cluster
        for r in range(N_BASE):
            v = entry.vector[r]
            if v == 0:
                continue
            self._add(c.used, r, -v)
            if entry.status == PodStatus.RELEASING:
                self._add(c.releasing, r, -v)
                self._add(c.idle, r, v)
            elif entry.status == PodStatus.PIPELINED:
                self._add(c.releasing, r, v)
            else:
                self._add(c.idle, r, v)
        for name, v in entry.scalars:
            self.used_scalars[name] -= v
            if entry.status == PodStatus.RELEASING:
                self.releasing_scalars[name] -= v
                self.idle_scalars[name] += v
            elif entry.status == PodStatus.PIPELINED:
                self.releasing_scalars[name] += v
            else:
                self.idle_scalars[name] += v
        if entry.shared:
            for g in entry.groups:
                self._remove_shared(entry, g)

    def update_task(self, task: TaskState) -> None:
        self.remove_task(task)
        self.add_task(task)

    # --- exact undo --------------------------------------------------------------------------------------
    def save(self) -> NodeMemento:
        c = self.cluster
        i = self.idx
        return NodeMemento(
            node=self,
            arrays=tuple(
                (float(c.idle[r][i]), float(c.used[r][i]), float(c.releasing[r][i])) for r in range(N_BASE)
            ),
            tasks=dict(self.tasks),
            groups={
                g: SharedGroup(s.used, s.releasing, s.allocated, s.marked_releasing, s.has_allocated)
                for g, s in self.groups.items()
            },
            sharing=self.idx in c.sharing_nodes,
            idle_scalars=dict(self.idle_scalars),
            used_scalars=dict(self.used_scalars),
            releasing_scalars=dict(self.releasing_scalars),
            legacy_mig_tasks=self.legacy_mig_tasks,
        )

    def restore(self, m: NodeMemento) -> None:
        """Put the node back exactly as saved. KAI's incremental shared-GPU rules are not always their own
        inverse (a guard depends on the order of operations), so undo restores instead of recomputing."""
        c = self.cluster
        i = self.idx
        c.versions[i] += 1
        c.generation += 1
        if c.changed_nodes is not None:
            c.changed_nodes.add(i)
        for r, (idle, used, releasing) in enumerate(m.arrays):
            c.idle[r][i] = idle
            c.used[r][i] = used
            c.releasing[r][i] = releasing
        self.tasks = dict(m.tasks)
        self.groups = {
            g: SharedGroup(s.used, s.releasing, s.allocated, s.marked_releasing, s.has_allocated)
            for g, s in m.groups.items()
        }
        if not m.sharing:
            c.sharing_nodes.discard(i)
        self.idle_scalars = dict(m.idle_scalars)
        self.used_scalars = dict(m.used_scalars)
        self.releasing_scalars = dict(m.releasing_scalars)
        self.legacy_mig_tasks = m.legacy_mig_tasks

    # --- shared GPU groups -----------------------------------------------------------------------------
    def _used_gpu_count(self) -> int:
        return int(self.used(GPU)) + sum(1 for g in self.groups.values() if g.used > 0)

    def _idle_overflows(self) -> bool:
        return self.gpu_count < int(self.idle(GPU)) + self._used_gpu_count()

    def _add_shared(self, e: _Entry, gid: str) -> None:
        g = self.groups.setdefault(gid, SharedGroup())
        self.cluster.sharing_nodes.add(self.idx)
        self.cluster.has_releasing = True
        m = e.gpu_memory
        c = self.cluster
        g.used += m
        if e.status == PodStatus.RELEASING:
            g.releasing += m
            g.allocated += m
            g.has_allocated = True
            if g.used == g.releasing:
                if not g.marked_releasing:
                    self._add(c.releasing, GPU, 1)
                    g.marked_releasing = True
                if self._idle_overflows():
                    self._add(c.idle, GPU, -1)
        elif e.status == PodStatus.PIPELINED:
            g.releasing -= m
            if g.used - m == g.releasing + m:
                self._add(c.releasing, GPU, -1)
        else:
            g.allocated += m
            g.has_allocated = True
            if g.used <= m and self._idle_overflows():
                self._add(c.idle, GPU, -1)
            if g.marked_releasing:
                self._add(c.releasing, GPU, -1)
                g.marked_releasing = False

    def _remove_shared(self, e: _Entry, gid: str) -> None:
        g = self.groups.setdefault(gid, SharedGroup())
        m = e.gpu_memory
        c = self.cluster
        g.used -= m
        if e.status == PodStatus.RELEASING:
            g.releasing -= m
            g.allocated -= m
            g.has_allocated = True
            if g.used <= 0:
                if self.gpu_count >= int(self.idle(GPU)) + self._used_gpu_count():
                    self._add(c.idle, GPU, 1)
                if g.marked_releasing:
                    self._add(c.releasing, GPU, -1)
                    g.marked_releasing = False
        elif e.status == PodStatus.PIPELINED:
            g.releasing += m
            used_before = g.used + m
            releasing_before = g.releasing - m
            if used_before == releasing_before or (g.used == 0 and g.releasing == 0):
                self._add(c.releasing, GPU, 1)
        else:
            g.allocated -= m
            g.has_allocated = True
            if g.used <= 0 and self.gpu_count >= int(self.idle(GPU)) + self._used_gpu_count():
                self._add(c.idle, GPU, 1)
            if self._group_releasing_from_shared(g) and not g.marked_releasing:
                self._add(c.releasing, GPU, 1)
                g.marked_releasing = True

    @staticmethod
    def _group_releasing_from_shared(g: SharedGroup) -> bool:
        return g.used != 0 and g.releasing == g.used

    # --- fit (KAI NodeInfo) ----------------------------------------------------------------------------
    def gpu_fraction_on_node(self, memory: int) -> float:
        return math.ceil(memory / self.gpu_memory * 100) / 100 if self.gpu_memory else 0.0

    def accepted_gpus(self, task: TaskState) -> float:
        """The GPUs the task holds on this node: GPU memory as a share of this node's devices; MIG
        instances 0 (KAI counts them apart from GPUs)."""
        if task.kind == "memory":
            return task.gpu.devices * self.gpu_fraction_on_node(task.gpu.memory_mib)
        if task.kind == "mig":
            return 0.0
        return task.requested_gpus

    def portion(self, task: TaskState) -> float:
        if task.kind == "memory":
            return self.gpu_fraction_on_node(task.gpu.memory_mib)
        return task.gpu.fraction

    def valid_portion(self, task: TaskState) -> bool:
        if task.kind not in ("fraction", "memory"):
            return True
        p = self.portion(task)
        return p <= 1 or p == int(p)

    def task_fits_group(self, task: TaskState, gid: str) -> bool:
        """KAI `IsTaskFitOnGpuGroup`: a used shared device with room (counting releasing) for the task."""
        g = self.groups.get(gid)
        if g is None or g.used == 0:
            return False
        mem = task.gpu_memory_on(self.gpu_memory)
        enough = self.gpu_memory - g.allocated + g.releasing - mem >= 0
        return enough and g.allocated != g.releasing

    def enough_idle_on_group(self, task: TaskState, gid: str) -> bool:
        g = self.groups.get(gid)
        if g is None or not g.has_allocated:
            return False
        return self.gpu_memory - g.allocated - task.gpu_memory_on(self.gpu_memory) >= 0

    def _fits_vector(self, task: TaskState, with_releasing: bool, exclude_gpu: bool) -> bool:
        c = self.cluster
        i = self.idx
        req = (task.cpu, task.mem, task.whole_gpus, 1.0)
        for r in range(N_BASE):
            if exclude_gpu and r == GPU:
                continue
            avail = c.idle[r][i] + (c.releasing[r][i] if with_releasing else 0.0)
            if req[r] > avail + EPS:
                return False
        for name, cnt in task.gpu.mig.items():
            avail = self.idle_scalars.get(name, 0.0) + (
                self.releasing_scalars.get(name, 0.0) if with_releasing else 0.0
            )
            if cnt > avail + EPS:
                return False
        # A resource the node does not report has nothing idle: the pod never fits.
        for name, amount in task.scalars.items():
            avail = self.idle_scalars.get(name, 0.0) + (
                self.releasing_scalars.get(name, 0.0) if with_releasing else 0.0
            )
            if amount > avail + EPS:
                return False
        return True

    def fits(self, task: TaskState, with_releasing: bool) -> bool:
        """KAI `IsTaskAllocatable` (idle only) / `IsTaskAllocatableOnReleasingOrIdle`."""
        if task.is_best_effort and task.kind == "regular":
            return True
        if task.kind in ("regular", "mig"):
            return self._fits_vector(task, with_releasing, exclude_gpu=False)
        if not self._fits_vector(task, with_releasing, exclude_gpu=True):
            return False
        if not self.valid_portion(task):
            return False
        whole = math.floor(self.idle(GPU) + (self.releasing(GPU) if with_releasing else 0.0) + EPS)
        matching = 0
        for gid in self.groups:
            if self.task_fits_group(task, gid):
                matching += 1
                if matching >= task.gpu.devices:
                    break
        return whole + matching >= task.gpu.devices

    def non_allocated(self, r: int) -> float:
        return self.idle(r) + self.releasing(r)

    def active_tasks(self) -> list[TaskState]:
        return [e.task for e in self.tasks.values() if e.task.status in ACTIVE_USED]

    def __repr__(self) -> str:
        return (
            f"Node({self.name} idle cpu={self.idle(CPU)} gpu={self.idle(GPU)} "
            f"releasing gpu={self.releasing(GPU)})"
        )


class _Placed(NamedTuple):
    """One node once the snapshot's pods were placed on it (`ClusterState`'s `placed`), kept for the next
    session: the node record and the pods it took, in order and in their session statuses, and what they
    left in its accounting. Everything in it is worked out from those records alone, so a node that is the
    same record holding the same pod records in the same statuses comes out the same without placing them
    one by one again."""

    node: Node
    pods: tuple[Pod, ...]
    statuses: tuple[PodStatus, ...]
    arrays: tuple[tuple[float, float, float], ...]
    """(idle, used, releasing) per tracked resource."""
    entries: tuple[
        tuple[
            PodStatus,
            tuple[str, ...],
            tuple[float, float, float, float],
            tuple[tuple[str, float], ...],
            bool,
            int,
        ],
        ...,
    ]
    """Each pod's `_Entry` less its task, in the order the node took them."""
    accepted: tuple[float, ...]
    """Each pod's `TaskState.accepted_gpus` once the node took it."""
    groups: tuple[tuple[str, int, int, int, bool, bool], ...]
    """Each shared GPU group: id, used, releasing, allocated, marked releasing, has allocated."""
    sharing: bool
    releasing: bool
    """Whether placing the pods set the cluster's `has_releasing`."""
    scalars: tuple[dict[str, float], dict[str, float], dict[str, float]] | None
    """The node's idle, used and releasing scalars; None when no pod holds any (they are as the node
    record's)."""
    legacy_mig: frozenset[str]


class _PlacedMemo:
    """The last build's `_Placed` per node, by the node record's identity (held, so an id is never another
    object's while kept). Only the last build's nodes are kept; a changed node or pod is a new record, so
    its node is placed anew. Pure: it remembers values worked out from immutable records."""

    def __init__(self) -> None:
        self.last: dict[int, _Placed] = {}


_PLACED = _PlacedMemo()


def _place(cluster: ClusterState, placed: Iterable[TaskState]) -> None:
    """Each node of `cluster` takes its tasks of `placed` in their order (`NodeState.add_task`), or, when it
    is the same node record holding the same pods as in the last build, has what they left put back."""
    by_node: dict[str, list[TaskState]] = {}
    for task in placed:
        by_node.setdefault(cast(str, task.node), []).append(task)
    if not by_node:
        return
    last = _PLACED.last
    kept: dict[int, _Placed] = {}
    for name, tasks in by_node.items():
        state = cluster.nodes[name]
        record = state.node
        before = last.get(id(record))
        if (
            before is not None
            and before.node is record
            and len(before.pods) == len(tasks)
            and all(
                p is t.pod and s is t.status
                for p, s, t in zip(before.pods, before.statuses, tasks, strict=True)
            )
        ):
            _put_back(state, before, tasks)
        else:
            before = _place_on(state, tasks)
        kept[id(record)] = before
    _PLACED.last = kept


def _place_on(state: NodeState, tasks: list[TaskState]) -> _Placed:
    c = state.cluster
    i = state.idx
    releasing_before = c.has_releasing
    c.has_releasing = False
    for task in tasks:
        state.add_task(task)
    releasing = c.has_releasing
    c.has_releasing = releasing_before or releasing
    return _Placed(
        node=state.node,
        pods=tuple(t.pod for t in tasks),
        statuses=tuple(t.status for t in tasks),
        arrays=tuple((c.idle[r][i], c.used[r][i], c.releasing[r][i]) for r in range(N_BASE)),
        entries=tuple(e[:6] for e in state.tasks.values()),
        accepted=tuple(t.accepted_gpus for t in tasks),
        groups=tuple(
            (g, s.used, s.releasing, s.allocated, s.marked_releasing, s.has_allocated)
            for g, s in state.groups.items()
        ),
        sharing=i in c.sharing_nodes,
        releasing=releasing,
        scalars=(
            (dict(state.idle_scalars), dict(state.used_scalars), dict(state.releasing_scalars))
            if any(e.scalars for e in state.tasks.values())
            else None
        ),
        legacy_mig=state.legacy_mig_tasks,
    )


def _put_back(state: NodeState, placed: _Placed, tasks: list[TaskState]) -> None:
    """The node as `add_task` of each task would leave it: the same accounting, versions and generation."""
    c = state.cluster
    i = state.idx
    n = len(tasks)
    c.versions[i] += n
    c.generation += n
    for r, (idle, used, releasing) in enumerate(placed.arrays):
        c.idle[r][i] = idle
        c.used[r][i] = used
        c.releasing[r][i] = releasing
    entries = state.tasks
    for task, entry, accepted in zip(tasks, placed.entries, placed.accepted, strict=True):
        entries[task.key] = _Entry(*entry, task)
        task.accepted_gpus = accepted
    for g, used_mem, releasing_mem, allocated, marked, has_allocated in placed.groups:
        state.groups[g] = SharedGroup(used_mem, releasing_mem, allocated, marked, has_allocated)
    if placed.sharing:
        c.sharing_nodes.add(i)
    if placed.releasing:
        c.has_releasing = True
    if placed.scalars is not None:
        idle_scalars, used_scalars, releasing_scalars = placed.scalars
        state.idle_scalars = dict(idle_scalars)
        state.used_scalars = dict(used_scalars)
        state.releasing_scalars = dict(releasing_scalars)
    state.legacy_mig_tasks = placed.legacy_mig


class _Static(NamedTuple):
    """What a cluster reads of its node records alone, in node order: kept from one session to the next
    while the records are the same objects in the same order (`_static`). Its arrays are read-only and its
    label codes grow as sessions ask for more keys; nothing else in it changes."""

    nodes: tuple[Node, ...]
    tie_break_seed: int | None
    names: tuple[str, ...]
    alloc_rows: tuple[tuple[float, ...], ...]
    """Per tracked resource, each node's allocatable (`alloc` as Python floats)."""
    alloc: tuple[FloatArray, ...]
    has_resource: list[npt.NDArray[Any]]
    gpu_count: FloatArray
    prefer_no_schedule_nodes: list[int]
    cpu_only_nodes: npt.NDArray[Any]
    name_rank: npt.NDArray[Any]
    mig_gpus: float
    """The GPUs of the nodes' MIG instances (each instance as its compute slices), summed in node order."""
    label_codes: dict[str, tuple[npt.NDArray[np.int64], dict[str, int]]]
    """`ClusterState.label_codes` per label key asked so far."""


class _StaticMemo:
    def __init__(self) -> None:
        self.last: _Static | None = None


_STATIC = _StaticMemo()


def _static(nodes: tuple[Node, ...], tie_break_seed: int | None) -> _Static:
    """The figures of `nodes` worked out for the last session, when its nodes are the same records in the
    same order (a node pool's snapshot is a new tuple of the same records each time), else anew."""
    last = _STATIC.last
    if (
        last is not None
        and last.tie_break_seed == tie_break_seed
        and len(last.nodes) == len(nodes)
        and (last.nodes is nodes or all(map(operator.is_, last.nodes, nodes)))
    ):
        return last
    n = len(nodes)
    rows: list[list[float]] = [[0.0] * n for _ in range(N_BASE)]
    for i, nd in enumerate(nodes):
        rows[CPU][i] = float(nd.cpu_millis)
        rows[MEM][i] = float(nd.memory_bytes)
        rows[GPU][i] = 0.0 if nd.mig_enabled and nd.mig_strategy == "mixed" else float(nd.gpus)
        rows[PODS][i] = float(nd.max_pods)
    alloc = tuple(_read_only(np.array(row, dtype=np.float64)) for row in rows)
    names = tuple(nd.name for nd in nodes)
    mig = np.array([nd.mig_enabled for nd in nodes], dtype=bool)
    # Name rank breaks score ties the way KAI does (sorted by name within equal scores).
    rank = np.argsort(np.argsort(np.array(names, dtype=object))) if n else np.zeros(0)
    if tie_break_seed is not None and n:
        rank = np.random.default_rng(tie_break_seed).permutation(n)
    static = _Static(
        nodes=nodes,
        tie_break_seed=tie_break_seed,
        names=names,
        alloc_rows=tuple(tuple(row) for row in rows),
        alloc=alloc,
        has_resource=[_read_only(alloc[r] != 0) for r in range(N_BASE)],
        gpu_count=_read_only(np.array([float(nd.gpus) for nd in nodes])),
        prefer_no_schedule_nodes=[
            i for i, nd in enumerate(nodes) if any(t.effect == "PreferNoSchedule" for t in nd.taints)
        ],
        cpu_only_nodes=_read_only((alloc[GPU] <= 0) & ~mig),
        name_rank=_read_only(rank),
        mig_gpus=_mig_gpus(nodes),
        label_codes={},
    )
    _STATIC.last = static
    return static


def _mig_gpus(nodes: tuple[Node, ...]) -> float:
    total = 0.0
    for nd in nodes:
        for name, count in nd.scalars.items():
            if "mig-" in name:
                total += count * mig_gpu_portion(name)
    return total


class _EmptyMemo:
    """The last cluster built with no pods and given back untouched (`empty_cluster`), while no session holds it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: ClusterState | None = None


_EMPTY = _EmptyMemo()


def empty_cluster(nodes: tuple[Node, ...], tie_break_seed: int | None) -> ClusterState:
    """`ClusterState(nodes, tie_break_seed)` with no pods on its nodes (what a session that reads only queue
    accounting needs): the one the last such session gave back (`give_back_empty`) when it is of the same
    node records, else a new one. Whoever takes it holds it alone until it gives it back."""
    with _EMPTY.lock:
        last, _EMPTY.last = _EMPTY.last, None
    if last is not None and last._static is _static(nodes, tie_break_seed):
        return last
    return ClusterState(nodes, tie_break_seed)


def give_back_empty(cluster: ClusterState) -> None:
    """A cluster of `empty_cluster` its session is done with: kept for the next when nothing changed it, else
    its reference cycles (each node and the cluster) broken."""
    if cluster.untouched():
        with _EMPTY.lock:
            _EMPTY.last = cluster
        return
    for node in cluster.order:
        del node.cluster


_A = TypeVar("_A", bound=np.ndarray)


def _read_only(array: _A) -> _A:
    array.flags.writeable = False
    return array
