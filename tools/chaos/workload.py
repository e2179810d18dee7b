"""The chaos suite's load: queues, PodGroups and pods as the Kubernetes manifests a user would apply.

`build(pods, seed)` returns them in waves (the runner applies one wave before each fault, so every fault
meets pending work) and the number of simulated nodes that holds them with room to spare. The shapes
cover what the checker judges: single whole-GPU pods, gangs of whole-GPU pods, GPU-sharing pods (half a
device), a queue with a GPU limit below its demand (some of its pods must wait, with a reason), and a few
pods too big for any node (unschedulable, with a reason). Pure: no I/O.
"""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec

from tools.kubesim.nodesim import RUN_SECONDS

__all__ = [
    "MEAN_GPUS",
    "NAMESPACE",
    "QUEUES",
    "Group",
    "Workload",
    "build",
    "churn_group",
    "may_stay_pending",
]

Obj = dict[str, Any]
NAMESPACE = "default"
GPUS_PER_NODE = 8
LIMITED_QUEUE = "chaos-limited"
LIMITED_GPUS = 4
"""The GPU limit of `LIMITED_QUEUE`: its groups ask for more, so some stay pending for the limit."""
LIMITED_EVERY = 23
"""One podgroup in this many goes to `LIMITED_QUEUE` (a hundred at 5,000 pods: held back by the limit)."""
TOO_BIG_EVERY = 97
"""One podgroup in this many asks for more GPUs than a node has (pending with a reason for good). Both kinds
stay pending and are dispatched again and again: at 5,000 pods they once stalled every other podgroup
(the first full run; docs/chaos.md), so the load keeps them at that share."""


class Group(msgspec.Struct, frozen=True):
    """One PodGroup and its pods (manifests), created pods first."""

    podgroup: Obj
    pods: tuple[Obj, ...]


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    queues: tuple[Obj, ...]
    waves: tuple[tuple[Group, ...], ...]
    nodes: int

    @property
    def pod_keys(self) -> list[str]:
        return [f"{NAMESPACE}/{p['metadata']['name']}" for wave in self.waves for g in wave for p in g.pods]

    @property
    def must_bind(self) -> set[str]:
        """The names of the pods a correct scheduler binds (`may_stay_pending` says which others may wait)."""
        return {
            p["metadata"]["name"]
            for wave in self.waves
            for g in wave
            for p in g.pods
            if not may_stay_pending(p)
        }


def may_stay_pending(pod: Obj) -> bool:
    """Whether a pod of this load may rightly stay pending for good: too big for any node, or in the limited
    queue (held back by its limit while others of the queue run). Every other pod fits: the load's nodes
    hold its demand with room to spare."""
    labels = pod["metadata"].get("labels") or {}
    limits = pod["spec"]["containers"][0].get("resources", {}).get("limits") or {}
    return (
        labels.get("kai.scheduler/queue") == LIMITED_QUEUE
        or int(limits.get("nvidia.com/gpu", 0)) > GPUS_PER_NODE
    )


def _queue(name: str, parent: str = "", gpu_limit: int = -1) -> Obj:
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    spec: Obj = {
        "resources": {
            "gpu": {"quota": -1, "limit": gpu_limit, "overQuotaWeight": 1},
            "cpu": unlimited,
            "memory": unlimited,
        }
    }
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _pod(
    name: str, group: str, queue: str, *, gpus: int = 0, fraction: str | None = None, run_seconds: int = 0
) -> Obj:
    annotations = {"pod-group-name": group}
    labels = {"kai.scheduler/queue": queue}
    if run_seconds:
        labels[RUN_SECONDS] = str(run_seconds)
    resources: Obj = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if fraction is not None:
        annotations["gpu-fraction"] = fraction
    elif gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "main", "image": "chaos", "resources": resources}],
        },
    }


def _group(index: int, shape: str, queue: str, run_seconds: int = 0) -> tuple[Group, float]:
    """The group of `shape` (and the GPUs it asks for); with `run_seconds` its pods succeed that long after
    they start."""
    name = f"chaos-{index:05d}"
    if shape == "gang4":
        count, gpus, fraction = 4, 1, None
    elif shape == "gang2x2":
        count, gpus, fraction = 2, 2, None
    elif shape == "shared":
        count, gpus, fraction = 1, 0, "0.5"
    elif shape == "too-big":
        count, gpus, fraction = 1, GPUS_PER_NODE * 2, None
    else:
        count, gpus, fraction = 1, 1, None
    pods = tuple(
        _pod(f"{name}-{i}", name, queue, gpus=gpus, fraction=fraction, run_seconds=run_seconds)
        for i in range(count)
    )
    podgroup = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minMember": count, "queue": queue},
    }
    demand = count * (0.5 if fraction else gpus)
    return Group(podgroup, pods), 0.0 if shape == "too-big" else demand


QUEUES = (
    _queue("chaos"),
    _queue("chaos-a", parent="chaos"),
    _queue("chaos-b", parent="chaos"),
    _queue(LIMITED_QUEUE, parent="chaos", gpu_limit=LIMITED_GPUS),
)


def _shape(index: int, rng: random.Random) -> tuple[str, str]:
    """The shape and queue of the `index`-th group: mostly a random mix, with the limited queue and the
    too-big pods at their fixed shares."""
    if index % TOO_BIG_EVERY == TOO_BIG_EVERY - 1:
        return "too-big", "chaos-a"
    if index % LIMITED_EVERY == LIMITED_EVERY // 2:
        return "single", LIMITED_QUEUE
    return rng.choice(SHAPES), rng.choice(("chaos-a", "chaos-b"))


SHAPES = ("single", "single", "gang4", "gang2x2", "shared", "shared")
MEAN_GPUS = (1 + 1 + 4 + 4 + 0.5 + 0.5) / len(SHAPES)
"""The GPUs a group of the random mix asks for, on average."""


def churn_group(index: int, rng: random.Random, run_seconds: tuple[int, int]) -> Group:
    """The soak's `index`-th group: the same mix as `build`, each pod running a time drawn from
    `run_seconds` (inclusive) and then succeeding."""
    shape, queue = _shape(index, rng)
    group, _ = _group(index, shape, queue, run_seconds=rng.randint(*run_seconds))
    return group


def build(pods: int, waves: int, seed: int = 7) -> Workload:
    """About `pods` pods in `waves` waves (the first holds a third, so work is pending from the start)."""
    rng = random.Random(seed)
    queues = QUEUES
    groups: list[Group] = []
    demand = 0.0
    made = 0
    index = 0
    while made < pods:
        shape, queue = _shape(index, rng)
        group, gpus = _group(index, shape, queue)
        groups.append(group)
        demand += gpus
        made += len(group.pods)
        index += 1
    first = max(1, len(groups) // 3)
    rest = groups[first:]
    size = math.ceil(len(rest) / max(1, waves - 1)) if rest else 1
    split = [tuple(groups[:first])] + [tuple(rest[i : i + size]) for i in range(0, len(rest), size)]
    # A quarter more GPUs than asked: gangs and shared devices leave holes, and nothing should wait for room.
    nodes = max(4, math.ceil(demand * 1.25 / GPUS_PER_NODE))
    return Workload(queues=queues, waves=tuple(split), nodes=nodes)
