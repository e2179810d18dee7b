"""Queue accounting during a session: deserved, fair share, allocated; queue order and capacity checks.

This is KAI's `proportion` plugin as pure functions over `QueueState`s: the session builds the queue
states (requests and allocations from the snapshot, fair share from `shared.core.fair_share`), statements
move `allocated` as pods are placed or evicted, and the actions ask `queue_order_key`-style comparisons
and the capacity checks (limit; non-preemptible work only inside quota).

A gpu-memory request becomes GPUs of quota by dividing by a device's memory: which device is
`DeviceMemory`'s concern (KAI v0.17, read from the nodes each session). A placed pod counts its share on
its own node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.core.fair_share import (
    QueueSpec,
    ResourceSpec,
    allocatable_share,
    compute_fair_shares,
    dominant_resource_share,
    fair_share_less_than_allocated,
    less_equal,
)
from shared.model import Node, Queue
from shared.model.objects import UNLIMITED

# Resource order of every 3-vector in this module: GPU devices, CPU millicores, memory bytes.
R_GPU, R_CPU, R_MEM = 0, 1, 2
RESOURCE_NAMES = ("GPU", "CPU", "Memory")

Vec = list[float]


def vec() -> Vec:
    return [0.0, 0.0, 0.0]


UNREPORTED_GPU_MEMORY_MIB = 100
"""What a GPU node without the GPU-feature-discovery memory label reports per device (KAI's
``DefaultGpuMemory``): a placeholder, not a size."""


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """The GPU memory per device (MiB) that turns gpu-memory requests into GPUs of queue quota (KAI v0.17,
    ``MinNodeGPUMemoryMiB`` and ``MaxNodeGPUMemoryMiB``); None where the cluster has no GPU node, and a
    gpu-memory request then counts no GPUs.

    - `smallest` where the count must not understate the pod: what a pending pod asks of its queue, and a
      job's init request that reclaim (may it reclaim, from whom), the queue order and the victim search
      compare with fair shares;
    - `largest` for the queue limit and non-preemptible quota checks made before a node is chosen: the
      smallest share the pod could take anywhere, so a job over even then is over on every node
      (KAI #1792; the per-node check uses the node's own devices).
    """

    smallest: int | None
    largest: int | None

    def as_gpus(self, devices: int, memory_mib: int, per_device: int | None) -> float:
        """KAI ``GpuMemoryAsGpuFraction``: `devices` x `memory_mib` over `per_device` (one of the two
        fields); 0 without a size to divide by."""
        if per_device is None or per_device <= 0 or memory_mib <= 0:
            return 0.0
        return devices * (memory_mib / per_device)


def device_memory_of(nodes: Sequence[Node], fixed_smallest: int | None = None) -> DeviceMemory:
    """The smallest and largest memory per device among the GPU nodes: those reporting a size (above KAI's
    100 MiB placeholder), else the placeholder when no GPU node reports one; None and None without any
    GPU node. `fixed_smallest` (`Policy.min_node_gpu_memory_mib`) replaces the smallest.

    KAI's scheduler takes the extremes over its GPU nodes (nil without one, #1792) and its test harness
    over the nodes above 100 MiB, else 100: the two agree wherever both apply, and this is both."""
    gpu_nodes = [n.gpu_memory_mib for n in nodes if n.gpus > 0]
    if not gpu_nodes:
        return DeviceMemory(fixed_smallest, None)
    sizes = [m for m in gpu_nodes if m > UNREPORTED_GPU_MEMORY_MIB] or [UNREPORTED_GPU_MEMORY_MIB]
    smallest = fixed_smallest if fixed_smallest is not None else min(sizes)
    return DeviceMemory(smallest, max(sizes))


@dataclass(eq=False)
class QueueState:
    """One queue's attributes for a session (KAI `QueueAttributes`)."""

    name: str
    parent: str | None
    priority: int
    creation_index: int
    deserved: Vec
    limit: Vec
    weight: Vec
    children: list[str] = field(default_factory=list)
    fair_share: Vec = field(default_factory=vec)
    allocated: Vec = field(default_factory=vec)
    allocated_non_preemptible: Vec = field(default_factory=vec)
    requested: Vec = field(default_factory=vec)
    # Per-queue min-runtime overrides in seconds (None: inherit), read by `shared.core.minruntime`.
    preempt_min_runtime: float | None = None
    reclaim_min_runtime: float | None = None
    # Bumped when `allocated` moves; keys cached queue-order views.
    version: int = 0
    _allocatable: Vec | None = None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def allocatable_share(self, r: int) -> float:
        """KAI `GetAllocatableShare`: max(deserved, fair share), capped by the limit."""
        if self._allocatable is not None:
            return self._allocatable[r]
        return self._compute_allocatable(r)

    def freeze_shares(self) -> None:
        """Fair shares are final for the session: remember the allocatable shares they imply."""
        self._allocatable = [self._compute_allocatable(r) for r in range(3)]

    def _compute_allocatable(self, r: int) -> float:
        return allocatable_share(self.deserved[r], self.fair_share[r], self.limit[r])

    def dominant_share(self, total: Vec, allocated: Vec | None = None) -> float:
        """KAI `GetDominantResourceShare`: the largest allocated / allocatable over the resources."""
        alloc = self.allocated if allocated is None else allocated
        able = (self.allocatable_share(0), self.allocatable_share(1), self.allocatable_share(2))
        return dominant_resource_share((alloc[0], alloc[1], alloc[2]), able, (total[0], total[1], total[2]))


def queue_states_from_model(queues: Sequence[Queue]) -> dict[str, QueueState]:
    states: dict[str, QueueState] = {}
    for q in queues:
        states[q.name] = QueueState(
            name=q.name,
            parent=q.parent,
            priority=q.priority,
            creation_index=q.creation_index,
            deserved=[q.gpu.quota, q.cpu.quota, q.memory.quota],
            limit=[q.gpu.limit, q.cpu.limit, q.memory.limit],
            weight=[q.gpu.over_quota_weight, q.cpu.over_quota_weight, q.memory.over_quota_weight],
            preempt_min_runtime=q.preempt_min_runtime,
            reclaim_min_runtime=q.reclaim_min_runtime,
        )
    for q in queues:
        if q.parent is not None and q.parent in states:
            states[q.parent].children.append(q.name)
    return states


def ancestors_and_self(states: dict[str, QueueState], name: str) -> list[QueueState]:
    out: list[QueueState] = []
    seen: set[str] = set()
    cur = states.get(name)
    while cur is not None and cur.name not in seen:
        out.append(cur)
        seen.add(cur.name)
        cur = states.get(cur.parent) if cur.parent is not None else None
    return out


def set_fair_shares(
    states: dict[str, QueueState],
    total: Vec,
    usage: Mapping[str, tuple[float, float, float]] | None = None,
    k_value: float = 1.0,
) -> None:
    """Every queue's fair share (KAI's division); `usage` of queues not in `states` is ignored (a queue
    deleted since its usage was recorded)."""
    specs = [
        QueueSpec(
            name=s.name,
            parent=s.parent if s.parent in states else None,
            priority=s.priority,
            creation_index=s.creation_index,
            gpu=ResourceSpec(s.deserved[R_GPU], s.weight[R_GPU], s.limit[R_GPU]),
            cpu=ResourceSpec(s.deserved[R_CPU], s.weight[R_CPU], s.limit[R_CPU]),
            memory=ResourceSpec(s.deserved[R_MEM], s.weight[R_MEM], s.limit[R_MEM]),
        )
        for s in states.values()
    ]
    leaf_requests = {
        s.name: (s.requested[R_GPU], s.requested[R_CPU], s.requested[R_MEM])
        for s in states.values()
        if s.is_leaf
    }
    known = {q: v for q, v in (usage or {}).items() if q in states}
    shares = compute_fair_shares(
        specs, leaf_requests, (total[R_GPU], total[R_CPU], total[R_MEM]), usage=known, k_value=k_value
    )
    for name, share in shares.items():
        states[name].fair_share = list(share.fair_share)
    for state in states.values():
        state.freeze_shares()


# --- queue order (KAI queue_order.GetQueueOrderResult) -----------------------------------------------------
@dataclass(frozen=True)
class QueueView:
    """The per-queue quantities the queue order compares, for one candidate job (or victim set)."""

    over_utilised: bool
    within_deserved: bool
    priority: int
    zero_share_violation: bool
    share_with_job: float
    share: float
    allocatable: tuple[float, float, float]
    creation_index: int


def queue_view(q: QueueState, job_req: Vec | None, victims_alloc: Vec | None, total: Vec) -> QueueView:
    """Everything `compare_views` needs about one queue; job requirements are of the queue's head job
    (pending ordering), victims' allocations are used when ordering victim queues."""
    with_job = _plus(q.allocated, job_req)
    allocatable = (q.allocatable_share(0), q.allocatable_share(1), q.allocatable_share(2))
    return QueueView(
        over_utilised=fair_share_less_than_allocated(_v3(q.fair_share), _v3(q.allocated)),
        within_deserved=less_equal(with_job, q.deserved),
        priority=q.priority,
        zero_share_violation=any(allocatable[r] == 0 and with_job[r] > 0 for r in range(3)),
        share_with_job=q.dominant_share(total, _minus(with_job, victims_alloc)),
        share=q.dominant_share(total),
        allocatable=allocatable,
        creation_index=q.creation_index,
    )


def compare_views(lv: QueueView, rv: QueueView) -> int:
    """Negative when the left queue goes first (KAI's criteria, in KAI's order)."""
    # Under-utilised queues (fair share not strictly below allocation everywhere) first.
    if lv.over_utilised != rv.over_utilised:
        return 1 if lv.over_utilised else -1
    # Queues that stay within deserved quota with their job first.
    if lv.within_deserved != rv.within_deserved:
        return -1 if lv.within_deserved else 1
    if lv.priority != rv.priority:
        return -1 if lv.priority > rv.priority else 1
    # Penalise using a resource the queue has no allocatable share of.
    if lv.zero_share_violation != rv.zero_share_violation:
        return 1 if lv.zero_share_violation else -1
    if lv.share_with_job != rv.share_with_job:
        return -1 if lv.share_with_job < rv.share_with_job else 1
    if lv.share != rv.share:
        return -1 if lv.share < rv.share else 1
    la, ra = list(lv.allocatable), list(rv.allocatable)
    if not less_equal(ra, la) and less_equal(la, ra):
        return -1
    if not less_equal(la, ra) and less_equal(ra, la):
        return 1
    return -1 if lv.creation_index < rv.creation_index else 1


def compare_queues(
    lq: QueueState,
    rq: QueueState,
    l_job_req: Vec | None,
    r_job_req: Vec | None,
    l_victims_alloc: Vec | None,
    r_victims_alloc: Vec | None,
    total: Vec,
) -> int:
    """Negative when `lq` goes first."""
    return compare_views(
        queue_view(lq, l_job_req, l_victims_alloc, total), queue_view(rq, r_job_req, r_victims_alloc, total)
    )


def _v3(v: Vec) -> tuple[float, float, float]:
    return (v[0], v[1], v[2])


def _plus(a: Vec, b: Vec | None) -> Vec:
    if b is None:
        return list(a)
    return [a[0] + b[0], a[1] + b[1], a[2] + b[2]]


def _minus(a: Vec, b: Vec | None) -> Vec:
    if b is None:
        return a
    return [a[0] - b[0], a[1] - b[1], a[2] - b[2]]


# --- capacity policy -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CapacityResult:
    ok: bool
    reason: str = ""
    message: str = ""


OK = CapacityResult(True)


def check_over_limit(chain: list[QueueState], requested: Vec) -> CapacityResult:
    for q in chain:
        for r in range(3):
            if q.limit[r] == UNLIMITED or requested[r] == 0:
                continue
            if q.limit[r] < q.allocated[r] + requested[r]:
                return CapacityResult(
                    False,
                    "OverLimit",
                    f"{_resource_noun(r)} quota has reached the allowable limit of {_fmt(r, q.limit[r])}. "
                    f"Limit is {_fmt(r, q.limit[r])}, currently {_fmt(r, q.allocated[r])} allocated and "
                    f"workload requested {_fmt(r, requested[r])}",
                )
    return OK


def check_non_preemptible_over_quota(
    chain: list[QueueState], requested: Vec, preemptible: bool
) -> CapacityResult:
    if preemptible:
        return OK
    for q in chain:
        for r in range(3):
            if q.deserved[r] == UNLIMITED or requested[r] == 0:
                continue
            if q.deserved[r] < q.allocated_non_preemptible[r] + requested[r]:
                return CapacityResult(
                    False,
                    "NonPreemptibleOverQuota",
                    f"Non-preemptible workload is over quota. Workload requested {_fmt(r, requested[r])} "
                    f"{_resource_noun(r)}, queue {q.name} deserves {_fmt(r, q.deserved[r])} and currently "
                    f"has {_fmt(r, q.allocated_non_preemptible[r])} allocated to non-preemptible workloads",
                )
    return OK


def _resource_noun(r: int) -> str:
    return ("GPU", "CPU", "memory")[r]


def _fmt(r: int, v: float) -> str:
    if r == R_GPU:
        return f"{v:g} GPUs"
    if r == R_CPU:
        return f"{v / 1000:g} cores"
    return f"{v / 1e9:g} GB"
