"""The benchmark workloads as data: nodes, queues, topologies, the podgroups running before the measurement
and the podgroups created during it, as model objects built by pure functions.

Both modes run exactly these objects: the in-process runner (`tools.bench.inprocess`) feeds them to the
core, the bus runner (`tools.bench.bus`) turns them into Kubernetes manifests (`tools.bench.manifests`)
for the simulated API server. The shapes mirror kube-scheduler's scheduler_perf and KAI's scale tests
(issue 6): SchedulingBasic, Gang, FractionalGPU, Reclaim, UnschedulableGang, Topology, FairShare;
ReclaimLarge (issue 16: Reclaim at 5,000 full nodes); PodAntiAffinity, PodAffinity and TopologySpreading
(issue 17: scheduler_perf's SchedulingPodAntiAffinity, SchedulingPodAffinity and TopologySpreading);
MixedWorkloads (issue 28: owners of every workload kind, grouped by KAI's rules; built in `tools.bench.mixed`);
VolumeBinding and DRAGPUClaims (issue 30: WaitForFirstConsumer claims, DRA GPU claims from a template;
built in `tools.bench.claims`).
`build(name, quick)` gives the full or the quick size; `scheduling_basic(...)` also serves the scaling
curves. Deterministic: no randomness, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from shared.model import (
    LabelSelector,
    Node,
    PodAffinityTerm,
    PodStatus,
    Queue,
    QueueResource,
    Topology,
    TopologyConstraint,
    TopologySpreadConstraint,
)
from shared.model.builders import flat_queues, gang
from tools.bench.claims import dra_gpu_claims, volume_binding
from tools.bench.manifests import NAMESPACE
from tools.bench.mixed import mixed_workloads
from tools.bench.workload import Group, Workload, plain_nodes

__all__ = [
    "NAMES",
    "Group",
    "Workload",
    "build",
    "plain_nodes",
    "scheduling_basic",
]

UNBOUNDED = QueueResource(quota=-1, over_quota_weight=1, limit=-1)
TOPOLOGY = "bench-topology"
BLOCK_LABEL = "kairos.io/bench-block"
RACK_LABEL = "kairos.io/bench-rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"


def _group(
    name: str,
    queue: str,
    size: int,
    gpus: float,
    *,
    created: float,
    nodes: list[str] | None = None,
    topology_level: str | None = None,
) -> Group:
    status = PodStatus.RUNNING if nodes else PodStatus.PENDING
    pg, pods = gang(name, queue, size, gpus, created=created, status=status, nodes=nodes)
    if topology_level is not None:
        constraint = TopologyConstraint(TOPOLOGY, required_level=topology_level)
        pg = msgspec.structs.replace(
            pg, root=msgspec.structs.replace(pg.root, topology_constraint=constraint)
        )
    return Group(pg, tuple(pods))


def _names(count: int, prefix: str = "q") -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


# --- the workloads ------------------------------------------------------------------------------------------
def scheduling_basic(nodes: int, initial: int, measured: int, queues: int = 10) -> Workload:
    """scheduler_perf's SchedulingBasic with GPUs: `initial` one-GPU pods already running, one per node
    spread evenly, then `measured` one-GPU single-pod podgroups over `queues` flat queues."""
    return _single_pods(
        "SchedulingBasic",
        plain_nodes(nodes),
        _names(queues),
        initial,
        measured,
        names=("init-{:06d}", "pod-{:06d}"),
        gpus=1.0,
        generated=True,
    )


def gang_workload(gangs: int, size: int = 8) -> Workload:
    """`gangs` gangs of `size` one-GPU pods on exactly enough 8-GPU nodes to hold them all."""
    names = _names(4)
    nodes = max(1, gangs * size // 8)
    groups = [_group(f"gang-{j:05d}", names[j % 4], size, 1.0, created=float(j)) for j in range(gangs)]
    return Workload(
        name="Gang", nodes=tuple(plain_nodes(nodes)), queues=tuple(flat_queues(names)), measured=tuple(groups)
    )


def fractional_gpu(nodes: int, pods: int) -> Workload:
    """Single-pod podgroups asking 0.25, 0.5 and 1 GPU in turn (fractions share devices)."""
    names = _names(4)
    sizes = (0.25, 0.5, 1.0)
    groups = [_group(f"frac-{j:06d}", names[j % 4], 1, sizes[j % 3], created=float(j)) for j in range(pods)]
    return Workload(
        name="FractionalGPU",
        nodes=tuple(plain_nodes(nodes)),
        queues=tuple(flat_queues(names)),
        measured=tuple(groups),
    )


def reclaim(nodes: int, pending: int, per_node: int = 4, name: str = "Reclaim") -> Workload:
    """Queue `busy` fills every GPU with `per_node` jobs per node; queue `starved`, with the same quota
    (half the cluster) and nothing running, gets `pending` jobs of the same size: they fit only by
    reclaiming from `busy` (KAI's fair-share reclaim)."""
    node_list = plain_nodes(nodes)
    gpus = 8 // per_node
    running = [
        _group(
            f"run-{j:05d}", "busy", 1, float(gpus), created=float(j), nodes=[node_list[j // per_node].name]
        )
        for j in range(nodes * per_node)
    ]
    waiting = [
        _group(f"wait-{j:05d}", "starved", 1, float(gpus), created=float(len(running) + j))
        for j in range(pending)
    ]
    return Workload(
        name=name,
        nodes=tuple(node_list),
        queues=tuple(flat_queues(["busy", "starved"], gpu_quota=nodes * 4.0)),
        initial=tuple(running),
        measured=tuple(waiting),
        reclaim=True,
    )


def unschedulable_gang(nodes: int, fillers: int) -> Workload:
    """A gang of one whole-node pod more than there are nodes (it can never fit), created first, then
    `fillers` one-GPU pods that must be placed regardless."""
    names = _names(2)
    big = _group("too-big", names[0], nodes + 1, 8.0, created=0.0)
    rest = [_group(f"fill-{j:06d}", names[j % 2], 1, 1.0, created=float(1 + j)) for j in range(fillers)]
    return Workload(
        name="UnschedulableGang",
        nodes=tuple(plain_nodes(nodes)),
        queues=tuple(flat_queues(names)),
        measured=(big, *rest),
        verdict_for=big.podgroup.name,
    )


def topology(racks: int, gangs: int, nodes_per_rack: int = 8, racks_per_block: int = 8) -> Workload:
    """Nodes in racks and blocks (two topology levels); gangs of 8 four-GPU pods that must share a rack."""
    node_list: list[Node] = []
    for r in range(racks):
        labels = {BLOCK_LABEL: f"block-{r // racks_per_block}", RACK_LABEL: f"rack-{r}"}
        node_list.extend(
            msgspec.structs.replace(n, name=f"r{r:03d}-{n.name}", labels=labels)
            for n in plain_nodes(nodes_per_rack)
        )
    names = _names(4)
    groups = [
        _group(f"topo-{j:05d}", names[j % 4], 8, 4.0, created=float(j), topology_level=RACK_LABEL)
        for j in range(gangs)
    ]
    return Workload(
        name="Topology",
        nodes=tuple(node_list),
        queues=tuple(flat_queues(names)),
        topologies=(Topology(TOPOLOGY, (BLOCK_LABEL, RACK_LABEL)),),
        measured=tuple(groups),
        generated=False,
    )


def _labelled(nodes: list[Node], zones: int = 1) -> list[Node]:
    """Nodes with the labels kubelet and the cloud provider give them: hostname, and a zone (round robin
    over `zones`)."""
    return [
        msgspec.structs.replace(n, labels={HOSTNAME_LABEL: n.name, ZONE_LABEL: f"zone{i % zones + 1}"})
        for i, n in enumerate(nodes)
    ]


class _PodFields(msgspec.Struct, frozen=True, kw_only=True):
    """What a scheduler_perf pod template gives its pods, in the benchmark's namespace: labels, and the
    required affinity, anti-affinity and spread constraints that select them by those labels."""

    labels: dict[str, str]
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[TopologySpreadConstraint, ...] = ()

    def dress(self, group: Group) -> Group:
        pods = tuple(
            msgspec.structs.replace(
                p,
                namespace=NAMESPACE,
                labels=self.labels,
                pod_affinity=self.affinity,
                pod_anti_affinity=self.anti_affinity,
                topology_spread=self.spread,
            )
            for p in group.pods
        )
        return Group(group.podgroup, pods)


def _single_pods(
    name: str,
    nodes: list[Node],
    queues: list[str],
    initial: int,
    measured: int,
    *,
    names: tuple[str, str],
    gpus: float = 0.0,
    packed: bool = False,
    initial_pods: _PodFields | None = None,
    measured_pods: _PodFields | None = None,
    generated: bool = False,
) -> Workload:
    """scheduler_perf's shape: `initial` single-pod podgroups already running, one per node (spread evenly
    over `nodes`, or on the first ones when `packed`), then `measured` pending single-pod podgroups, each
    pod asking `gpus`. The j-th group of each phase goes to queue j % len(queues) and `names` formats its
    name from j (the initial phase's, the measured phase's); the groups are created at 0, 1, ..., the
    measured after the initial. `initial_pods` and `measured_pods` dress their pods (None: as `gang` makes
    them)."""
    stride = 1 if packed else max(1, len(nodes) // max(initial, 1))
    running = [
        _group(
            names[0].format(j),
            queues[j % len(queues)],
            1,
            gpus,
            created=float(j),
            nodes=[nodes[(j * stride) % len(nodes)].name],
        )
        for j in range(initial)
    ]
    later = [
        _group(names[1].format(j), queues[j % len(queues)], 1, gpus, created=float(initial + j))
        for j in range(measured)
    ]
    if initial_pods is not None:
        running = [initial_pods.dress(g) for g in running]
    if measured_pods is not None:
        later = [measured_pods.dress(g) for g in later]
    return Workload(
        name=name,
        nodes=tuple(nodes),
        queues=tuple(flat_queues(queues)),
        initial=tuple(running),
        measured=tuple(later),
        generated=generated,
    )


def _term(labels: dict[str, str], key: str) -> PodAffinityTerm:
    return PodAffinityTerm(
        selector=LabelSelector(match_labels=labels), topology_key=key, namespaces=(NAMESPACE,)
    )


def pod_anti_affinity(nodes: int, initial: int, measured: int) -> Workload:
    """scheduler_perf's SchedulingPodAntiAffinity: every pod carries `color: green` and a required
    anti-affinity to `color: green` over the hostname, so no two share a node; `initial` of them already
    run, one per node, then `measured` more single-pod podgroups (CPU-only, as scheduler_perf's)."""
    green = {"color": "green"}
    apart = _PodFields(labels=green, anti_affinity=(_term(green, HOSTNAME_LABEL),))
    return _single_pods(
        "PodAntiAffinity",
        _labelled(plain_nodes(nodes)),
        _names(4),
        initial,
        measured,
        names=("anti-init-{:05d}", "anti-{:05d}"),
        packed=True,
        initial_pods=apart,
        measured_pods=apart,
    )


def pod_affinity(nodes: int, initial: int, measured: int) -> Workload:
    """scheduler_perf's SchedulingPodAffinity: every pod carries `foo: ""` and a required affinity to
    `foo: ""` over the zone (every node in one zone), so each must find one already in its zone; `initial`
    run before, spread over the nodes, then `measured` more single-pod podgroups (CPU-only)."""
    foo = {"foo": ""}
    together = _PodFields(labels=foo, affinity=(_term(foo, ZONE_LABEL),))
    return _single_pods(
        "PodAffinity",
        _labelled(plain_nodes(nodes)),
        _names(4),
        initial,
        measured,
        names=("aff-init-{:05d}", "aff-{:05d}"),
        initial_pods=together,
        measured_pods=together,
    )


def topology_spreading(nodes: int, initial: int, measured: int, zones: int = 3) -> Workload:
    """scheduler_perf's TopologySpreading: nodes in `zones` zones; `initial` plain pods already running,
    then `measured` single-pod podgroups labelled `color: blue` with a DoNotSchedule constraint of max skew
    1 over the zone on `color: blue` pods (CPU-only, as scheduler_perf's)."""
    blue = {"color": "blue"}
    constraint = TopologySpreadConstraint(
        max_skew=1, topology_key=ZONE_LABEL, selector=LabelSelector(match_labels=blue)
    )
    return _single_pods(
        "TopologySpreading",
        _labelled(plain_nodes(nodes), zones),
        _names(4),
        initial,
        measured,
        names=("spread-init-{:05d}", "spread-{:05d}"),
        measured_pods=_PodFields(labels=blue, spread=(constraint,)),
    )


def fair_share(nodes: int, pods_per_leaf: int, fanout: int = 10, leaf_quota: float = 4.0) -> Workload:
    """`fanout`^3 leaf queues under `fanout`^2 sub-departments under `fanout` departments (1,110 queues at
    10), each leaf with a GPU quota, and `pods_per_leaf` one-GPU pods in every leaf."""
    queues: list[Queue] = []
    leaves: list[str] = []

    def add(name: str, parent: str | None, quota: float) -> None:
        gpu = QueueResource(quota=quota, over_quota_weight=1, limit=-1)
        queues.append(
            Queue(
                name=name, parent=parent, creation_index=len(queues), gpu=gpu, cpu=UNBOUNDED, memory=UNBOUNDED
            )
        )

    for d in range(fanout):
        dept = f"dept-{d}"
        add(dept, None, leaf_quota * fanout * fanout)
        for s in range(fanout):
            sub = f"{dept}-sub-{s}"
            add(sub, dept, leaf_quota * fanout)
            for leaf in range(fanout):
                name = f"{sub}-leaf-{leaf}"
                add(name, sub, leaf_quota)
                leaves.append(name)
    groups = [
        _group(f"fs-{j:06d}", leaves[j % len(leaves)], 1, 1.0, created=float(j))
        for j in range(len(leaves) * pods_per_leaf)
    ]
    return Workload(
        name="FairShare", nodes=tuple(plain_nodes(nodes)), queues=tuple(queues), measured=tuple(groups)
    )


# --- sizes ------------------------------------------------------------------------------------------------
_FULL: dict[str, Callable[[], Workload]] = {
    "SchedulingBasic": lambda: scheduling_basic(5000, 1000, 10_000),
    "Gang": lambda: gang_workload(1000),
    "FractionalGPU": lambda: fractional_gpu(1000, 6000),
    "Reclaim": lambda: reclaim(1000, 100),
    # Issue 16: 5,000 full nodes, 20,000 running jobs (KAI's own reclaim benchmark did not finish at 1,000).
    "ReclaimLarge": lambda: reclaim(5000, 100, name="ReclaimLarge"),
    "UnschedulableGang": lambda: unschedulable_gang(1000, 1000),
    "Topology": lambda: topology(128, 200),
    "FairShare": lambda: fair_share(1000, 4),
    # Issue 17: scheduler_perf's affinity workloads (kube-scheduler's CI minimums: 60 and 35 pods/s).
    "PodAntiAffinity": lambda: pod_anti_affinity(5000, 1000, 1000),
    "PodAffinity": lambda: pod_affinity(5000, 1000, 5000),
    "TopologySpreading": lambda: topology_spreading(5000, 1000, 5000),
    # Issue 28: owners of every kind with a simulated operator, grouped by the pod-grouper (4,000 pods).
    "MixedWorkloads": lambda: mixed_workloads(500, 1000),
    # The same pods and podgroups created already grouped: the difference is the pod-grouper's cost.
    "MixedWorkloadsPregrouped": lambda: mixed_workloads(500, 1000, pregrouped=True),
    # Issue 30: scheduler_perf's SchedulingCSIPVs (5,000 nodes, 5,000 measured pods) with WaitForFirstConsumer
    # claims, half on local volumes, half provisioned; and SchedulingWithResourceClaimTemplate's pods (a
    # claim from a template, one GPU through DRA) at 5,000 nodes.
    "VolumeBinding": lambda: volume_binding(5000, 1000, 5000),
    "DRAGPUClaims": lambda: dra_gpu_claims(5000, 1000, 5000),
}
_QUICK: dict[str, Callable[[], Workload]] = {
    "SchedulingBasic": lambda: scheduling_basic(500, 50, 300),
    "Gang": lambda: gang_workload(40),
    "FractionalGPU": lambda: fractional_gpu(100, 300),
    "Reclaim": lambda: reclaim(100, 10),
    "ReclaimLarge": lambda: reclaim(200, 10, name="ReclaimLarge"),
    "UnschedulableGang": lambda: unschedulable_gang(100, 100),
    "Topology": lambda: topology(8, 12),
    "FairShare": lambda: fair_share(100, 1, fanout=6),
    "PodAntiAffinity": lambda: pod_anti_affinity(200, 50, 100),
    "PodAffinity": lambda: pod_affinity(200, 50, 200),
    "TopologySpreading": lambda: topology_spreading(200, 50, 200),
    "MixedWorkloads": lambda: mixed_workloads(10, 20),
    "MixedWorkloadsPregrouped": lambda: mixed_workloads(10, 20, pregrouped=True),
    "VolumeBinding": lambda: volume_binding(200, 50, 200),
    "DRAGPUClaims": lambda: dra_gpu_claims(200, 50, 200),
}
NAMES: tuple[str, ...] = tuple(_FULL)


def build(name: str, quick: bool = False) -> Workload:
    """The workload `name` (one of `NAMES`) at its full or quick size; an unknown name raises KeyError."""
    return (_QUICK if quick else _FULL)[name]()
