"""Turn a KAI conformance case (its current round's description) into a `Snapshot`.

Applies the defaults of KAI's test fakes (../shared/conformance/kai/SEMANTICS.md §2-7): node allocatable and labels, queue and
department defaults (the synthetic `default` department), job order, creation times, preemptibility,
per-task requests (fractions, GPU memory, MIG, best effort), gangs and sub-groups. Called by
`tools.conformance.runner` once per round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.model import (
    GpuRequest,
    LabelSelector,
    LabelSelectorTerm,
    Node,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSet,
    PodStatus,
    Queue,
    QueueResource,
    Snapshot,
    SubGroupSet,
    Topology,
    TopologyConstraint,
)
from shared.model.objects import UNLIMITED
from shared.model.status import ALLOCATED
from tools.conformance import case as c

DEFAULT_CPU_MILLIS = 20_000_000.0
DEFAULT_MEMORY_BYTES = 2e10
DEFAULT_MAX_PODS = 110
DEFAULT_GPU_MEMORY_MIB = 100
DEFAULT_TASK_CPU_MILLIS = 1000.0
DEFAULT_TASK_MEMORY_BYTES = 1e9
NODE_TYPE_LABEL = "kai.scheduler/type"
MIB = 1024 * 1024
STUCK_FOR_SECONDS = 24 * 3600.0
"""How long before the case's time a ``StuckInReleasing`` task's deletion was asked: KAI's harness sets
the status itself; Kairos gives the pod a deletion older than any stuck-in-releasing threshold, so the core
classifies it as KAI's scheduler would (`shared.model.status.stuck_in_releasing`)."""


@dataclass
class TaskDesc:
    """The parts of a task the harness rewrites between rounds."""

    state: str | None
    node: str | None
    gpu_groups: list[str]


@dataclass
class CaseState:
    """A case plus the per-task state that evolves from round to round."""

    case: c.Case
    tasks: dict[str, TaskDesc] = field(default_factory=dict)

    @classmethod
    def start(cls, case: c.Case) -> CaseState:
        state = cls(case)
        for job in case.jobs:
            for t in job.tasks:
                state.tasks[t.pod_name] = TaskDesc(t.state, t.node, list(t.gpu_groups))
        return state


def _gpu_memory(value: int | None) -> int:
    if value is None:
        return DEFAULT_GPU_MEMORY_MIB
    mib = value // MIB if value >= MIB else value
    return mib // 100 * 100


def build_node(n: c.Node) -> Node:
    gpu_memory = _gpu_memory(n.gpu_memory_mib)
    mig_strategy = n.mig.strategy if n.mig is not None else None
    scalars = {k: float(v) for k, v in (n.mig.instances.items() if n.mig is not None else ())}
    labels = {
        "nvidia.com/gpu.count": str(n.gpus),
        "nvidia.com/gpu.memory": str(n.gpu_memory_mib if n.gpu_memory_mib is not None else 100),
        "node-role.kubernetes.io/mig-enabled": "true" if mig_strategy else "false",
        NODE_TYPE_LABEL: n.name,
    }
    if mig_strategy:
        labels["nvidia.com/mig.strategy"] = mig_strategy
    labels.update(n.labels)
    return Node(
        name=n.name,
        cpu_millis=n.cpu_millis if n.cpu_millis is not None else DEFAULT_CPU_MILLIS,
        memory_bytes=n.memory_bytes if n.memory_bytes is not None else DEFAULT_MEMORY_BYTES,
        gpus=n.gpus,
        gpu_memory_mib=gpu_memory,
        gpu_memory_synced=True if n.gpu_memory_synced is None else n.gpu_memory_synced,
        max_pods=n.max_pods if n.max_pods is not None else DEFAULT_MAX_PODS,
        scalars=scalars,
        labels=labels,
        mig_enabled=labels.get("node-role.kubernetes.io/mig-enabled") == "true",
        mig_strategy=mig_strategy,
    )


def _resource(r: c.QueueResource, zero: bool = False) -> QueueResource:
    if zero:
        return QueueResource(quota=0.0, over_quota_weight=0.0, limit=0.0)
    quota = UNLIMITED if r.quota is None else r.quota
    limit = UNLIMITED if r.limit is None else r.limit
    return QueueResource(quota=quota, over_quota_weight=max(r.over_quota_weight, 0.0), limit=limit)


def build_queues(case: c.Case) -> list[Queue]:
    out: list[Queue] = []
    for i, d in enumerate(case.departments):
        out.append(
            Queue(
                name=d.name,
                parent=None,
                priority=100,
                creation_index=i,
                gpu=_resource(d.gpu),
                cpu=_resource(d.cpu),
                memory=_resource(d.memory),
            )
        )
    for i, q in enumerate(case.queues):
        out.append(
            Queue(
                name=q.name,
                parent=q.parent,
                priority=100 if q.priority is None else q.priority,
                creation_index=i,
                gpu=_resource(q.gpu, q.v1),
                cpu=_resource(q.cpu, q.v1),
                memory=_resource(q.memory, q.v1),
            )
        )
    return out


def _constraint(tc: c.TopologyConstraint | None) -> TopologyConstraint | None:
    # KAI's topology plugin reads a constraint without a topology name as no constraint at all.
    if tc is None or not tc.topology:
        return None
    return TopologyConstraint(tc.topology, tc.required_level, tc.preferred_level)


def _sub_group_set(sg: c.SubGroupSet) -> SubGroupSet:
    return SubGroupSet(
        name=sg.name,
        pod_sets=tuple(
            PodSet(p.name, p.min_available, _constraint(p.topology_constraint)) for p in sg.pod_sets
        ),
        children=tuple(_sub_group_set(child) for child in sg.sub_groups),
        topology_constraint=_constraint(sg.topology_constraint),
        min_sub_group=sg.min_sub_group,
    )


def build_root(job: c.Job) -> SubGroupSet:
    if job.sub_groups is None:
        sets = tuple(PodSet(p.name, p.min_available) for p in job.pod_sets)
        return SubGroupSet(name="root", pod_sets=sets)
    root = _sub_group_set(job.sub_groups)
    extra = tuple(PodSet(p.name, p.min_available) for p in job.pod_sets if p.auto_created)
    if extra:
        root = SubGroupSet(
            name=root.name,
            pod_sets=root.pod_sets + extra,
            children=root.children,
            topology_constraint=root.topology_constraint,
            min_sub_group=root.min_sub_group,
        )
    return root


def _is_integer(value: float) -> bool:
    return float(value).is_integer()


def gpu_request(job: c.Job, task: c.Task) -> GpuRequest:
    """The GPU part of a task's request, as KAI's pod parsing would see the fake pod."""
    per = job.per_task
    if task.mig_instances:
        return GpuRequest(mig=dict(task.mig_instances))
    whole = 0
    fraction = 0.0
    memory = 0
    if not job.best_effort:
        if _is_integer(per.gpus):
            whole = int(per.gpus)
        else:
            fraction = per.gpus
        memory = per.gpu_memory_mib or 0
    if task.gpus is not None:
        whole = task.gpus
    # KAI v0.17's harness marks a shared request of `gpu_devices` devices as that many (the pod annotation
    # gpu-fraction-num-devices; SCHEMA.md, "Fields added for KAI v0.17").
    devices = per.gpu_devices or 1
    if 0 < fraction <= 1:
        return GpuRequest(devices=devices, fraction=fraction)
    if memory > 0:
        return GpuRequest(devices=devices, memory_mib=memory)
    return GpuRequest(devices=whole)


def build_snapshot(state: CaseState, now: float) -> Snapshot:
    case = state.case
    nodes = tuple(build_node(n) for n in case.nodes)
    pods: list[Pod] = []
    podgroups: list[PodGroup] = []
    for job in case.jobs:
        creation = now - job.age_minutes_effective * 60.0
        statuses: list[PodStatus] = []
        namespace = job.namespace or ""
        for t in job.tasks:
            desc = state.tasks[t.pod_name]
            status = PodStatus(desc.state) if desc.state is not None else PodStatus.UNKNOWN
            statuses.append(status)
            releasing_since = None
            if status == PodStatus.STUCK_IN_RELEASING:
                status, releasing_since = PodStatus.RELEASING, now - STUCK_FOR_SECONDS
            gpu = gpu_request(job, t)
            groups = list(desc.gpu_groups)
            if (
                not groups
                and gpu.is_shared
                and status in ALLOCATED | {PodStatus.PIPELINED, PodStatus.RELEASING}
            ):
                count = job.per_task.gpu_devices or 1
                groups = [f"uuid-{t.pod_name}-{k}" for k in range(count)]
                desc.gpu_groups = groups
            labels = dict(t.pod_affinity_labels)
            affinity: tuple[PodAffinityTerm, ...] = ()
            anti: tuple[PodAffinityTerm, ...] = ()
            # KAI's test pods name no namespaces in their terms: Kubernetes reads that as the pod's own.
            selector = LabelSelector(match_labels=dict(t.pod_affinity_labels))
            if t.pod_affinity_topology_key:
                affinity = (
                    PodAffinityTerm(
                        selector=selector, topology_key=t.pod_affinity_topology_key, namespaces=(namespace,)
                    ),
                )
            if t.pod_anti_affinity_topology_key:
                anti = (
                    PodAffinityTerm(
                        selector=selector,
                        topology_key=t.pod_anti_affinity_topology_key,
                        namespaces=(namespace,),
                    ),
                )
            node_affinity: tuple[LabelSelectorTerm, ...] = ()
            if t.node_affinity:
                node_affinity = (
                    LabelSelectorTerm(
                        (NodeSelectorRequirement(NODE_TYPE_LABEL, "In", tuple(t.node_affinity)),)
                    ),
                )
            best_effort = job.best_effort
            pods.append(
                Pod(
                    name=t.pod_name,
                    namespace=namespace,
                    uid=t.pod_name,
                    podgroup=job.name,
                    status=status,
                    node=desc.node or None,
                    gpu_groups=tuple(groups),
                    cpu_millis=0.0 if best_effort else (job.per_task.cpu_millis or DEFAULT_TASK_CPU_MILLIS),
                    memory_bytes=0.0
                    if best_effort
                    else (job.per_task.memory_bytes or DEFAULT_TASK_MEMORY_BYTES),
                    gpu=gpu,
                    sub_group=t.sub_group,
                    task_priority=t.priority,
                    labels=labels,
                    node_affinity=node_affinity,
                    pod_affinity=affinity,
                    pod_anti_affinity=anti,
                    legacy_mig=t.legacy_mig,
                    releasing_since=releasing_since,
                )
            )
        running = any(s in ALLOCATED for s in statuses)
        podgroups.append(
            PodGroup(
                name=job.name,
                namespace=namespace,
                uid=job.name,
                queue=job.queue,
                priority=job.priority,
                preemptible=job.preemptibility_effective == "preemptible",
                creation_time=creation,
                last_start_time=now - 60.0 if running else None,
                stale_since=now - job.stale_seconds if job.stale_seconds is not None else None,
                staleness_grace_period=job.staleness_grace_period_seconds,
                preemption_delay=job.preemption_delay_seconds,
                root=build_root(job),
            )
        )
    topologies = tuple(Topology(t.name, tuple(t.levels)) for t in case.topologies)
    return Snapshot(
        nodes=nodes,
        pods=tuple(pods),
        podgroups=tuple(podgroups),
        queues=tuple(build_queues(case)),
        topologies=topologies,
    )
