"""The pod-grouper's decision: which PodGroup a new pod belongs to, as KAI's pod-grouper decides it; pure.

Called by the state service's pod-grouper loop (`services.state.podgrouper`), which walks a pod's owners with
`owner_refs_to_follow` (fetching each owner), asks `group_pod` for the PodGroup manifest and the pod patch,
creates the PodGroup (or, when it exists, applies `podgroup_update`) and then patches the pod. No I/O here:
everything the decision reads is an argument. The webhook (`services.state.webhook`) follows owners with
`owner_refs_to_follow` too, to read the annotations up the chain.

KAI's rules (``pkg/podgrouper``): the top owner's kind picks a plugin (a table keyed by group, version and
kind); every plugin starts from the default one: PodGroup ``pg-<top owner>-<uid>`` owned by the top owner,
labels and annotations inherited from it, queue from the ``kai.scheduler/queue`` label of the top owner or
the pod (else the ``project`` label, else ``default-queue``), priority class from a ``priorityClassName``
label or the pod's ``spec.priorityClassName`` when that PriorityClass exists (else the kind's default:
``train``, ``inference`` for Deployments), preemptibility from a ``kai.scheduler/preemptibility`` label,
topology from the top owner's ``kai.scheduler/topology*`` annotations, min member 1. Kinds handled beyond
that: Pod, Deployment (one PodGroup per pod), batch Job (``kai.scheduler/batch-min-member``), CronJob,
JobSet, PyTorchJob (master/worker sub-groups, segments), MPIJob, RayCluster (head and worker-group
sub-groups), and Argo Workflows and Kubeflow TrainJobs, which are skipped for the owner below them.
StatefulSet and ReplicaSet use the default plugin, as in KAI, and so does any other kind.

Not done (KAI reads more cluster state for these): the per-kind defaults ConfigMap, legacy per-pod Job
PodGroups, RayJob/RayService (they need the RayCluster object), Knative, LeaderWorkerSet, Grove, Spark,
and the TF/XGBoost/JAX jobs, which fall back to the default plugin.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from shared.errors import InvalidObject
from shared.kube import keys, values, wire

__all__ = [
    "GrouperConfig",
    "Grouping",
    "OwnerRef",
    "group_pod",
    "owner_refs_to_follow",
    "podgroup_update",
    "top_owner_metadata",
]

TRAIN = "train"
INFERENCE = "inference"
BUILD = "build"
PODGROUP_API_VERSION = keys.PODGROUP_API_VERSION


class GrouperConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The pod-grouper's settings (KAI's ``--queue-label-key``, ``--nodepool-label-key``, scheduler name)."""

    scheduler_name: str | None = keys.SCHEDULER_NAME
    """Only pods with this ``spec.schedulerName`` are grouped; None groups every pod."""
    queue_label_key: str = keys.QUEUE_LABEL
    node_pool_label_key: str = keys.NODE_POOL_LABEL
    """A pod's node-pool label is copied to its PodGroup when the top owner has none; empty disables."""
    default_queue: str = keys.DEFAULT_QUEUE


class OwnerRef(NamedTuple):
    """An owner to fetch: its apiVersion, kind and name (in the pod's namespace), and the uid it must have."""

    api_version: str
    kind: str
    name: str
    uid: str


class Grouping(msgspec.Struct, frozen=True, kw_only=True):
    """The decision for one pod: the PodGroup to create (or update) and the merge patch for the pod."""

    name: str
    namespace: str
    podgroup: dict[str, Any]
    """A complete scheduling.run.ai/v2alpha2 PodGroup manifest."""
    pod_patch: dict[str, Any]
    """Merge patch: the ``pod-group-name`` annotation, and the sub-group label when the pod has one."""
    grouper: str
    """Which plugin decided (for logs)."""


def owner_refs_to_follow(obj: wire.Pod | wire.Owner) -> list[OwnerRef]:
    """The owner to fetch next: a pod's first owner reference, an owner's only one; [] at the top.

    An owner with several owners is an error, as in KAI (the chain would be ambiguous).
    """
    refs = obj.metadata.owner_references
    if not refs:
        return []
    if isinstance(obj, wire.Owner) and len(refs) > 1:
        name = wire.object_name(obj.metadata.namespace, obj.metadata.name)
        raise InvalidObject(obj.kind or "owner", name, "metadata.ownerReferences", "has several owners")
    ref = refs[0]
    return [OwnerRef(ref.api_version, ref.kind, ref.name, ref.uid)]


# --- the metadata every plugin fills (KAI podgroup.Metadata) -------------------------------------------------
@dataclass
class _Constraint:
    topology: str = ""
    required: str = ""
    preferred: str = ""

    def manifest(self) -> dict[str, str] | None:
        out = {
            "topology": self.topology,
            "requiredTopologyLevel": self.required,
            "preferredTopologyLevel": self.preferred,
        }
        out = {k: v for k, v in out.items() if v}
        return out or None


@dataclass
class _SubGroup:
    name: str
    min_available: int
    parent: str | None = None
    constraint: _Constraint | None = None
    pods: list[str] = field(default_factory=list)


@dataclass
class _Metadata:
    name: str
    namespace: str
    owner: dict[str, str]
    labels: dict[str, str]
    annotations: dict[str, str]
    queue: str
    priority_class: str
    preemptibility: str
    min_available: int
    constraint: _Constraint
    sub_groups: list[_SubGroup] = field(default_factory=list)


@dataclass
class _Ctx:
    pod: wire.Pod
    owners: list[wire.Owner]
    priority_classes: Collection[str]
    config: GrouperConfig
    mpi_launcher_exists: bool | None


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def _pod_as_owner(pod: wire.Pod) -> wire.Owner:
    return wire.Owner(api_version="v1", kind="Pod", metadata=pod.metadata)


def _name(obj: wire.Owner) -> str:
    return wire.object_name(obj.metadata.namespace, obj.metadata.name)


def _error(obj: wire.Owner, field_path: str, problem: str) -> InvalidObject:
    return InvalidObject(obj.kind or "owner", _name(obj), field_path, problem)


# --- the default plugin ----------------------------------------------------------------------------------
def _priority_class(ctx: _Ctx, owners: Sequence[wire.Owner], default: str) -> str:
    """KAI ``calcPriorityClassWithDefaults``: per owner, its label, else the pod's label, else the pod's
    spec; the first that names an existing PriorityClass wins; else the kind's default."""
    pod = ctx.pod
    for owner in owners:
        name = owner.metadata.labels.get(keys.PRIORITY_CLASS_LABEL)
        if name is None:
            name = pod.metadata.labels.get(keys.PRIORITY_CLASS_LABEL, pod.spec.priority_class_name)
        if name and name in ctx.priority_classes:
            return name
    return default


def _preemptibility(ctx: _Ctx, owners: Sequence[wire.Owner]) -> str:
    """An owner's ``kai.scheduler/preemptibility`` label, else the pod's; invalid values are skipped."""
    for labels in [o.metadata.labels for o in owners] + [ctx.pod.metadata.labels]:
        value = labels.get(keys.PREEMPTIBILITY_LABEL)
        if value in ("preemptible", "non-preemptible"):
            return value
    return ""


def _queue(ctx: _Ctx, top: wire.Owner) -> str:
    key = ctx.config.queue_label_key
    pod_labels = ctx.pod.metadata.labels
    for labels in (top.metadata.labels, pod_labels):
        if key in labels:
            return labels[key]
    project = top.metadata.labels.get(keys.PROJECT_LABEL, pod_labels.get(keys.PROJECT_LABEL, ""))
    if project:
        pool = pod_labels.get(ctx.config.node_pool_label_key) if ctx.config.node_pool_label_key else None
        return f"{project}-{pool}" if pool is not None else project
    return ctx.config.default_queue


_PLAIN_YAML = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
_YAML_SPECIAL = re.compile(
    r"(?i:true|false|yes|no|on|off|null|~|y|n)|[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|0x[0-9a-fA-F]+|0o[0-7]+"
)


def _yaml_scalar(text: str) -> str:
    if _PLAIN_YAML.fullmatch(text) and not _YAML_SPECIAL.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def top_owner_metadata(top: wire.Owner) -> str:
    """KAI's ``kai.scheduler/top-owner-metadata`` annotation: the top owner's name, uid and kind as YAML."""
    group, version = _group_version(top.api_version)
    fields = (
        ("name", top.metadata.name),
        ("uid", top.metadata.uid),
        ("group", group),
        ("version", version),
        ("kind", top.kind),
    )
    return "".join(f"{k}: {_yaml_scalar(v)}\n" for k, v in fields)


def _default(
    ctx: _Ctx, top: wire.Owner, owners: Sequence[wire.Owner], default_class: str = TRAIN
) -> _Metadata:
    """KAI ``DefaultGrouper.GetPodGroupMetadata``."""
    if not owners:
        owners = [top]
    pod = ctx.pod
    annotations: dict[str, str] = {}
    if keys.USER_LABEL in pod.metadata.annotations:
        annotations[keys.USER_LABEL] = pod.metadata.annotations[keys.USER_LABEL]
    annotations[keys.TOP_OWNER_METADATA_ANNOTATION] = top_owner_metadata(top)
    annotations.update(top.metadata.annotations)
    labels = dict(top.metadata.labels)
    if keys.USER_LABEL not in labels and keys.USER_LABEL in pod.metadata.labels:
        labels[keys.USER_LABEL] = pod.metadata.labels[keys.USER_LABEL]
    top_annotations = top.metadata.annotations
    return _Metadata(
        name=f"pg-{top.metadata.name}-{top.metadata.uid}",
        namespace=pod.metadata.namespace,
        owner={
            "apiVersion": top.api_version,
            "kind": top.kind,
            "name": top.metadata.name,
            "uid": top.metadata.uid,
        },
        labels=labels,
        annotations=annotations,
        queue=_queue(ctx, top),
        priority_class=_priority_class(ctx, owners, default_class),
        preemptibility=_preemptibility(ctx, owners),
        min_available=1,
        constraint=_Constraint(
            top_annotations.get(keys.TOPOLOGY_ANNOTATION, ""),
            top_annotations.get(keys.TOPOLOGY_REQUIRED_ANNOTATION, ""),
            top_annotations.get(keys.TOPOLOGY_PREFERRED_ANNOTATION, ""),
        ),
    )


def _default_plugin(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    return _default(ctx, top, ctx.owners)


# --- per-kind plugins ------------------------------------------------------------------------------------
def _deployment(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """One PodGroup per pod, owned by the pod, priority class ``inference`` by default."""
    md = _default(ctx, top, [top])
    pod = ctx.pod.metadata
    md.owner = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
    md.priority_class = _priority_class(ctx, [top], INFERENCE)
    md.name = f"pg-{pod.name}-{pod.uid}"
    return md


def _batch_job(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """Min member 1, or the top owner's ``kai.scheduler/batch-min-member`` annotation."""
    md = _default(ctx, top, [top])
    raw = top.metadata.annotations.get(keys.BATCH_MIN_MEMBER_ANNOTATION)
    if raw is not None:
        field_path = f"metadata.annotations[{keys.BATCH_MIN_MEMBER_ANNOTATION}]"
        md.min_available = _parsed(
            top,
            field_path,
            lambda: values.whole(raw, low=0, high=values.INT32_MAX, what="a whole number of pods"),
        )
    return md


def _parsed(obj: wire.Owner, field_path: str, parse: Callable[[], int]) -> int:
    """`parse()`, its `InvalidValueError` turned into the error naming `obj` and the field."""
    try:
        return parse()
    except values.InvalidValueError as exc:
        raise _error(obj, field_path, str(exc)) from None


def _cron_job(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """The Job the CronJob created is the top owner (KAI's CronJob plugin)."""
    job = next((o for o in ctx.owners if o.kind == "Job"), None)
    if job is None:
        raise _error(top, "", f"pod {_name(_pod_as_owner(ctx.pod))} has no Job owner")
    return _default(ctx, job, [job])


def _int_at(obj: wire.Owner, path: Sequence[str], root: Mapping[str, Any] | None = None) -> int | None:
    """An integer at `path` in the owner's spec (or `root`): None when absent, an error when not an int."""
    value: Any = obj.spec if root is None else root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    where = "spec." + ".".join(path) if root is None else ".".join(path)
    return _parsed(obj, where, lambda: values.whole_of(value, low=0, high=values.INT32_MAX))


def _map_at(
    obj: wire.Owner, path: Sequence[str], root: Mapping[str, Any] | None = None
) -> Mapping[str, Any] | None:
    value: Any = obj.spec if root is None else root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, Mapping) else None


def _str_at(root: Mapping[str, Any] | None, path: Sequence[str]) -> str | None:
    value: Any = root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, str) else None


def _kubeflow(ctx: _Ctx, top: wire.Owner, replica_specs: str, mandatory: Sequence[str]) -> _Metadata:
    """KAI ``KubeflowDistributedGrouper``: ``runPolicy.schedulingPolicy.minAvailable``, else every replica."""
    md = _default(ctx, top, [top])
    min_available = _int_at(top, ("runPolicy", "schedulingPolicy", "minAvailable"))
    if min_available is not None:
        md.min_available = min_available
        return md
    specs = _map_at(top, (replica_specs,))
    if specs is None:
        raise _error(top, f"spec.{replica_specs}", "missing")
    for name in mandatory:
        if name not in specs:
            raise _error(top, f"spec.{replica_specs}.{name}", "missing (the job needs this replica type)")
    total = 0
    for name in specs:
        replicas = _int_at(top, (replica_specs, name, "replicas"))
        if not replicas:
            raise _error(top, f"spec.{replica_specs}.{name}.replicas", "must be set and not 0")
        total += replicas
    if total <= 0:
        raise _error(top, f"spec.{replica_specs}", f"the replicas must add up to more than 0, got {total}")
    md.min_available = total
    return md


PYTORCH_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
PYTORCH_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


def _pytorch(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """KAI's PyTorchJob plugin: the Kubeflow minimum (elastic ``minReplicas`` and ``minAvailable`` win),
    then sub-groups ``master`` and ``worker`` (split into ``worker-<i>`` segments on request)."""
    specs_name = "pytorchReplicaSpecs"
    md = _kubeflow(ctx, top, specs_name, [])
    for path in (("elasticPolicy", "minReplicas"), ("runPolicy", "schedulingPolicy", "minAvailable")):
        found = _int_at(top, path)
        if found is not None:
            md.min_available = found
    specs = _map_at(top, (specs_name,)) or {}
    master_replicas = _int_at(top, (specs_name, "Master", "replicas")) or 0
    role = ctx.pod.metadata.labels.get(PYTORCH_REPLICA_TYPE_LABEL)
    pod_name = ctx.pod.metadata.name
    if "Master" in specs and master_replicas:
        md.sub_groups.append(
            _SubGroup("master", master_replicas, pods=[pod_name] if role == "master" else [])
        )
    if "Worker" in specs:
        worker_min = max(0, md.min_available - master_replicas)
        md.sub_groups.extend(_pytorch_workers(ctx, top, specs, worker_min, role == "worker"))
    return md


def _pytorch_workers(
    ctx: _Ctx, top: wire.Owner, specs: Mapping[str, Any], worker_min: int, is_worker: bool
) -> list[_SubGroup]:
    replicas = _int_at(top, ("pytorchReplicaSpecs", "Worker", "replicas"))
    workers = 1 if replicas is None else replicas
    pods = [ctx.pod.metadata.name] if is_worker else []
    template = _map_at(top, ("Worker", "template", "metadata", "annotations"), specs) or {}
    pod_annotations = ctx.pod.metadata.annotations

    def worker_annotation(key: str) -> str:
        return (
            pod_annotations.get(key)
            or (template.get(key) if isinstance(template.get(key), str) else "")
            or ""
        )

    raw_size = worker_annotation(keys.SEGMENT_SIZE_ANNOTATION)
    if not raw_size:
        return [_SubGroup("worker", worker_min, pods=pods)]
    size = _parsed(
        top,
        f"metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
        lambda: values.whole(raw_size, low=1, high=values.INT32_MAX, what="a whole number of pods"),
    )
    segments, partial = divmod(workers, size)
    if partial:
        segments += 1
    index = -1
    if is_worker:
        raw_index = ctx.pod.metadata.labels.get(PYTORCH_REPLICA_INDEX_LABEL, "")
        index = (
            _parsed(
                _pod_as_owner(ctx.pod),
                f"metadata.labels[{PYTORCH_REPLICA_INDEX_LABEL}]",
                lambda: values.whole(raw_index, low=0, high=values.INT32_MAX, what="a replica index"),
            )
            // size
        )
    topology = (
        pod_annotations.get(keys.TOPOLOGY_ANNOTATION)
        or _str_at(template, (keys.TOPOLOGY_ANNOTATION,))
        or top.metadata.annotations.get(keys.TOPOLOGY_ANNOTATION, "")
    )
    required = worker_annotation(keys.SEGMENT_REQUIRED_ANNOTATION)
    preferred = worker_annotation(keys.SEGMENT_PREFERRED_ANNOTATION)
    constraint = _Constraint(topology, required, preferred) if topology and (required or preferred) else None
    out = [_SubGroup("worker", worker_min)]
    for i in range(segments):
        members = partial if partial and i == segments - 1 else size
        out.append(_SubGroup(f"worker-{i}", members, "worker", constraint, pods if i == index else []))
    return out


MPI_LAUNCHER_ROLE_LABEL = "training.kubeflow.org/job-role"


def _mpi(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """KAI's MPIJob plugin: Launcher and Worker required; with ``launcherCreationPolicy:
    WaitForWorkersReady`` the launcher is not counted until a live launcher pod exists."""
    md = _kubeflow(ctx, top, "mpiReplicaSpecs", ["Launcher", "Worker"])
    policy = _str_at(top.spec, ("launcherCreationPolicy",))
    if policy == "WaitForWorkersReady":
        exists = ctx.mpi_launcher_exists
        if exists is None:
            exists = ctx.pod.metadata.labels.get(MPI_LAUNCHER_ROLE_LABEL) == "launcher"
        if not exists:
            launchers = _int_at(top, ("mpiReplicaSpecs", "Launcher", "replicas"))
            if not launchers:
                raise _error(top, "spec.mpiReplicaSpecs.Launcher.replicas", "must be set and not 0")
            md.min_available -= launchers
    return md


JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


def _jobset(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """KAI's JobSet plugin: ``startupPolicyOrder: InOrder`` (the default) gives one PodGroup per
    replicated job; any other order one PodGroup for the whole JobSet."""
    md = _default(ctx, top, [top])
    if not top.metadata.name or not top.metadata.uid:
        raise _error(top, "metadata", "the JobSet has no name or uid")
    replicated = ctx.pod.metadata.labels.get(JOBSET_REPLICATED_JOB_LABEL, "")
    if not replicated:
        pod = _pod_as_owner(ctx.pod)
        raise _error(pod, f"metadata.labels[{JOBSET_REPLICATED_JOB_LABEL}]", "missing")
    order = _str_at(top.spec, ("startupPolicy", "startupPolicyOrder"))
    jobs = top.spec.get("replicatedJobs")
    jobs = [j for j in jobs if isinstance(j, Mapping)] if isinstance(jobs, list) else []
    if order is None or order == "InOrder":
        md.name = f"pg-{top.metadata.name}-{top.metadata.uid}-{replicated}"
        job = next((j for j in jobs if j.get("name") == replicated), None)
        md.min_available = 1 if job is None else _replicated_job_min(top, job)
    else:
        total = sum(_replicated_job_min(top, j) for j in jobs if j.get("name"))
        md.min_available = max(total, 1)
    return md


def _replicated_job_min(top: wire.Owner, job: Mapping[str, Any]) -> int:
    """replicas x min(parallelism, completions), each defaulting to 1."""
    replicas = _int_at(top, ("replicas",), job) or 1
    parallelism = _int_at(top, ("template", "spec", "parallelism"), job) or 1
    completions = _int_at(top, ("template", "spec", "completions"), job)
    if completions is not None and 0 < completions < parallelism:
        parallelism = completions
    return max(replicas, 1) * max(parallelism, 1)


RAY_GROUP_LABEL = "ray.io/group"
RAY_HEAD_GROUP = "headgroup"
RAY_PRIORITY_CLASS_LABEL = "ray.io/priority-class-name"


def _ray_cluster(ctx: _Ctx, top: wire.Owner) -> _Metadata:
    """KAI's Ray plugin for a RayCluster: the head plus each worker group's minimum (``minReplicas``,
    else ``replicas``, times ``numOfHosts``) as sub-groups; ``ray.io/priority-class-name`` wins."""
    md = _default(ctx, top, [top])
    head = _map_at(top, ("headGroupSpec",))
    sub_groups = [_SubGroup(RAY_HEAD_GROUP, 1, constraint=_template_constraint(top, head, "headGroupSpec"))]
    total = 1
    groups = top.spec.get("workerGroupSpecs")
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        if not isinstance(group, Mapping):
            raise _error(top, f"spec.workerGroupSpecs[{i}]", "must be an object")
        if group.get("suspended") is True:
            continue
        at = f"workerGroupSpecs[{i}]"
        desired = _int_at(top, ("replicas",), group) or 0
        minimum = _int_at(top, ("minReplicas",), group) or 0
        if minimum > desired:
            raise _error(top, f"spec.{at}.minReplicas", f"{minimum} is more than replicas {desired}")
        if minimum == 0 and desired == 0:
            continue
        hosts = _int_at(top, ("numOfHosts",), group)
        hosts = 1 if hosts is None else hosts
        members = (minimum if minimum > 0 else desired) * hosts
        total += members
        name = group.get("groupName")
        name = name if isinstance(name, str) and name else f"worker-group-{i}"
        sub_groups.append(_SubGroup(name, members, constraint=_template_constraint(top, group, f"{at}")))
    md.min_available = total
    md.sub_groups = sub_groups
    ray_class = top.metadata.labels.get(RAY_PRIORITY_CLASS_LABEL)
    if ray_class is not None:
        md.priority_class = ray_class
    group_of_pod = ctx.pod.metadata.labels.get(RAY_GROUP_LABEL)
    for sg in sub_groups:
        if sg.name == group_of_pod:
            sg.pods.append(ctx.pod.metadata.name)
    return md


def _template_constraint(top: wire.Owner, group: Mapping[str, Any] | None, at: str) -> _Constraint | None:
    annotations = _map_at(top, ("template", "metadata", "annotations"), group) if group is not None else None
    annotations = annotations or {}
    topology = _str_at(annotations, (keys.TOPOLOGY_ANNOTATION,)) or ""
    required = _str_at(annotations, (keys.TOPOLOGY_REQUIRED_ANNOTATION,)) or ""
    preferred = _str_at(annotations, (keys.TOPOLOGY_PREFERRED_ANNOTATION,)) or ""
    if not required and not preferred:
        return None
    if not topology:
        field_path = f"spec.{at}.template.metadata.annotations[{keys.TOPOLOGY_ANNOTATION}]"
        raise _error(top, field_path, "required when a topology placement annotation is set")
    return _Constraint(topology, required, preferred)


_Plugin = Callable[[_Ctx, wire.Owner], _Metadata]

_PLUGINS: dict[tuple[str, str, str], tuple[str, _Plugin]] = {
    ("", "v1", "Pod"): ("pod", _default_plugin),
    ("apps", "v1", "Deployment"): ("deployment", _deployment),
    ("apps", "v1", "StatefulSet"): ("default", _default_plugin),
    ("apps", "v1", "ReplicaSet"): ("default", _default_plugin),
    ("batch", "v1", "Job"): ("batch-job", _batch_job),
    ("batch", "v1", "CronJob"): ("cron-job", _cron_job),
    ("kubeflow.org", "v1", "PyTorchJob"): ("pytorch", _pytorch),
    ("kubeflow.org", "v1", "MPIJob"): ("mpi", _mpi),
    ("kubeflow.org", "v2beta1", "MPIJob"): ("mpi", _mpi),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet"): ("jobset", _jobset),
    ("ray.io", "v1", "RayCluster"): ("ray-cluster", _ray_cluster),
    ("ray.io", "v1alpha1", "RayCluster"): ("ray-cluster", _ray_cluster),
}
_SKIPPED_TOP_OWNERS = frozenset(
    {
        ("argoproj.io", "v1alpha1", "Workflow"),
        ("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
    }
)


def _plugin(top: wire.Owner) -> tuple[str, _Plugin]:
    group, version = _group_version(top.api_version)
    return _PLUGINS.get((group, version, top.kind), ("default", _default_plugin))


# --- the decision ----------------------------------------------------------------------------------------
def _check_chain(pod: wire.Pod, owners: Sequence[wire.Owner]) -> None:
    """Each owner must be the object its child references (same kind, name and uid)."""
    child: wire.Pod | wire.Owner = pod
    for owner in owners:
        refs = owner_refs_to_follow(child)
        if not refs:
            raise _error(owner, "", "is not an owner of the object below it in the chain")
        ref = refs[0]
        if (
            ref.kind != owner.kind
            or ref.name != owner.metadata.name
            or (ref.uid and ref.uid != owner.metadata.uid)
        ):
            raise _error(
                owner,
                "metadata.uid",
                f"expected {ref.kind} {ref.name!r} with uid {ref.uid!r} (the owner was replaced?)",
            )
        child = owner


def group_pod(
    pod: wire.Pod,
    owners: Sequence[wire.Owner],
    *,
    priority_classes: Collection[str],
    config: GrouperConfig | None = None,
    mpi_launcher_exists: bool | None = None,
) -> Grouping | None:
    """The PodGroup `pod` belongs to, or None when the pod is not the pod-grouper's to group.

    `owners` is the pod's owner chain from its own owner up to the top owner (fetched with
    `owner_refs_to_follow`; a shorter chain, when an owner cannot be read, is grouped by its last owner);
    `priority_classes` the names of the PriorityClasses that exist. `mpi_launcher_exists` says whether a
    live launcher pod exists for an MPIJob (None: only when `pod` is the launcher). Left alone (None): a pod
    of another scheduler, one that already names its podgroup, one that asks to be skipped
    (``kai.scheduler/skip-podgrouper: "true"``). Raises InvalidObject when an owner's spec or a label
    the plugin needs is malformed.
    """
    config = config or GrouperConfig()
    meta = pod.metadata
    if config.scheduler_name is not None and pod.spec.scheduler_name != config.scheduler_name:
        return None
    if meta.annotations.get(keys.PODGROUP_ANNOTATION):
        return None
    if meta.annotations.get(keys.SKIP_PODGROUPER_ANNOTATION, "").lower() == "true":
        return None
    _check_chain(pod, owners)
    chain = list(owners)
    top = chain[-1] if chain else _pod_as_owner(pod)
    group, version = _group_version(top.api_version)
    if (group, version, top.kind) in _SKIPPED_TOP_OWNERS:
        top, chain = _skip_top_owner(pod, top, chain)
    ctx = _Ctx(pod, chain, priority_classes, config, mpi_launcher_exists)
    grouper, plugin = _plugin(top)
    md = plugin(ctx, top)
    key = config.node_pool_label_key
    if key and key not in md.labels and key in meta.labels:
        md.labels[key] = meta.labels[key]
    return Grouping(
        name=md.name,
        namespace=md.namespace,
        podgroup=_manifest(md),
        pod_patch=_pod_patch(md, meta.name),
        grouper=grouper,
    )


def _skip_top_owner(
    pod: wire.Pod, skipped: wire.Owner, chain: list[wire.Owner]
) -> tuple[wire.Owner, list[wire.Owner]]:
    """KAI's skip-top-owner plugin: the owner below (or the pod) becomes the top owner and inherits the
    skipped owner's labels and annotations where it has none of its own."""
    below = chain[-2] if len(chain) > 1 else _pod_as_owner(pod)
    meta = below.metadata
    merged = msgspec.structs.replace(
        meta,
        labels={**skipped.metadata.labels, **meta.labels},
        annotations={**skipped.metadata.annotations, **meta.annotations},
    )
    return msgspec.structs.replace(below, metadata=merged), chain[:-1]


def _manifest(md: _Metadata) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": md.min_available, "queue": md.queue}
    if md.priority_class:
        spec["priorityClassName"] = md.priority_class
    if md.preemptibility:
        spec["preemptibility"] = md.preemptibility
    constraint = md.constraint.manifest()
    if constraint is not None:
        spec["topologyConstraint"] = constraint
    if md.sub_groups:
        sub_groups: list[dict[str, Any]] = []
        for sg in md.sub_groups:
            item: dict[str, Any] = {"name": sg.name, "minMember": sg.min_available}
            if sg.parent is not None:
                item["parent"] = sg.parent
            sg_constraint = sg.constraint.manifest() if sg.constraint is not None else None
            if sg_constraint is not None:
                item["topologyConstraint"] = sg_constraint
            sub_groups.append(item)
        spec["subGroups"] = sub_groups
    metadata: dict[str, Any] = {
        "name": md.name,
        "namespace": md.namespace,
        "ownerReferences": [md.owner],
    }
    if md.labels:
        metadata["labels"] = dict(sorted(md.labels.items()))
    if md.annotations:
        metadata["annotations"] = dict(sorted(md.annotations.items()))
    return {"apiVersion": PODGROUP_API_VERSION, "kind": "PodGroup", "metadata": metadata, "spec": spec}


def _pod_patch(md: _Metadata, pod_name: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"annotations": {keys.PODGROUP_ANNOTATION: md.name}}
    sub_group = next((sg.name for sg in md.sub_groups if pod_name in sg.pods), None)
    if sub_group is not None:
        metadata["labels"] = {keys.SUBGROUP_LABEL: sub_group}
    return {"metadata": metadata}


# --- updating an existing PodGroup ------------------------------------------------------------------------
_MANAGED_SPEC = ("minMember", "priorityClassName", "preemptibility", "topologyConstraint", "subGroups")


def _spec_view(spec: wire.PodGroupSpec) -> tuple[Any, ...]:
    constraint = spec.topology_constraint
    if constraint is not None and not (
        constraint.topology or constraint.required_topology_level or constraint.preferred_topology_level
    ):
        constraint = None
    sub_groups = [msgspec.structs.replace(sg, parent=sg.parent or None) for sg in spec.sub_groups]
    return (spec.min_member, spec.priority_class_name, spec.preemptibility, constraint, sub_groups)


def podgroup_update(
    existing: wire.PodGroup, grouping: Grouping, *, config: GrouperConfig | None = None
) -> dict[str, Any] | None:
    """A merge patch bringing an existing PodGroup in line with `grouping`, or None when it already is.

    KAI's rules (``podgroup.Handler``): the queue and the scheduling-backoff fields stay as they are, so
    do the node-pool and queue labels already there; labels and annotations are only added or changed,
    never removed; the owner references and the rest of the spec are replaced.
    """
    config = config or GrouperConfig()
    desired_meta = grouping.podgroup["metadata"]
    labels: dict[str, str] = dict(desired_meta.get("labels", {}))
    old_labels = existing.metadata.labels
    for key in (config.node_pool_label_key, config.queue_label_key):
        if key and key in old_labels:
            labels[key] = old_labels[key]
        elif key == config.node_pool_label_key:
            labels.pop(key, None)
    annotations: dict[str, str] = dict(desired_meta.get("annotations", {}))
    patch_meta: dict[str, Any] = {}
    changed_labels = {k: v for k, v in labels.items() if old_labels.get(k) != v}
    if changed_labels:
        patch_meta["labels"] = changed_labels
    old_annotations = existing.metadata.annotations
    changed_annotations = {k: v for k, v in annotations.items() if old_annotations.get(k) != v}
    if changed_annotations:
        patch_meta["annotations"] = changed_annotations
    owners = desired_meta.get("ownerReferences", [])
    old_owners = [
        {"apiVersion": r.api_version, "kind": r.kind, "name": r.name, "uid": r.uid}
        for r in existing.metadata.owner_references
    ]
    if owners != old_owners:
        patch_meta["ownerReferences"] = owners
    desired_spec = dict(grouping.podgroup["spec"])
    desired_spec["queue"] = existing.spec.queue
    wanted = msgspec.convert(desired_spec, type=wire.PodGroupSpec)
    patch: dict[str, Any] = {}
    if patch_meta:
        patch["metadata"] = patch_meta
    if _spec_view(wanted) != _spec_view(existing.spec):
        patch["spec"] = {key: grouping.podgroup["spec"].get(key) for key in _MANAGED_SPEC}
    return patch or None
