"""MixedWorkloads: the workloads an AI cluster runs side by side (Kubeflow PyTorchJobs, gang batch Jobs,
RayClusters, LeaderWorkerSets: four one-GPU pods each), created as their owners, grouped by KAI's rules.

Over the bus only each group's owner is created; kubesim's operator makes its pods and the state service's
pod-grouper their PodGroup, so the measurement includes the grouping (the other workloads create their
pods already grouped, which costs the pod-grouper nothing). In process there is no operator and no
pod-grouper: `mixed_workloads` runs both here, once, while it builds the workload: the owner goes into an
in-memory simulated cluster (`tools.kubesim.cluster.Cluster`, the same operators), and each pod it makes is
grouped by `services.state.controllers.grouping.group_pod` with the owner chain and reads answered from that cluster,
then translated into the model like the state service translates it. The core then schedules exactly the
podgroups (sub-groups included) the stack would see.

Called through `tools.bench.workloads.build`. The simulated cluster's clock stands still; uids and the
random suffixes of pod names differ from run to run, the shapes do not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from services.state.controllers.grouping import group_pod
from services.state.controllers.grouping.model import ObjectRead, PodsRead, Read, ReadsNeeded
from shared.kube import keys, translate, wire
from shared.kubeapi.paths import plural_of
from shared.model.builders import flat_queues
from tools.bench.manifests import NAMESPACE
from tools.bench.workload import Group, Workload, owner_of_pod, plain_nodes
from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import KAI_PRIORITY_CLASSES, Cluster, SimOptions

__all__ = ["MIXED_KINDS", "OwnerKind", "mixed_workloads"]

Obj = dict[str, Any]

MAX_READ_ROUNDS = 8


class OwnerKind(NamedTuple):
    """One kind of workload in the mix: how to write an owner of it (`build(name, queue)`, a manifest as
    its users write one) and where its objects are kept in the simulated cluster."""

    short: str
    """The kind in the owner's name, ``mix-<short>-<n>``."""
    group: str
    version: str
    kind: str
    build: Callable[[str, str], Obj]


def _container(name: str) -> Obj:
    return {
        "name": name,
        "image": "bench",
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {keys.NVIDIA_GPU: "1"},
        },
    }


def _template(container: str, labels: Mapping[str, str] | None = None) -> Obj:
    return {
        "metadata": {"labels": dict(labels or {})},
        "spec": {"schedulerName": keys.SCHEDULER_NAME, "containers": [_container(container)]},
    }


def _meta(name: str, queue: str, annotations: Mapping[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": NAMESPACE, "labels": {keys.QUEUE_LABEL: queue}}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def pytorch_job(name: str, queue: str) -> Obj:
    """A PyTorchJob of one master and three workers, a GPU each (KAI: one gang of 4, two sub-groups)."""
    replica = {"restartPolicy": "OnFailure", "template": _template("pytorch")}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(name, queue),
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {**replica, "replicas": 1},
                "Worker": {**replica, "replicas": 3},
            }
        },
    }


def batch_job(name: str, queue: str) -> Obj:
    """A Job of four parallel one-GPU pods that asks to start together (``kai.scheduler/batch-min-member``)."""
    template = _template("work")
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(name, queue, {keys.BATCH_MIN_MEMBER_ANNOTATION: "4"}),
        "spec": {"parallelism": 4, "completions": 4, "template": template},
    }


def ray_cluster(name: str, queue: str) -> Obj:
    """A RayCluster of a head and three workers, a GPU each (KAI: one gang of 4, head and worker sub-groups)."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _meta(name, queue),
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": _template("ray-head")},
            "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 3, "rayStartParams": {}, "template": _template("ray-worker")}
            ],
        },
    }


def leader_worker_set(name: str, queue: str) -> Obj:
    """A LeaderWorkerSet of one group, a leader and three workers, a GPU each (KAI: one gang of 4 per
    group, leader and workers sub-groups)."""
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta(name, queue),
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 4, "workerTemplate": _template("worker")}},
    }


MIXED_KINDS: tuple[OwnerKind, ...] = (
    OwnerKind("pytorch", "kubeflow.org", "v1", "PyTorchJob", pytorch_job),
    OwnerKind("job", "batch", "v1", "Job", batch_job),
    OwnerKind("ray", "ray.io", "v1", "RayCluster", ray_cluster),
    OwnerKind("lws", "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", leader_worker_set),
)
"""The kinds in the mix, in the order their owners are created (round robin)."""


def _storage(api_version: str, kind: str) -> str:
    group, _, _ = api_version.rpartition("/")
    plural = plural_of(kind)
    return f"{group}/{plural}" if group else plural


class _Grouper:
    """The pod-grouper's decision for pods of an in-memory simulated cluster: their owner chains and the
    plugins' reads answered from it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.classes = frozenset(name for name, _, _ in KAI_PRIORITY_CLASSES)

    def chain(self, pod: Obj) -> list[wire.Owner]:
        owners: list[wire.Owner] = []
        obj = pod
        while refs := obj["metadata"].get("ownerReferences"):
            ref = refs[0]
            found = self.cluster.find(_storage(ref["apiVersion"], ref["kind"]), NAMESPACE, ref["name"])
            if found is None:
                break
            owners.append(wire.convert(wire.Owner, found))
            obj = found
        return owners

    def answer(self, read: Read) -> Any:
        if isinstance(read, ObjectRead):
            return self.cluster.find(_storage(read.api_version, read.kind), read.namespace, read.name)
        assert isinstance(read, PodsRead)
        return [
            wire.convert(wire.Pod, p)
            for p in self.cluster.objects("pods", read.namespace)
            if all(p["metadata"].get("labels", {}).get(k) == v for k, v in read.selector)
        ]

    def group(self, pod: Obj) -> tuple[Obj, wire.Pod]:
        """The PodGroup manifest for `pod` and the pod as it is once the pod-grouper patched it."""
        decoded = wire.convert(wire.Pod, pod)
        chain = self.chain(pod)
        reads: dict[Read, Any] = {}
        for _ in range(MAX_READ_ROUNDS):
            try:
                grouping = group_pod(decoded, chain, priority_classes=self.classes, reads=reads)
                break
            except ReadsNeeded as needed:
                reads.update((read, self.answer(read)) for read in needed.reads)
        else:
            raise RuntimeError(f"the grouping of {pod['metadata']['name']} kept asking for reads")
        if grouping is None:
            raise RuntimeError(f"the pod-grouper left {pod['metadata']['name']} alone")
        patch = grouping.pod_patch["metadata"]
        meta = pod["metadata"]
        patched = {
            **pod,
            "metadata": {
                **meta,
                "annotations": {**meta.get("annotations", {}), **patch.get("annotations", {})},
                "labels": {**meta.get("labels", {}), **patch.get("labels", {})},
            },
        }
        return grouping.podgroup, wire.convert(wire.Pod, patched)


def mixed_workloads(
    nodes: int,
    groups: int,
    queues: int = 10,
    kinds: tuple[OwnerKind, ...] = MIXED_KINDS,
    *,
    pregrouped: bool = False,
) -> Workload:
    """`groups` owners of `kinds` in turn over `queues` flat queues, on `nodes` plain 8-GPU nodes.

    `pregrouped` (MixedWorkloadsPregrouped) keeps the same pods and podgroups but drops the owners, so over
    the bus they are created already grouped, as the other workloads' are: the difference between the two
    runs' state-service CPU per pod is what grouping costs."""
    cluster = build_cluster(SimOptions(seed=1), clock=lambda: 0.0)
    grouper = _Grouper(cluster)
    priorities = {name: value for name, value, _ in KAI_PRIORITY_CLASSES}
    names = [f"q{i}" for i in range(queues)]
    out: list[Group] = []
    for i in range(groups):
        kind = kinds[i % len(kinds)]
        owner = kind.build(f"mix-{kind.short}-{i:05d}", names[i % len(names)])
        name = owner["metadata"]["name"]
        plural = plural_of(kind.kind)
        cluster.create(cluster.lookup(kind.group, kind.version, plural), NAMESPACE, owner)
        cluster.settle()
        made = [p for p in cluster.objects("pods", NAMESPACE) if owner_of_pod(p["metadata"]["name"]) == name]
        if not made:
            raise RuntimeError(f"the simulated operator made no pod for {kind.kind} {name}")
        manifests = [grouper.group(p) for p in made]
        podgroup_names = {m["metadata"]["name"] for m, _ in manifests}
        if len(podgroup_names) != 1:
            raise RuntimeError(
                f"{kind.kind} {name} is grouped into {sorted(podgroup_names)}, not one PodGroup"
            )
        podgroup = translate.podgroup_of(
            wire.convert(wire.PodGroup, manifests[-1][0]), priority_classes=priorities, creation_time=float(i)
        )
        pods = tuple(translate.pod_of(pod, podgroup=podgroup.key) for _, pod in manifests)
        out.append(Group(podgroup, pods, owner=None if pregrouped else owner))
    return Workload(
        name="MixedWorkloadsPregrouped" if pregrouped else "MixedWorkloads",
        nodes=tuple(plain_nodes(nodes)),
        queues=tuple(flat_queues(names)),
        measured=tuple(out),
    )
