"""Builders of model objects for synthetic clusters and workloads: GPU nodes (also spread over zones), flat
queues, gangs (also with topology spread constraints), and the two sibling queues time-based fair share is
shown on.

Deterministic for a given seed. Called by the state service's simulated cluster (its demo cluster), the
tools (the demo, the benchmarks) and tests.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from shared.model import (
    GpuRequest,
    HostPort,
    Node,
    Pod,
    PodGroup,
    PodSet,
    PodStatus,
    Queue,
    QueueResource,
    Snapshot,
    SubGroupSet,
    TopologySpreadConstraint,
)

GIB = 1024**3
ZONE = "topology.kubernetes.io/zone"
"""Kubernetes' well-known zone label."""


def gpu_nodes(
    count: int, gpus: int = 8, prefix: str = "node", labels: dict[str, str] | None = None
) -> list[Node]:
    """`count` identical GPU nodes (64 cores, 512 GiB, 80 GB devices)."""
    return [
        Node(
            name=f"{prefix}-{i:05d}",
            cpu_millis=64_000.0,
            memory_bytes=512.0 * GIB,
            gpus=gpus,
            gpu_memory_mib=81_920,
            max_pods=250,
            labels={"kubernetes.io/hostname": f"{prefix}-{i:05d}", **(labels or {})},
        )
        for i in range(count)
    ]


def zoned_nodes(per_zone: Mapping[str, int], gpus: int = 8) -> list[Node]:
    """`gpu_nodes` in zones: `per_zone[z]` nodes named ``z-00000``... labelled `ZONE` = z."""
    return [node for zone, count in per_zone.items() for node in gpu_nodes(count, gpus, zone, {ZONE: zone})]


def flat_queues(names: Iterable[str], gpu_quota: float = 0.0, weight: float = 1.0) -> list[Queue]:
    dept = Queue(name="dept", parent=None, gpu=QueueResource(quota=-1, over_quota_weight=1, limit=-1))
    out = [dept]
    for i, name in enumerate(names):
        out.append(
            Queue(
                name=name,
                parent="dept",
                creation_index=i,
                gpu=QueueResource(quota=gpu_quota, over_quota_weight=weight, limit=-1),
                cpu=QueueResource(quota=-1, over_quota_weight=1, limit=-1),
                memory=QueueResource(quota=-1, over_quota_weight=1, limit=-1),
            )
        )
    return out


def gang(
    name: str,
    queue: str,
    size: int,
    gpus: float = 1.0,
    *,
    priority: int = 50,
    created: float = 0.0,
    status: PodStatus = PodStatus.PENDING,
    nodes: list[str] | None = None,
    cpu_millis: float = 1000.0,
    memory_bytes: float = 4.0 * GIB,
    min_available: int | None = None,
    scalars: dict[str, float] | None = None,
    host_ports: Sequence[HostPort] = (),
) -> tuple[PodGroup, list[Pod]]:
    """A podgroup of `size` identical pods (whole GPUs, or a fraction when `gpus` < 1), each asking for
    `scalars` (extended resources and the like) and binding `host_ports` on its node."""
    req = GpuRequest(devices=int(gpus)) if float(gpus).is_integer() else GpuRequest(devices=1, fraction=gpus)
    pg = PodGroup(
        name=name,
        uid=name,
        queue=queue,
        priority=priority,
        preemptible=priority < 100,
        creation_time=created,
        last_start_time=created if status == PodStatus.RUNNING else None,
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", min_available or size),)),
    )
    pods = [
        Pod(
            name=f"{name}-{i}",
            uid=f"{name}-{i}",
            podgroup=name,
            status=status,
            node=nodes[i] if nodes else None,
            gpu_groups=(f"{i}",) if req.is_fraction and nodes else (),
            cpu_millis=cpu_millis,
            memory_bytes=memory_bytes,
            gpu=req,
            creation_time=created,
            scalars=dict(scalars or {}),
            host_ports=tuple(host_ports),
        )
        for i in range(size)
    ]
    return pg, pods


def busy_and_idle(nodes: Sequence[Node], pending: int = 12) -> Snapshot:
    """`nodes`, and sibling queues `busy` and `idle` (no GPU quota, GPU over-quota weight 1; CPU and memory
    unbounded with weight 0), each with one podgroup of `pending` pending one-GPU pods (0.1 CPU, 1 GB):
    with no usage they split the GPUs evenly, so usage alone moves the split."""
    unbounded = QueueResource(quota=-1, over_quota_weight=0, limit=-1)
    names = ("busy", "idle")
    queues = tuple(
        Queue(
            name=name,
            creation_index=i,
            gpu=QueueResource(quota=0, over_quota_weight=1, limit=-1),
            cpu=unbounded,
            memory=unbounded,
        )
        for i, name in enumerate(names)
    )
    groups = tuple(
        PodGroup(name=q, namespace="ns", queue=q, root=SubGroupSet(name="root", pod_sets=(PodSet("p", 1),)))
        for q in names
    )
    pods = tuple(
        Pod(
            name=f"{q}-{i}",
            namespace="ns",
            podgroup=q,
            status=PodStatus.PENDING,
            cpu_millis=100,
            memory_bytes=1e9,
            gpu=GpuRequest(devices=1),
        )
        for q in names
        for i in range(pending)
    )
    return Snapshot(nodes=tuple(nodes), queues=queues, podgroups=groups, pods=pods)


def random_workload(
    rng: random.Random, queues: list[str], jobs: int, max_gang: int = 4
) -> tuple[list[PodGroup], list[Pod]]:
    groups: list[PodGroup] = []
    pods: list[Pod] = []
    for j in range(jobs):
        size = rng.randint(1, max_gang)
        gpus = rng.choice([0.25, 0.5, 1.0, 1.0, 2.0])
        pg, ps = gang(
            f"job-{j:05d}",
            rng.choice(queues),
            size,
            gpus,
            priority=rng.choice([50, 50, 75, 100]),
            created=float(j),
        )
        groups.append(pg)
        pods.extend(ps)
    return groups, pods


def with_spread(
    pods: Iterable[Pod], labels: Mapping[str, str], *constraints: TopologySpreadConstraint
) -> list[Pod]:
    """`pods` carrying `labels` and declaring `constraints` (``topologySpreadConstraints``)."""
    return [
        msgspec.structs.replace(p, labels={**p.labels, **labels}, topology_spread=tuple(constraints))
        for p in pods
    ]
