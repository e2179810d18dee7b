"""KAI v0.16's ``numa`` plugin, as specifications: the kubelet Topology Manager's admission predicted from
the nodes' NUMA zones (`shared.core.plugins.numa`).

The evaluator's tables are KAI's design examples and its plugin's tests (pod and container scope, init
containers and native sidecars, the restricted hint merge with its width rule, masks that skip a busy zone,
best-effort spans, the node score); the cycles below them show what a user sees: a Guaranteed pod is bound
only where the kubelet would admit it, pods placed in one cycle share the zones, and a pod that fits no
node says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.opening import open_session
from shared.core.plugins import numa
from shared.core.plugins.chain import plugin_configs, resolve
from shared.core.plugins.registry import PluginConfigError
from shared.core.policy import Argument, PluginConfig, Policy
from shared.core.scheduler import schedule
from shared.model import (
    GpuRequest,
    Node,
    Pod,
    PodGroup,
    PodSet,
    PodStatus,
    Queue,
    Snapshot,
    SubGroupSet,
)
from shared.model.numa import NodeNuma, NumaRequest, NumaZone, TopologyPolicy, TopologyScope
from tests import builders
from tests.builders import team_queues

GPU = "nvidia.com/gpu"
GI = 2.0**30
NOW = 10_000.0


# --- builders ---------------------------------------------------------------------------------------------
def amounts(**kwargs: float) -> dict[str, float]:
    """Resources by Python name: ``gpu`` for nvidia.com/gpu, ``cpu`` in CPUs (stored in millicores),
    ``memory`` in GiB (stored in bytes)."""
    out: dict[str, float] = {}
    for key, value in kwargs.items():
        if key == "gpu":
            out[GPU] = float(value)
        elif key == "cpu":
            out["cpu"] = value * 1000
        elif key == "memory":
            out["memory"] = value * GI
        else:
            out[key] = float(value)
    return out


def zone(
    index: int, allocatable: Mapping[str, float], available: Mapping[str, float] | None = None
) -> NumaZone:
    return NumaZone(
        name=f"node-{index}",
        allocatable=dict(allocatable),
        available=dict(allocatable if available is None else available),
    )


def topo(
    policy: TopologyPolicy, *zones: Mapping[str, float] | NumaZone, scope: TopologyScope = "container"
) -> NodeNuma:
    built = tuple(z if isinstance(z, NumaZone) else zone(i, z) for i, z in enumerate(zones))
    return NodeNuma(policy=policy, scope=scope, zones=built)


def guaranteed(
    *apps: Mapping[str, float],
    init: Sequence[Mapping[str, float]] = (),
    sidecars: Sequence[Mapping[str, float]] = (),
) -> NumaRequest:
    """A Guaranteed pod's request: app containers, ordinary init containers and native sidecars."""
    whole: dict[str, float] = {}
    running: dict[str, float] = {}
    for unit in (*sidecars, *apps):
        for r, v in unit.items():
            running[r] = running.get(r, 0.0) + v
    side = {r: sum(u.get(r, 0.0) for u in sidecars) for u in sidecars for r in u}
    for unit in init:
        for r in unit.keys() | side.keys():
            whole[r] = max(whole.get(r, 0.0), side.get(r, 0.0) + unit.get(r, 0.0))
    for r, v in running.items():
        whole[r] = max(whole.get(r, 0.0), v)
    return NumaRequest(
        guaranteed=True,
        pod=whole,
        containers=tuple(dict(u) for u in (*sidecars, *apps)),
        init=tuple(dict(u) for u in init),
    )


def placed(outcome: numa.Outcome) -> dict[int, dict[str, float]] | None:
    if outcome.placement is None:
        return None
    return {z: dict(taken) for z, taken in enumerate(outcome.placement) if taken}


def evaluate(node: NodeNuma, request: NumaRequest, ignore: frozenset[str] = frozenset()) -> numa.Outcome:
    return numa.evaluate(node, request, [z.free for z in node.zones], ignore)


# --- the evaluator ----------------------------------------------------------------------------------------
TWO_BY_FOUR_GPUS = (amounts(gpu=4, cpu=16), amounts(gpu=4, cpu=16))


@pytest.mark.parametrize(
    ("policy", "request_", "admitted"),
    [
        pytest.param(
            "single-numa-node",
            guaranteed(amounts(cpu=3)),
            {0: amounts(cpu=3)},
            id="single: 3 of 4 CPUs fit the first zone",
        ),
        pytest.param(
            "single-numa-node", guaranteed(amounts(cpu=5)), None, id="single: 5 CPUs fit no 4-CPU zone"
        ),
        pytest.param(
            "restricted",
            guaranteed(amounts(cpu=5)),
            {0: amounts(cpu=4), 1: amounts(cpu=1)},
            id="restricted: 5 CPUs span both zones",
        ),
        pytest.param(
            "best-effort", guaranteed(amounts(cpu=9)), None, id="best-effort: 9 CPUs are more than the node"
        ),
    ],
)
def test_a_pod_fits_one_zone_under_single_numa_node_and_the_fewest_under_restricted(
    policy: TopologyPolicy, request_: NumaRequest, admitted: dict[int, dict[str, float]] | None
) -> None:
    node = topo(policy, amounts(cpu=4), amounts(cpu=4), scope="pod")
    assert placed(evaluate(node, request_)) == admitted


@pytest.mark.parametrize(
    ("request_", "admitted"),
    [
        pytest.param(guaranteed(amounts(gpu=6, cpu=10)), None, id="6 GPUs need 2 zones, 10 CPUs 1: refused"),
        pytest.param(
            guaranteed(amounts(gpu=6, cpu=24)),
            {0: amounts(gpu=4, cpu=16), 1: amounts(gpu=2, cpu=8)},
            id="6 GPUs and 24 CPUs both need 2 zones: admitted on both",
        ),
        pytest.param(
            guaranteed(amounts(gpu=4, cpu=1)), {0: amounts(gpu=4, cpu=1)}, id="4 GPUs and 1 CPU: one zone"
        ),
    ],
)
def test_restricted_admits_only_when_every_resource_needs_the_same_number_of_zones(
    request_: NumaRequest, admitted: dict[int, dict[str, float]] | None
) -> None:
    """KAI's design examples (2 zones of 4 GPUs and 16 CPUs)."""
    assert placed(evaluate(topo("restricted", *TWO_BY_FOUR_GPUS, scope="pod"), request_)) == admitted


def test_restricted_refuses_four_gpus_and_one_cpu_on_a_two_plus_two_gpu_node_as_the_kubelet_does() -> None:
    node = topo("restricted", amounts(gpu=2, cpu=32), amounts(gpu=2, cpu=32), scope="pod")
    outcome = evaluate(node, guaranteed(amounts(gpu=4, cpu=1)))
    assert outcome.placement is None
    assert (
        outcome.why
        == f"its resources need different numbers of NUMA nodes (cpu 1, {GPU} 2), which restricted refuses"
    )


SYMMETRIC = (amounts(gpu=4, cpu=8, memory=16), amounts(gpu=4, cpu=8, memory=16))


@pytest.mark.parametrize(
    ("scope", "request_", "admitted"),
    [
        pytest.param(
            "container",
            guaranteed(amounts(gpu=3), amounts(gpu=3)),
            {0: amounts(gpu=3), 1: amounts(gpu=3)},
            id="container scope: the second container spills to the second zone",
        ),
        pytest.param(
            "pod",
            guaranteed(amounts(gpu=3), amounts(gpu=3)),
            {0: amounts(gpu=4), 1: amounts(gpu=2)},
            id="pod scope: the same pod is one unit of width 2",
        ),
        pytest.param(
            "container",
            guaranteed(amounts(gpu=3, memory=8), amounts(gpu=3, memory=8)),
            {0: amounts(gpu=3, memory=8), 1: amounts(gpu=3, memory=8)},
            id="container scope: each container's widths agree",
        ),
        pytest.param(
            "pod",
            guaranteed(amounts(gpu=3, memory=8), amounts(gpu=3, memory=8)),
            None,
            id="pod scope: 6 GPUs need 2 zones but 16 GiB 1: refused",
        ),
        pytest.param(
            "container",
            guaranteed(amounts(gpu=4), init=[amounts(gpu=4)]),
            {0: amounts(gpu=4)},
            id="container scope: an ordinary init container is aligned alone, not summed",
        ),
        pytest.param(
            "container",
            guaranteed(amounts(gpu=1), init=[amounts(gpu=9)]),
            None,
            id="container scope: an init container larger than the node refuses the pod",
        ),
        pytest.param(
            "container",
            guaranteed(amounts(gpu=3), sidecars=[amounts(gpu=3)]),
            {0: amounts(gpu=3), 1: amounts(gpu=3)},
            id="container scope: a native sidecar shares the zones with the app container",
        ),
        pytest.param(
            "pod",
            guaranteed(amounts(gpu=2), init=[amounts(gpu=8)]),
            {0: amounts(gpu=4), 1: amounts(gpu=4)},
            id="pod scope: the unit is the init peak (8) when larger than the app (2)",
        ),
    ],
)
def test_the_scope_decides_what_is_aligned_as_one_unit(
    scope: TopologyScope, request_: NumaRequest, admitted: dict[int, dict[str, float]] | None
) -> None:
    """KAI's restricted scope-and-init table (2 zones of 4 GPUs, 8 CPUs, 16 GiB)."""
    assert placed(evaluate(topo("restricted", *SYMMETRIC, scope=scope), request_)) == admitted


@pytest.mark.parametrize(
    ("zones", "request_", "admitted"),
    [
        pytest.param(
            (zone(0, amounts(gpu=4), amounts(gpu=1)), zone(1, amounts(gpu=4))),
            amounts(gpu=3),
            {1: amounts(gpu=3)},
            id="width 1 lands on the second zone when the first is busy",
        ),
        pytest.param(
            (zone(0, amounts(gpu=4), amounts(gpu=1)), zone(1, amounts(gpu=4)), zone(2, amounts(gpu=4))),
            amounts(gpu=6),
            {1: amounts(gpu=4), 2: amounts(gpu=2)},
            id="width 2 skips the busy first zone",
        ),
        pytest.param(
            (zone(0, amounts(gpu=4), amounts(gpu=1)), zone(1, amounts(gpu=4), amounts(gpu=1))),
            amounts(gpu=2),
            None,
            id="free 1+1 where 2 fit one zone by allocatable: refused (the only mask is not the narrowest)",
        ),
        pytest.param(
            (zone(0, amounts(gpu=4)), zone(1, amounts(gpu=4))),
            amounts(cpu=2),
            {},
            id="a resource no zone reports is not aligned",
        ),
    ],
)
def test_restricted_counts_the_width_on_allocatable_and_the_fit_on_available(
    zones: tuple[NumaZone, ...], request_: dict[str, float], admitted: dict[int, dict[str, float]] | None
) -> None:
    node = NodeNuma(policy="restricted", scope="container", zones=zones)
    assert placed(evaluate(node, guaranteed(request_))) == admitted


@pytest.mark.parametrize(("gpus", "span"), [(1, 1), (2, 2), (4, 4), (5, 0)])
def test_best_effort_spans_the_fewest_zones_it_can(gpus: int, span: int) -> None:
    node = topo("best-effort", *(amounts(gpu=1) for _ in range(4)))
    assert evaluate(node, guaranteed(amounts(gpu=gpus))).span == span


def test_a_zone_that_does_not_say_what_is_free_has_all_of_its_allocatable_free() -> None:
    """A cluster file's zone without ``available`` (the simulated cluster has no exporter to say)."""
    node = NodeNuma(policy="single-numa-node", zones=(NumaZone(name="node-0", allocatable=amounts(gpu=2)),))
    assert placed(evaluate(node, guaranteed(amounts(gpu=2)))) == {0: amounts(gpu=2)}


def test_an_ignored_resource_is_not_aligned() -> None:
    """KAI's ignoreList: memory reported per zone that the kubelet does not align (Memory Manager off)."""
    node = topo("single-numa-node", amounts(gpu=2, memory=8), amounts(gpu=2, memory=8))
    request_ = guaranteed(amounts(gpu=2, memory=12))
    assert evaluate(node, request_).placement is None
    assert placed(evaluate(node, request_, frozenset({"memory"}))) == {0: amounts(gpu=2)}


# --- the plugin in a cycle ------------------------------------------------------------------------------
def numa_policy(*, ignore: str | None = None) -> Policy:
    base = Policy(actions=("allocate",))
    arguments: dict[str, Argument] = {} if ignore is None else {"ignoreList": ignore}
    return Policy(
        actions=("allocate",),
        plugins=(*plugin_configs(base, DEFAULT_REGISTRY), PluginConfig(name="numa", arguments=arguments)),
    )


def gpu_node(name: str, gpus: int, numa_: NodeNuma | None, cpus: int = 64) -> Node:
    return builders.node(name, gpus, cpu_millis=cpus * 1000, memory_bytes=512 * GI, numa=numa_)


def workload(
    name: str,
    gpus: int = 0,
    cpus: float = 1,
    *,
    request_: NumaRequest | None = None,
    node: str | None = None,
    status: PodStatus = PodStatus.PENDING,
    created: float = 0.0,
) -> tuple[PodGroup, Pod]:
    group = PodGroup(
        name=name,
        uid=name,
        queue="team",
        creation_time=created,
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", 1),)),
    )
    pod = Pod(
        name=name,
        uid=name,
        podgroup=name,
        status=status,
        node=node,
        cpu_millis=cpus * 1000,
        memory_bytes=GI,
        gpu=GpuRequest(devices=gpus),
        creation_time=created,
        numa=request_,
    )
    return group, pod


def cluster(nodes: Sequence[Node], *workloads: tuple[PodGroup, Pod]) -> Snapshot:
    """`workloads` (one pod each) on `nodes`, in queue `team` under `root`."""
    return builders.snapshot(
        nodes, *((group, [pod]) for group, pod in workloads), queues=team_queues(root="root")
    )


def run(
    nodes: Sequence[Node], *workloads: tuple[PodGroup, Pod], policy: Policy | None = None
) -> dict[str, str]:
    snapshot = cluster(nodes, *workloads)
    result = schedule(snapshot, NOW, policy or numa_policy())
    return {b.name: b.node for proposal in result.binds for b in proposal.bindings}


def pending_message(nodes: Sequence[Node], *workloads: tuple[PodGroup, Pod]) -> str:
    snapshot = cluster(nodes, *workloads)
    result = schedule(snapshot, NOW, numa_policy())
    return " ".join(p.message for p in result.pending)


SPLIT = topo("single-numa-node", amounts(gpu=1, cpu=32), amounts(gpu=1, cpu=32))
"""Two GPUs, one on each NUMA node."""
TOGETHER = topo("single-numa-node", amounts(gpu=2, cpu=32), amounts(gpu=0, cpu=32))
"""Two GPUs on the first NUMA node."""
TWO_GPUS = guaranteed(amounts(gpu=2, cpu=4))


def test_a_guaranteed_two_gpu_pod_goes_where_one_numa_node_has_both_gpus() -> None:
    nodes = [gpu_node("a-split", 2, SPLIT), gpu_node("b-together", 2, TOGETHER)]
    assert run(nodes, workload("train", 2, 4, request_=TWO_GPUS)) == {"train": "b-together"}


def test_without_the_plugin_the_same_pod_takes_the_first_node_the_kubelet_would_refuse() -> None:
    nodes = [gpu_node("a-split", 2, SPLIT), gpu_node("b-together", 2, TOGETHER)]
    assert run(nodes, workload("train", 2, 4, request_=TWO_GPUS), policy=Policy(actions=("allocate",))) == {
        "train": "a-split"
    }


def test_a_pod_no_node_can_align_stays_pending_and_says_why() -> None:
    message = pending_message([gpu_node("a-split", 2, SPLIT)], workload("train", 2, 4, request_=TWO_GPUS))
    assert f"1 {numa.NOT_ONE_ZONE}: no NUMA node has enough {GPU} free" in message


@pytest.mark.parametrize(
    ("what", "pod", "nodes"),
    [
        pytest.param(
            "a pod with nothing to align",
            workload("web", 2, 4),
            [gpu_node("a-split", 2, SPLIT)],
            id="no NUMA request",
        ),
        pytest.param(
            "a node without zones",
            workload("train", 2, 4, request_=TWO_GPUS),
            [gpu_node("plain", 2, None)],
            id="no NodeResourceTopology",
        ),
        pytest.param(
            "a best-effort node",
            workload("train", 2, 4, request_=TWO_GPUS),
            [gpu_node("loose", 2, topo("best-effort", amounts(gpu=1), amounts(gpu=1)))],
            id="best-effort",
        ),
        pytest.param(
            "a none node",
            workload("train", 2, 4, request_=TWO_GPUS),
            [gpu_node("loose", 2, topo("none", amounts(gpu=1), amounts(gpu=1)))],
            id="none",
        ),
    ],
)
def test_the_plugin_lets_pass_what_the_kubelet_would_not_refuse(
    what: str, pod: tuple[PodGroup, Pod], nodes: list[Node]
) -> None:
    assert run(nodes, pod) == {pod[1].name: nodes[0].name}, what


def test_pods_placed_in_one_cycle_share_the_zones() -> None:
    """KAI's in-cycle example: two 4-CPU zones, Guaranteed pods of 3, 3 and 2 CPUs; the node has room for
    all three, but after the two 3-CPU pods each zone has 1 CPU left, so only two are bound."""
    node = gpu_node("n", 0, topo("single-numa-node", amounts(cpu=4), amounts(cpu=4)), cpus=8)
    pods = [
        workload(name, 0, cpus, request_=guaranteed(amounts(cpu=cpus)), created=i)
        for i, (name, cpus) in enumerate((("first", 3), ("second", 3), ("third", 2)))
    ]
    assert run([node], *pods) == {"first": "n", "second": "n"}


@pytest.mark.parametrize(
    ("status", "available", "third_bound"),
    [
        pytest.param(
            PodStatus.BOUND, amounts(cpu=4), False, id="bound, not running: charged (no exporter has it yet)"
        ),
        pytest.param(PodStatus.RUNNING, amounts(cpu=4), True, id="running: available already counts it"),
    ],
)
def test_a_pod_bound_but_not_yet_running_is_charged_to_its_zone(
    status: PodStatus, available: dict[str, float], third_bound: bool
) -> None:
    zones = (zone(0, amounts(cpu=4), available), zone(1, amounts(cpu=4)))
    node = gpu_node("n", 0, NodeNuma(policy="single-numa-node", zones=zones), cpus=8)
    earlier = workload("earlier", 0, 3, request_=guaranteed(amounts(cpu=3)), node="n", status=status)
    second = workload("second", 0, 3, request_=guaranteed(amounts(cpu=3)), created=1)
    third = workload("third", 0, 2, request_=guaranteed(amounts(cpu=2)), created=2)
    bound = run([node], earlier, second, third)
    assert ("third" in bound) is third_bound
    assert bound.get("second") == "n"


def test_restricted_binds_a_full_node_pod_across_its_numa_nodes() -> None:
    node = gpu_node("full", 8, topo("restricted", amounts(gpu=4, cpu=16), amounts(gpu=4, cpu=16)), cpus=32)
    assert run([node], workload("big", 8, 24, request_=guaranteed(amounts(gpu=8, cpu=24)))) == {"big": "full"}
    assert run([node], workload("big", 8, 1, request_=guaranteed(amounts(gpu=8, cpu=1)))) == {}


def test_the_ignore_list_argument_reaches_the_filter() -> None:
    node = gpu_node("n", 2, topo("single-numa-node", amounts(gpu=2, memory=8), amounts(gpu=0, memory=8)))
    pod = workload("train", 2, 0, request_=guaranteed(amounts(gpu=2, memory=12)))
    assert run([node], pod) == {}
    assert run([node], pod, policy=numa_policy(ignore="memory, ")) == {"train": "n"}


# --- the score --------------------------------------------------------------------------------------------
def test_the_score_prefers_the_node_where_the_pod_spans_the_fewest_numa_nodes() -> None:
    """KAI's score tiers: 100 / span; a node without zones counts as the cluster's widest, a none node as
    all its zones, a node that would refuse the pod 0."""
    nodes = [
        gpu_node("aligned", 8, topo("single-numa-node", amounts(gpu=4, cpu=16), amounts(gpu=4, cpu=16))),
        gpu_node("span2", 2, topo("restricted", amounts(gpu=1), amounts(gpu=1))),
        gpu_node("none4", 4, topo("none", *(amounts(gpu=1) for _ in range(4)))),
        gpu_node("no-nrt", 8, None),
        gpu_node("refuses", 2, topo("single-numa-node", amounts(gpu=1), amounts(gpu=1))),
    ]
    group, pod = workload("p", 2, 0, request_=guaranteed(amounts(gpu=2)))
    queues = (Queue(name="root"), Queue(name="team", parent="root"))
    ssn = open_session(
        Snapshot(nodes=tuple(nodes), pods=(pod,), podgroups=(group,), queues=queues), NOW, numa_policy()
    )
    task = ssn.tasks[pod.key]
    got = numa.scores(ssn.cluster, task, np.ones(len(nodes), dtype=bool))
    assert got is not None
    by_name = dict(zip([n.name for n in ssn.cluster.order], got.tolist(), strict=True))
    assert by_name == {"aligned": 100.0, "span2": 50.0, "none4": 25.0, "no-nrt": 25.0, "refuses": 0.0}


# --- configuration --------------------------------------------------------------------------------------
def test_the_plugin_is_off_unless_a_plugin_list_names_it() -> None:
    assert "numa" not in resolve(Policy(), DEFAULT_REGISTRY).names
    assert "numa" in resolve(numa_policy(), DEFAULT_REGISTRY).names


@pytest.mark.parametrize("value", [3, True])
def test_an_ignore_list_that_is_not_text_is_refused_naming_the_argument(value: int | bool) -> None:
    policy = Policy(plugins=(PluginConfig(name="numa", arguments={"ignoreList": value}),))
    with pytest.raises(PluginConfigError, match="plugin 'numa', argument 'ignoreList'"):
        resolve(policy, DEFAULT_REGISTRY)
