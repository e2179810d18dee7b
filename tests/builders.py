"""One set of builders for tests: model objects (nodes, queues, pods, podgroups, workloads, snapshots), the
Kubernetes manifests tests send to kubesim (pods, nodes, queues, podgroups, claims, storage classes), and
those manifests as the API server stores and returns them (`stored`: uid, resourceVersion,
creationTimestamp, status).

Each builder takes the fields a spec cares about and gives the rest a plain default, said in its
docstring; any other field of the object is a keyword argument. Gangs, GPU nodes in bulk and flat queue
trees come from `shared.model.builders` (re-exported here), so a test imports everything from one place:

    snap = snapshot([node("a", gpus=4)], gang("train", "team", 2), queues=team_queues())
    manifest = pod_manifest("p", node="n1", labels={"app": "web"})
    doc = stored(pod_manifest("p", node="n1"), status={"phase": "Running"})
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from shared.core.cycle import result_of, run_session
from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.core.session import Session
from shared.model import Node, Pod, PodGroup, PodSet, PodStatus, Queue, QueueResource, Snapshot, SubGroupSet
from shared.model.builders import (
    GIB,
    ZONE,
    busy_and_idle,
    flat_queues,
    gang,
    gpu_nodes,
    random_workload,
    with_spread,
    zoned_nodes,
)
from tools.bench.report import Record
from tools.sim.simulator import Simulator

__all__ = [
    "CREATED",
    "CREATED_AT",
    "GIB",
    "HOSTNAME",
    "READY",
    "UNBOUNDED",
    "ZONE",
    "Workload",
    "busy_and_idle",
    "claim_manifest",
    "flat_queues",
    "gang",
    "gpu_nodes",
    "node",
    "node_manifest",
    "owner_reference",
    "placed",
    "pod",
    "pod_manifest",
    "podgroup",
    "podgroup_manifest",
    "queue",
    "queue_manifest",
    "random_workload",
    "root_queue",
    "shard_manifest",
    "snapshot",
    "storage_class_manifest",
    "stored",
    "team_queues",
    "with_spread",
    "zoned_nodes",
]

HOSTNAME = "kubernetes.io/hostname"
"""Kubernetes' well-known hostname label."""

UNBOUNDED = QueueResource(quota=-1, over_quota_weight=1, limit=-1)
"""A queue resource with no quota and no limit, weight 1: what a test's queues get where it does not care."""

Workload = tuple[PodGroup, list[Pod]]
"""A podgroup and its pods, as `gang` makes them."""


# --- model objects --------------------------------------------------------------------------------------------
def node(name: str, gpus: int = 8, **fields: Any) -> Node:
    """A node with `gpus` 80,000 MiB devices, 64 cores and 512e9 bytes of memory; `fields` set any other
    field of `Node` (``labels=``, ``taints=``, ``scalars=``, ``cpu_millis=``...)."""
    return Node(
        name=name,
        **{"cpu_millis": 64_000, "memory_bytes": 512e9, "gpus": gpus, "gpu_memory_mib": 80_000, **fields},
    )


def queue(
    name: str,
    gpu_quota: float = -1,
    weight: float = 1.0,
    *,
    parent: str | None = "dept",
    limit: float = -1,
    **fields: Any,
) -> Queue:
    """A queue under `parent` (the root `dept` by default) whose GPUs have deserved quota `gpu_quota`,
    over-quota weight `weight` and `limit` (-1: unlimited, the default for both); CPU and memory
    `UNBOUNDED`; `fields` set any other field of `Queue` (``creation_index=``, ``labels=``...)."""
    return Queue(
        name=name,
        parent=parent,
        gpu=QueueResource(quota=gpu_quota, over_quota_weight=weight, limit=limit),
        **{"cpu": UNBOUNDED, "memory": UNBOUNDED, **fields},
    )


def root_queue(name: str = "dept") -> Queue:
    """A top-level queue with every resource `UNBOUNDED`."""
    return Queue(name=name, gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED)


def team_queues(team: str = "team", root: str = "dept") -> tuple[Queue, ...]:
    """The root queue `root` and one child `team`, every resource of both `UNBOUNDED`."""
    return root_queue(root), queue(team, parent=root)


def pod(name: str = "p", podgroup: str = "pg", **fields: Any) -> Pod:
    """A pending pod of `podgroup` that asks for nothing; `fields` set any other field of `Pod`
    (``namespace=``, ``status=``, ``node=``, ``gpu=``...)."""
    return Pod(name=name, podgroup=podgroup, **fields)


def podgroup(name: str = "pg", queue_name: str = "team", min_member: int = 1, **fields: Any) -> PodGroup:
    """A podgroup in `queue_name` whose one pod set, ``default``, needs `min_member` pods together; `fields`
    set any other field of `PodGroup` (``namespace=``, ``uid=``, ``labels=``, ``priority=``...)."""
    root = SubGroupSet(name="root", pod_sets=(PodSet(name="default", min_available=min_member),))
    return PodGroup(name=name, queue=queue_name, root=root, **fields)


def placed(
    name: str,
    queue_name: str,
    nodes: Sequence[str],
    gpus: float = 1.0,
    *,
    started: float = 0.0,
    status: PodStatus = PodStatus.RUNNING,
    **kw: Any,
) -> Workload:
    """A `gang` of one pod per name in `nodes`, each on its node in `status` (running by default), the
    podgroup last started at `started`; `kw` as for `gang`."""
    pg, pods = gang(name, queue_name, len(nodes), gpus, status=status, nodes=list(nodes), **kw)
    return msgspec.structs.replace(pg, last_start_time=started), pods


def snapshot(
    nodes: Iterable[Node] = (),
    *workloads: Workload,
    queues: Iterable[Queue] | None = None,
    **objects: Any,
) -> Snapshot:
    """`workloads` (each a podgroup and its pods) on `nodes`, in `queues` (`team_queues()` when None), with
    the snapshot's other objects by name (``volumes=``, ``topologies=``, ``dra=``...)."""
    return Snapshot(
        nodes=tuple(nodes),
        pods=tuple(p for _, pods in workloads for p in pods),
        podgroups=tuple(pg for pg, _ in workloads),
        queues=team_queues() if queues is None else tuple(queues),
        **objects,
    )


# --- Kubernetes manifests -------------------------------------------------------------------------------------
Obj = dict[str, Any]


def pod_manifest(
    name: str,
    namespace: str = "default",
    *,
    node: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    owners: Sequence[Mapping[str, Any]] = (),
    scheduler: str = "kai-scheduler",
    image: str = "x",
    **spec: Any,
) -> Obj:
    """A v1 Pod for `scheduler` with one container `main` of `image` asking for `requests` and limited to
    `limits` (none by default), owned by `owners` (owner references), bound to `node` when given; `spec`
    adds fields of its spec (``volumes=``, ``resourceClaims=``...). Labels, annotations, requests, limits
    and owners are left out when not given."""
    container: Obj = {"name": "main", "image": image}
    resources = {"requests": dict(requests or {}), "limits": dict(limits or {})}
    if any(resources.values()):
        container["resources"] = {kind: values for kind, values in resources.items() if values}
    metadata: Obj = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owners:
        metadata["ownerReferences"] = [dict(owner) for owner in owners]
    body: Obj = {"schedulerName": scheduler, "containers": [container], **spec}
    if node:
        body["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def owner_reference(owner: Mapping[str, Any]) -> Obj:
    """The reference that makes the object `owner` (a manifest with its uid) the controller of a pod."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def node_manifest(
    name: str,
    gpus: int = 8,
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """A v1 Node whose capacity and allocatable are `cpu`, `memory`, `gpus` nvidia.com/gpu and `pods`,
    labelled with its hostname and `labels`."""
    resources = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {HOSTNAME: name, **(labels or {})}},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def queue_manifest(
    name: str,
    parent: str = "",
    *,
    gpu_quota: float = -1,
    gpu_limit: float = -1,
    weight: float | None = None,
    resources: Mapping[str, Any] | None = None,
    **spec: Any,
) -> Obj:
    """A scheduling.run.ai/v2 Queue under `parent` (none: a top-level queue) that sets only its GPUs:
    `gpu_quota` and `gpu_limit` (-1: unlimited, the default), and an over-quota `weight` when given; or,
    when given, `resources` as its spec's resources, whole; `spec` adds fields of its spec (``priority=``,
    ``preemptMinRuntime=``...)."""
    gpu: Obj = {"quota": gpu_quota, "limit": gpu_limit}
    if weight is not None:
        gpu["overQuotaWeight"] = weight
    body: Obj = {"resources": {"gpu": gpu} if resources is None else dict(resources)}
    if parent:
        body["parentQueue"] = parent
    body.update(spec)
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": body}


def podgroup_manifest(
    name: str,
    min_member: int | None = 1,
    queue_name: str = "team",
    namespace: str = "default",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    **spec: Any,
) -> Obj:
    """A scheduling.run.ai/v2alpha2 PodGroup in `queue_name` asking for `min_member` pods together (None
    leaves minMember out); `spec` adds fields of its spec (``priorityClassName=``, ``subGroups=``...).
    Labels and annotations are left out when not given."""
    metadata: Obj = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    body: Obj = {"queue": queue_name}
    if min_member is not None:
        body["minMember"] = min_member
    body.update(spec)
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": body,
    }


def shard_manifest(name: str = "default", /, **spec: Any) -> Obj:
    """A kai.scheduler/v1 SchedulingShard `name` whose spec is `spec` (KAI's field names:
    ``partitionLabelValue=``, ``placementStrategy=``, ``args=``...); an empty spec when none is given."""
    return {
        "apiVersion": "kai.scheduler/v1",
        "kind": "SchedulingShard",
        "metadata": {"name": name},
        "spec": spec,
    }


def claim_manifest(
    name: str,
    storage_class: str | None = None,
    namespace: str = "default",
    *,
    size: str = "1Gi",
    modes: Sequence[str] = ("ReadWriteOnce",),
    **spec: Any,
) -> Obj:
    """A v1 PersistentVolumeClaim of `size` in `modes` (ReadWriteOnce), of `storage_class` when given
    (else the cluster's default class); `spec` adds fields of its spec."""
    body: Obj = {"accessModes": list(modes), "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        body["storageClassName"] = storage_class
    body.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def storage_class_manifest(
    name: str,
    provisioner: str,
    *,
    wait: bool = True,
    parameters: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    **metadata: Any,
) -> Obj:
    """A storage.k8s.io/v1 StorageClass of `provisioner` that binds on the first consumer (`wait`, the
    default) or at once; `parameters` and `annotations` left out when None; `metadata` adds fields of
    its metadata (``creationTimestamp=``)."""
    meta: Obj = {"name": name, **metadata}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    obj: Obj = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": meta,
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer" if wait else "Immediate",
    }
    if parameters is not None:
        obj["parameters"] = dict(parameters)
    return obj


# --- objects as the API server stores them ---------------------------------------------------------------------
READY = {"type": "Ready", "status": "True"}
"""A node's Ready condition, as its kubelet reports it: ``stored(node_manifest(...), status={"conditions":
[READY]})``."""

CREATED = "2026-01-01T00:00:00Z"
"""The creationTimestamp `stored` gives an object."""

CREATED_AT = 1_767_225_600.0
"""`CREATED` in seconds since the epoch, as the model reads it."""


def stored(
    manifest: Mapping[str, Any],
    *,
    uid: str | None = "uid-{name}",
    resource_version: str | None = "1",
    created: str | None = CREATED,
    status: Mapping[str, Any] | None = None,
    **metadata: Any,
) -> Obj:
    """`manifest` as the API server returns it: a copy whose metadata gets `uid` (a template of the
    object's ``name``, ``namespace`` and lower-case ``kind``: ``uid-{name}`` by default), `resource_version`
    and `created` (None leaves each out) and `metadata`'s fields (``deletionTimestamp=``, ``finalizers=``...),
    and whose status gets `status`'s fields; a pod's phase is Pending unless given.

        stored(pod_manifest("p", node="n1"), status={"phase": "Running"})
        stored(podgroup_manifest("pg"), uid="uid-pg-{name}", created=None)
    """
    obj: Obj = copy.deepcopy(dict(manifest))
    meta: Obj = obj.setdefault("metadata", {})
    fields = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "kind": obj["kind"].lower(),
    }
    given = {"uid": uid, "resourceVersion": resource_version, "creationTimestamp": created}
    for key, value in given.items():
        if value is not None:
            meta[key] = value.format(**fields) if key == "uid" else value
    meta.update(metadata)
    if obj["kind"] == "Pod" or status is not None:
        obj["status"] = {**({"phase": "Pending"} if obj["kind"] == "Pod" else {}), **obj.get("status", {})}
        obj["status"].update(status or {})
    return obj


def pinned(workload: Workload, node_name: str) -> Workload:
    """`workload` with every pod able to run on `node_name` alone (a hostname node selector)."""
    pg, pods = workload
    return pg, [msgspec.structs.replace(p, node_selector={HOSTNAME: node_name}) for p in pods]


# --- random clusters for the core's properties ----------------------------------------------------------
def random_nodes(rng: random.Random, n_nodes: int) -> list[Node]:
    """`n_nodes` nodes of random CPU, memory, GPUs and pod capacity, drawn from `rng`."""
    return [
        Node(
            name=f"n{i}",
            cpu_millis=float(rng.choice([8000, 16000, 64000])),
            memory_bytes=float(rng.choice([32, 64, 256])) * 2**30,
            gpus=rng.choice([0, 2, 4, 8]),
            gpu_memory_mib=40_000,
            max_pods=rng.choice([4, 16, 110]),
        )
        for i in range(n_nodes)
    ]


def random_queues(rng: random.Random, n: int) -> list[Queue]:
    """A root and `n` queues under it of random quota, limit and priority, drawn from `rng`."""
    out = [root_queue("root")]
    for i in range(n):
        limit = rng.choice([-1.0, -1.0, 4.0, 8.0])
        priority = rng.choice([100, 100, 200])
        quota = float(rng.choice([0, 2, 4, 8]))
        out.append(queue(f"q{i}", quota, parent="root", limit=limit, creation_index=i, priority=priority))
    return out


def random_simulator(seed: int, n_nodes: int, n_jobs: int) -> Simulator:
    """A simulated cluster of `n_nodes` random nodes and one to three random queues under a root, with `n_jobs`
    random gangs submitted (sizes, GPUs, priorities, some finishing after 120 s), the same for a `seed`: the
    core's properties run cycles on it."""
    rng = random.Random(seed)
    queues = random_queues(rng, rng.randint(1, 3))
    sim = Simulator(random_nodes(rng, n_nodes), queues, Policy(staleness_grace_period=0.0))
    for j in range(n_jobs):
        size = rng.randint(1, 4)
        gpus = rng.choice([0.0, 0.25, 0.5, 1.0, 2.0])
        pg, pods = gang(
            f"j{j}",
            rng.choice(queues[1:]).name,
            size,
            gpus,
            priority=rng.choice([50, 75, 100, 125]),
            created=float(j),
            cpu_millis=float(rng.choice([500, 2000, 8000])),
            memory_bytes=float(rng.choice([1, 4, 16])) * 2**30,
            min_available=rng.randint(1, size),
        )
        sim.submit(pg, pods, run_time=rng.choice([None, 120.0]))
    return sim


def step_beside(sim: Simulator, now: float) -> tuple[Session, CycleResult]:
    """One cycle of `sim` at `now`, with the same cycle's session run beside it on the same snapshot (the
    core is deterministic), to read what the cycle did inside: its log. The two bind the same."""
    sim.cluster.fire(now)
    ssn = run_session(sim.snapshot(), now, sim.policy)
    result = sim.step(now)
    assert result.binds == result_of(ssn).binds
    return ssn, result


def bench_record(**fields: Any) -> Record:
    """A benchmark `Record` as a run writes one: SchedulingBasic over the bus, 100 pods on 500 nodes, unless
    `fields` say otherwise."""
    defaults: dict[str, Any] = {
        "workload": "SchedulingBasic",
        "mode": "bus",
        "nodes": 500,
        "pods": 100,
        "throughput_pods_s": 100.0,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "cpu_s": 1.0,
        "peak_rss_mib": {},
        "conflicts": 0,
    }
    return Record(**{**defaults, **fields})
