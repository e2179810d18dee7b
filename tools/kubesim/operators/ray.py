"""Ray in the simulated API server: KubeRay's CRDs, served from the start, and a simulated KubeRay operator
that makes a RayCluster's pods, a RayJob's and a RayService's RayCluster, and a RayJob's submitter Job, so
that a manifest written for KubeRay applies and runs unchanged.

**CRDs** (`RAY_CRDS`, created by `Cluster` at start through `OPERATOR`): RayCluster, RayJob and RayService
(``ray.io``, v1 stored, v1alpha1 served too); namespaced, schema-less, with the status subresource and
KubeRay's printer columns (``kubectl get rayclusters`` shows desired and available workers, CPUs, memory,
GPUs and the state; rayjobs the job and deployment status and the cluster's name; rayservices the service
status and serve endpoints).

**RayCluster** (`RayOperator`): a head pod ``<cluster>-head-<5 random>`` and, per worker group, ``replicas``
(held between ``minReplicas`` and ``maxReplicas`` as KubeRay's ``GetWorkerGroupDesiredReplicas`` does)
times ``numOfHosts`` worker pods ``<cluster>-<group>-worker-<5 random>`` (the prefix cut to 50 characters,
as KubeRay's ``PodGenerateName``); a suspended group has none (its pods are deleted), and so has a cluster
with ``spec.suspend``. Pods carry the group template's labels, annotations and spec plus KubeRay's labels
``ray.io/cluster``, ``ray.io/node-type`` (head, worker), ``ray.io/group`` (``headgroup`` or the group's
name), ``ray.io/identifier`` (``<cluster>-head``, ``<cluster>-worker``), ``ray.io/is-ray-node: "yes"``,
``app.kubernetes.io/name: kuberay`` and ``app.kubernetes.io/created-by: kuberay-operator``, and a
controller ownerReference to the cluster. A deleted or finished pod is replaced; without autoscaling, pods
beyond a group's count are deleted. Status: ``state: ready`` once the head and every desired worker run
and are ready (kept afterwards, as KubeRay keeps it), ``suspended`` while suspended; desired, minimum,
maximum, available and ready worker counts; the desired CPU, memory and GPU (requests, else limits); the
head pod's name and IP; the conditions HeadPodReady and RayClusterProvisioned.

**RayJob**: a RayCluster ``<job>-<5 random>`` from ``spec.rayClusterSpec`` (the job's labels plus
``ray.io/originated-from-crd: RayJob`` and ``ray.io/originated-from-cr-name``, its annotations, owned by
the job), or the existing one ``spec.clusterSelector`` names (``ray.io/cluster``); ``status.rayClusterName``
names it. Once the cluster is ready, in K8sJobMode (the default), the submitter: a batch Job named after the
RayJob (the same two labels and ``app.kubernetes.io/created-by``, ``backoffLimit`` from
``submitterConfig``, 2 by default) from ``submitterPodTemplate`` or KubeRay's default (one container
``ray-job-submitter`` with the head's image running ``ray job submit``, restartPolicy Never); the RayJob's
``kairos.io/run-seconds`` (label or annotation) goes to the submitter pod, which then runs that long.
Status: ``jobDeploymentStatus`` Initializing, Running, then Complete or Failed as the submitter Job ends
(``jobStatus`` PENDING, RUNNING, SUCCEEDED or FAILED), ``jobId``, ``startTime``, ``endTime``,
``dashboardURL``, ``rayClusterStatus``; ``spec.suspend`` deletes the cluster (Suspended). With
``shutdownAfterJobFinishes`` and no ``ttlSecondsAfterFinished`` the cluster is deleted when the job ends.
HTTPMode and SidecarMode jobs run (RUNNING) once the cluster is ready; InteractiveMode ones wait (Waiting).

**RayService**: a RayCluster ``<service>-<5 random>`` from ``spec.rayClusterConfig`` (labelled and owned
as a RayJob's), named in ``status.pendingServiceStatus.rayClusterName`` until it is ready, then in
``status.activeServiceStatus.rayClusterName``; ``serviceStatus: Running``, ``numServeEndpoints`` (the
cluster's running pods) and the Ready condition once it serves.

A malformed spec (what KubeRay's CRD schema or its ``ValidateRayClusterSpec``, ``ValidateRayJobSpec`` or
``ValidateRayServiceSpec`` refuse: a field of the wrong type, a negative count, no head container, a
worker group without a name or with a duplicate one) creates nothing and records a Warning Event
(InvalidRayClusterSpec, InvalidRayJobSpec, InvalidRayServiceSpec) naming the field; a count beyond 1,000
makes 1,000 pods.

Not simulated: the head and serve Services, Ingresses and Routes, the Ray autoscaler (it never changes
``replicas``; ``scaleStrategy.workersToDelete`` is ignored), GCS fault tolerance, ``ttlSecondsAfterFinished``
above 0, ``activeDeadlineSeconds``, RayJob retries (``backoffLimit``), RayService upgrades (a changed
spec keeps its cluster) and Serve application statuses, KubeRay's multi-host replica labels. Pure: no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from tools.kubesim.errors import ApiError
from tools.kubesim.objects import (
    clone,
    controller_of,
    controller_ref,
    format_cpu,
    format_memory,
    is_ready,
    quantity,
    random_suffix,
    rfc3339,
)
from tools.kubesim.operators import OperatorSpec, custom_resource_definition, printer_column

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = [
    "CLUSTERS",
    "JOBS",
    "RAY_CRDS",
    "SERVICES",
    "RayOperator",
    "cluster_problem",
    "desired_replicas",
    "job_problem",
    "worker_pods_wanted",
]

Obj = dict[str, Any]

GROUP = "ray.io"
VERSIONS = ("v1", "v1alpha1")
CLUSTERS = f"{GROUP}/rayclusters"
JOBS = f"{GROUP}/rayjobs"
SERVICES = f"{GROUP}/rayservices"
_JOBS_BATCH = "batch/jobs"

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
IDENTIFIER_LABEL = "ray.io/identifier"
IS_RAY_NODE_LABEL = "ray.io/is-ray-node"
ORIGINATED_FROM_CRD_LABEL = "ray.io/originated-from-crd"
ORIGINATED_FROM_NAME_LABEL = "ray.io/originated-from-cr-name"
APP_NAME_LABEL = "app.kubernetes.io/name"
CREATED_BY_LABEL = "app.kubernetes.io/created-by"
HEAD_GROUP = "headgroup"
CREATED_BY = "kuberay-operator"
RUN_SECONDS = "kairos.io/run-seconds"
"""The simulated kubelet's run time (`tools.kubesim.nodesim.RUN_SECONDS`): a RayJob's goes to its submitter."""

INT32_MAX = 2**31 - 1
MAX_PODS = 1000
"""The most pods kubesim makes for one worker group: it has no CRD schema to refuse a hostile count."""
NAME_PREFIX_MAX = 50
"""KubeRay's ``PodGenerateName`` cuts the name prefix to this many characters."""
DEFAULT_SUBMITTER_BACKOFF = 2
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
DASHBOARD_PORT = 8265
_TERMINAL = ("Succeeded", "Failed")
_COMPONENTS = {
    CLUSTERS: "raycluster-controller",
    JOBS: "rayjob-controller",
    SERVICES: "rayservice-controller",
}


# --- CRDs --------------------------------------------------------------------------------------------------
_AGE = printer_column("age", ".metadata.creationTimestamp", "date")

_KINDS: tuple[tuple[str, str, tuple[Obj, ...]], ...] = (
    (
        "RayCluster",
        "rayclusters",
        (
            printer_column("desired workers", ".status.desiredWorkerReplicas", "integer"),
            printer_column("available workers", ".status.availableWorkerReplicas", "integer"),
            printer_column("cpus", ".status.desiredCPU"),
            printer_column("memory", ".status.desiredMemory"),
            printer_column("gpus", ".status.desiredGPU"),
            printer_column("status", ".status.state"),
            _AGE,
        ),
    ),
    (
        "RayJob",
        "rayjobs",
        (
            printer_column("job status", ".status.jobStatus"),
            printer_column("deployment status", ".status.jobDeploymentStatus"),
            printer_column("ray cluster name", ".status.rayClusterName"),
            printer_column("start time", ".status.startTime", "date"),
            printer_column("end time", ".status.endTime", "date"),
            _AGE,
        ),
    ),
    (
        "RayService",
        "rayservices",
        (
            printer_column("service status", ".status.serviceStatus"),
            printer_column("num serve endpoints", ".status.numServeEndpoints"),
            _AGE,
        ),
    ),
)


RAY_CRDS: tuple[Obj, ...] = tuple(
    custom_resource_definition(
        GROUP, kind, plural, VERSIONS, categories=["all"], subresources={"status": {}}, columns=columns
    )
    for kind, plural, columns in _KINDS
)
"""KubeRay's CustomResourceDefinitions, served from kubesim's start."""


# --- reading a spec as KubeRay's schema and validation do ------------------------------------------------
class SpecError(Exception):
    """A spec KubeRay refuses: the field and what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _count(group: Mapping[str, Any], at: str, key: str) -> int | None:
    """A count of a worker group; None when missing or null (the API server prunes a null)."""
    value = group.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT32_MAX:
        raise SpecError(f"{at}.{key}", f"must be a whole number from 0 to {INT32_MAX}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value for a message: its repr cut to 40 characters (a 5,000-digit number has no repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return "a number of more than 40 digits"
    return repr(value)[:40]


def _flag(obj: Mapping[str, Any], at: str, key: str) -> bool:
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SpecError(f"{at}.{key}", f"must be true or false, got {_shown(value)}")
    return value


def _check_template(template: Any, at: str, what: str) -> None:
    """A pod template as the CRD schema (a PodTemplateSpec) and KubeRay's validation take it: objects where
    objects belong, labels and annotations of text, at least one container."""
    if not isinstance(template, Mapping):
        raise SpecError(at, "must be an object")
    md = template.get("metadata")
    if md is not None:
        if not isinstance(md, Mapping):
            raise SpecError(f"{at}.metadata", "must be an object")
        for key in ("labels", "annotations"):
            values = md.get(key)
            if values is not None and (
                not isinstance(values, Mapping) or not all(isinstance(v, str) for v in values.values())
            ):
                raise SpecError(f"{at}.metadata.{key}", "must map names to text")
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if (
        not isinstance(containers, list)
        or not containers
        or not all(isinstance(c, Mapping) for c in containers)
    ):
        raise SpecError(f"{at}.spec.containers", f"{what} should have at least one container")
    for index, container in enumerate(containers):
        if not isinstance(container.get("name"), str) or not container["name"]:
            raise SpecError(f"{at}.spec.containers[{index}].name", "is required")


def cluster_problem(spec: Any, at: str = "spec") -> SpecError | None:
    """What KubeRay refuses in a RayCluster spec (`at` is where the spec sits: ``spec`` of a RayCluster,
    ``spec.rayClusterSpec`` of a RayJob, ``spec.rayClusterConfig`` of a RayService); None when valid."""
    try:
        _check_cluster(spec, at)
    except SpecError as problem:
        return problem
    return None


def _check_cluster(spec: Any, at: str) -> None:
    if not isinstance(spec, Mapping):
        raise SpecError(at, "must be an object")
    head = spec.get("headGroupSpec")
    if not isinstance(head, Mapping):
        raise SpecError(f"{at}.headGroupSpec", "is required")
    _check_template(head.get("template"), f"{at}.headGroupSpec.template", "headGroupSpec")
    _flag(spec, at, "suspend")
    autoscaling = _flag(spec, at, "enableInTreeAutoscaling")
    groups = spec.get("workerGroupSpecs")
    if groups is None:
        return
    if not isinstance(groups, list):
        raise SpecError(f"{at}.workerGroupSpecs", "must be a list")
    names: set[str] = set()
    for index, group in enumerate(groups):
        where = f"{at}.workerGroupSpecs[{index}]"
        if not isinstance(group, Mapping):
            raise SpecError(where, "must be an object")
        name = group.get("groupName")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{where}.groupName", "is required")
        if name in names or name == HEAD_GROUP:
            raise SpecError(f"{where}.groupName", f"{name!r} names a second group of the cluster")
        names.add(name)
        for key in ("replicas", "minReplicas", "maxReplicas", "numOfHosts"):
            _count(group, where, key)
        if _flag(group, where, "suspend") and autoscaling:
            raise SpecError(
                f"{where}.suspend", f"worker group {name} cannot be suspended with Autoscaler enabled"
            )
        _check_template(group.get("template"), f"{where}.template", "workerGroupSpec")


def desired_replicas(group: Mapping[str, Any]) -> int:
    """KubeRay's ``GetWorkerGroupDesiredReplicas`` for a valid worker group: 0 when suspended, else
    ``replicas`` (``minReplicas`` when absent) held between ``minReplicas`` and ``maxReplicas``."""
    if group.get("suspend") is True:
        return 0
    low = _count(group, "", "minReplicas") or 0
    high = _count(group, "", "maxReplicas")
    high = INT32_MAX if high is None else high
    replicas = _count(group, "", "replicas")
    if low > high:
        return high
    if replicas is None or replicas < low:
        return low
    return min(replicas, high)


def worker_pods_wanted(group: Mapping[str, Any]) -> int:
    """The worker pods KubeRay keeps for a valid group: its desired replicas times ``numOfHosts`` (at least
    1), at most `MAX_PODS`."""
    hosts = max(1, _count(group, "", "numOfHosts") or 1)
    return min(desired_replicas(group) * hosts, MAX_PODS)


# --- the operator ------------------------------------------------------------------------------------------
def _map(value: Any) -> Obj:
    """`value` when it is an object, else an empty one (a status anyone may have written through /status)."""
    return value if isinstance(value, dict) else {}


def _conditions(status: Obj) -> list[Obj]:
    found = status.get("conditions")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _ready(pod: Obj) -> bool:
    return _phase(pod) == "Running" and is_ready(pod)


def _condition(type_: str, status: str, reason: str, message: str, now: str, old: list[Obj]) -> Obj:
    """A metav1 Condition, keeping its transition time while its status stays."""
    for c in old:
        if c.get("type") == type_ and c.get("status") == status:
            now = str(c.get("lastTransitionTime") or now)
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}


def _resources(template: Any) -> dict[str, Fraction]:
    """A pod template's resources as KubeRay's ``CalculatePodResource`` adds them: requests, else limits."""
    spec = template.get("spec") if isinstance(template, Mapping) else None
    total: dict[str, Fraction] = {}
    for container in (spec.get("containers") if isinstance(spec, Mapping) else None) or ():
        resources = container.get("resources") if isinstance(container, Mapping) else None
        if not isinstance(resources, Mapping):
            continue
        wanted: dict[str, Any] = {}
        for part in ("limits", "requests"):
            values = resources.get(part)
            if isinstance(values, Mapping):
                wanted.update(values)
        for name, raw in wanted.items():
            amount = quantity(raw)
            if amount is not None and amount >= 0:
                total[str(name)] = total.get(str(name), Fraction(0)) + amount
    return total


class RayOperator:
    """KubeRay's RayCluster, RayJob and RayService controllers, reconciling one object at a time."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers
        self._reconcilers: dict[str, Callable[[Obj], None]] = {
            CLUSTERS: self._cluster,
            JOBS: self._job,
            SERVICES: self._service,
        }

    def reconcile(self, storage: str, obj: Obj) -> None:
        self._reconcilers[storage](obj)

    # --- shared ---------------------------------------------------------------------------------------------
    @property
    def _store(self) -> Any:
        return self.controllers.cluster.store

    def _now(self) -> str:
        return rfc3339(self.controllers.cluster.now())

    def _write_status(self, storage: str, obj: Obj, status: Obj) -> None:
        md = obj["metadata"]
        current = self._store.storage(storage).get(md["namespace"], md["name"])
        if current is not None and current["metadata"].get("uid") == md.get("uid"):
            self.controllers.write_status(storage, current, status)

    def _refuse(self, storage: str, obj: Obj, reason: str, problem: SpecError) -> None:
        """A Warning Event naming the field, recorded once per problem (the status remembers it)."""
        message = f"{problem.field}: {problem.problem}"
        if _map(obj.get("status")).get("reason") != message:
            self.controllers.cluster.record_event(obj, "Warning", reason, message, _COMPONENTS[storage])

    def _delete(self, storage: str, namespace: str, name: str) -> None:
        cluster = self.controllers.cluster
        # Already gone, or held by a finalizer: nothing more a controller would do now.
        with contextlib.suppress(ApiError):
            cluster.delete(cluster.type_of(storage), namespace, name, {"propagationPolicy": "Background"})

    def _child_cluster(self, owner: Obj, storage: str, crd: str, spec: Any, name: str) -> Obj | None:
        """The RayCluster `name` `owner` (a RayJob or RayService) made, created from `spec` when missing."""
        md = owner["metadata"]
        ns = md["namespace"]
        found: Obj | None = self._store.storage(CLUSTERS).get(ns, name)
        if found is not None:
            return found
        labels = {
            **(md.get("labels") or {}),
            ORIGINATED_FROM_NAME_LABEL: md["name"],
            ORIGINATED_FROM_CRD_LABEL: crd,
        }
        metadata: Obj = {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [controller_ref(owner)],
        }
        if md.get("annotations"):
            metadata["annotations"] = dict(md["annotations"])
        manifest = {
            "apiVersion": owner["apiVersion"],
            "kind": "RayCluster",
            "metadata": metadata,
            "spec": clone(spec),
        }
        if not self.controllers.create_owned(owner, storage, CLUSTERS, manifest):
            return None
        created: Obj | None = self._store.storage(CLUSTERS).get(ns, name)
        return created

    def _new_cluster_name(self, base: str, namespace: str) -> str:
        rng = self.controllers.cluster.rng
        while True:
            name = f"{base[:NAME_PREFIX_MAX]}-{random_suffix(rng)}".lower()
            if self._store.storage(CLUSTERS).get(namespace, name) is None:
                return name

    # --- RayCluster -----------------------------------------------------------------------------------------
    def _cluster(self, rc: Obj) -> None:
        md = rc["metadata"]
        spec = rc.get("spec")
        problem = cluster_problem(spec)
        if problem is not None:
            self._refuse(CLUSTERS, rc, "InvalidRayClusterSpec", problem)
            self._write_status(
                CLUSTERS, rc, {"state": "failed", "reason": f"{problem.field}: {problem.problem}"}
            )
            return
        assert isinstance(spec, Mapping)
        groups = [g for g in spec.get("workerGroupSpecs") or () if isinstance(g, Mapping)]
        pods = [p for p in self.controllers.owned_pods(rc) if not p["metadata"].get("deletionTimestamp")]
        for pod in pods:
            if _phase(pod) in _TERMINAL:
                self._delete("pods", md["namespace"], pod["metadata"]["name"])
        pods = [p for p in pods if _phase(p) not in _TERMINAL]
        suspended = spec.get("suspend") is True
        if suspended:
            for pod in pods:
                self._delete("pods", md["namespace"], pod["metadata"]["name"])
            pods = []
        else:
            self._cluster_pods(rc, spec, groups, pods)
            pods = [
                p
                for p in self.controllers.owned_pods(rc)
                if not p["metadata"].get("deletionTimestamp") and _phase(p) not in _TERMINAL
            ]
        self._cluster_status(rc, spec, groups, pods, suspended)
        self._wake_users(rc)

    def _wake_users(self, rc: Obj) -> None:
        """Reconcile the RayJob or RayService that made `rc`, and the RayJobs that select it, as KubeRay's
        controllers, which watch the RayClusters they own and requeue the others, see its new state."""
        md = rc["metadata"]
        mark = self.controllers.mark_dirty
        owner = controller_of(rc)
        if owner is not None and owner.get("kind") in ("RayJob", "RayService"):
            storage = JOBS if owner["kind"] == "RayJob" else SERVICES
            mark(storage, md["namespace"], str(owner.get("name", "")))
        for job in self.controllers.cluster.objects(JOBS, md["namespace"]):
            selector = (job.get("spec") or {}).get("clusterSelector")
            if isinstance(selector, Mapping) and selector.get(CLUSTER_LABEL) == md["name"]:
                mark(JOBS, md["namespace"], job["metadata"]["name"])

    def _cluster_pods(
        self, rc: Obj, spec: Mapping[str, Any], groups: list[Mapping[str, Any]], pods: list[Obj]
    ) -> None:
        name = rc["metadata"]["name"]
        waiting = self.controllers.waiting_for(rc)
        autoscaling = spec.get("enableInTreeAutoscaling") is True
        wanted: list[tuple[str, str, Mapping[str, Any], int]] = [
            (HEAD_GROUP, "head", spec["headGroupSpec"], 1)
        ]
        wanted += [(str(g["groupName"]), "worker", g, worker_pods_wanted(g)) for g in groups]
        for group, node_type, group_spec, count in wanted:
            prefix = _pod_prefix(name, group, node_type)
            mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(GROUP_LABEL) == group]
            in_flight = [n for n in waiting if n.startswith(prefix) and len(n) == len(prefix) + 5]
            missing = count - len(mine) - len(in_flight)
            for _ in range(max(0, missing)):
                template = self._pod_template(name, group, node_type, group_spec)
                if not self.controllers.create_pod_from(rc, CLUSTERS, self._pod_name(rc, prefix), template):
                    return
            if missing < 0 and not autoscaling:
                extra = sorted(
                    mine, key=lambda p: (bool((p.get("spec") or {}).get("nodeName")), p["metadata"]["name"])
                )
                for pod in extra[:-missing]:
                    self._delete("pods", rc["metadata"]["namespace"], pod["metadata"]["name"])

    def _pod_name(self, rc: Obj, prefix: str) -> str:
        rng = self.controllers.cluster.rng
        pods = self._store.storage("pods")
        while True:
            name = prefix + random_suffix(rng)
            if pods.get(rc["metadata"]["namespace"], name) is None:
                return name

    def _pod_template(self, cluster: str, group: str, node_type: str, group_spec: Mapping[str, Any]) -> Obj:
        template: Obj = clone(group_spec.get("template") or {})
        md = template.setdefault("metadata", {})
        if not isinstance(md, dict):
            md = template["metadata"] = {}
        given = md.get("labels")
        labels: Obj = given if isinstance(given, dict) else {}
        md["labels"] = {
            **labels,
            CLUSTER_LABEL: cluster,
            NODE_TYPE_LABEL: node_type,
            GROUP_LABEL: group,
            IDENTIFIER_LABEL: f"{cluster}-{node_type}"[:63],
            IS_RAY_NODE_LABEL: "yes",
            APP_NAME_LABEL: "kuberay",
            CREATED_BY_LABEL: CREATED_BY,
        }
        return template

    def _cluster_status(
        self,
        rc: Obj,
        spec: Mapping[str, Any],
        groups: list[Mapping[str, Any]],
        pods: list[Obj],
        suspended: bool,
    ) -> None:
        old = _map(rc.get("status"))
        now = self._now()
        heads = [p for p in pods if (p["metadata"].get("labels") or {}).get(NODE_TYPE_LABEL) == "head"]
        workers = [p for p in pods if (p["metadata"].get("labels") or {}).get(NODE_TYPE_LABEL) == "worker"]
        desired = sum(worker_pods_wanted(g) for g in groups)
        hosts = [max(1, _count(g, "", "numOfHosts") or 1) for g in groups]
        minimum = sum(
            0 if g.get("suspend") is True else (_count(g, "", "minReplicas") or 0) * h
            for g, h in zip(groups, hosts, strict=True)
        )
        maximum = min(
            INT32_MAX,
            sum(
                0 if g.get("suspend") is True else (_count(g, "", "maxReplicas") or INT32_MAX) * h
                for g, h in zip(groups, hosts, strict=True)
            ),
        )
        head_ready = any(_ready(p) for p in heads)
        all_ready = head_ready and len(workers) >= desired and all(_ready(p) for p in workers)
        totals = _resources(spec["headGroupSpec"].get("template"))
        for group in groups:
            count = worker_pods_wanted(group)
            for resource, amount in _resources(group.get("template")).items():
                totals[resource] = totals.get(resource, Fraction(0)) + amount * count
        gpus = sum((v for k, v in totals.items() if k.endswith("gpu")), Fraction(0))
        status: Obj = {
            "desiredWorkerReplicas": desired,
            "minWorkerReplicas": minimum,
            "maxWorkerReplicas": maximum,
            "availableWorkerReplicas": sum(1 for p in workers if _phase(p) == "Running"),
            "readyWorkerReplicas": sum(1 for p in workers if _ready(p)),
            "desiredCPU": format_cpu(float(totals.get("cpu", 0)) * 1000),
            "desiredMemory": format_memory(float(totals.get("memory", 0))),
            "desiredGPU": str(int(gpus)) if gpus == int(gpus) else str(float(gpus)),
            "observedGeneration": rc["metadata"].get("generation", 1),
        }
        conditions = _conditions(old)
        if heads:
            head = heads[0]
            status["head"] = {"podName": head["metadata"]["name"]}
            if (head.get("status") or {}).get("podIP"):
                status["head"]["podIP"] = head["status"]["podIP"]
        provisioned = any(
            c.get("type") == "RayClusterProvisioned" and c.get("status") == "True" for c in conditions
        )
        new_conditions = [
            _condition(
                "HeadPodReady",
                "True" if head_ready else "False",
                "HeadPodRunningAndReady"
                if head_ready
                else ("HeadPodNotReady" if heads else "HeadPodNotFound"),
                "" if head_ready else "the head pod is not running and ready",
                now,
                conditions,
            ),
            _condition(
                "RayClusterProvisioned",
                "True" if provisioned or all_ready else "False",
                "AllPodRunningAndReadyFirstTime"
                if provisioned or all_ready
                else "RayClusterPodsProvisioning",
                "" if provisioned or all_ready else "the cluster's pods are being provisioned",
                now,
                conditions,
            ),
        ]
        status["conditions"] = new_conditions
        if suspended:
            status["state"] = "suspended"
        elif old.get("state") == "ready" or all_ready:
            status["state"] = "ready"
            status["readyTimestamp"] = old.get("readyTimestamp") or now
        self._write_status(CLUSTERS, rc, status)

    # --- RayJob ---------------------------------------------------------------------------------------------
    def _job(self, job: Obj) -> None:
        md = job["metadata"]
        ns = md["namespace"]
        spec = job.get("spec")
        old = _map(job.get("status"))
        problem = job_problem(spec)
        if problem is not None:
            self._refuse(JOBS, job, "InvalidRayJobSpec", problem)
            message = f"{problem.field}: {problem.problem}"
            self._write_status(
                JOBS, job, {**old, "jobDeploymentStatus": "ValidationFailed", "reason": message}
            )
            return
        assert isinstance(spec, Mapping)
        now = self._now()
        status: Obj = {k: v for k, v in old.items() if k != "reason"}
        deployment = _text(old.get("jobDeploymentStatus"))
        selector = spec.get("clusterSelector")
        selected = selector.get(CLUSTER_LABEL) if isinstance(selector, Mapping) else None
        name = _text(old.get("rayClusterName")) or _text(selected)
        if deployment in ("Complete", "Failed"):
            if (
                name
                and spec.get("shutdownAfterJobFinishes") is True
                and not spec.get("ttlSecondsAfterFinished")
                and not selected
            ):
                self._delete(CLUSTERS, ns, name)
            return
        if spec.get("suspend") is True:
            if name and not selected:
                self._delete(CLUSTERS, ns, name)
            self._delete(_JOBS_BATCH, ns, md["name"]) if self._store.storage(_JOBS_BATCH).get(
                ns, md["name"]
            ) else None
            status.update({"jobDeploymentStatus": "Suspended", "jobStatus": ""})
            status.pop("rayClusterName", None)
            self._write_status(JOBS, job, status)
            return
        if not name:
            name = self._new_cluster_name(md["name"], ns)
        rc: Obj | None
        if selected:
            rc = self._store.storage(CLUSTERS).get(ns, name)
        else:
            rc = self._child_cluster(job, JOBS, "RayJob", spec["rayClusterSpec"], name)
        status["rayClusterName"] = name
        status.setdefault(
            "jobId", f"{md['name'][:NAME_PREFIX_MAX]}-{random_suffix(self.controllers.cluster.rng)}"
        )
        status.setdefault("startTime", now)
        status["dashboardURL"] = f"{name}-head-svc.{ns}.svc.cluster.local:{DASHBOARD_PORT}"
        status["observedGeneration"] = md.get("generation", 1)
        status.setdefault("jobDeploymentStatus", "Initializing")
        if deployment in ("", "Suspended"):
            status["jobDeploymentStatus"] = "Initializing"
        cluster_status = _map((rc or {}).get("status"))
        status["rayClusterStatus"] = clone(cluster_status)
        if rc is not None and cluster_status.get("state") == "ready":
            mode = str(spec.get("submissionMode") or "K8sJobMode")
            if mode == "K8sJobMode":
                self._submitter(job, spec, rc, status, now)
            elif mode == "InteractiveMode":
                status["jobDeploymentStatus"] = "Waiting"
            else:
                status.update({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
        self._write_status(JOBS, job, status)

    def _submitter(self, job: Obj, spec: Mapping[str, Any], rc: Obj, status: Obj, now: str) -> None:
        md = job["metadata"]
        ns = md["namespace"]
        submitter = self._store.storage(_JOBS_BATCH).get(ns, md["name"])
        if submitter is None:
            manifest = self._submitter_job(job, spec, rc, status)
            if not self.controllers.create_owned(job, JOBS, _JOBS_BATCH, manifest):
                return
            submitter = self._store.storage(_JOBS_BATCH).get(ns, md["name"])
        status["jobDeploymentStatus"] = "Running"
        job_status = _map((submitter or {}).get("status"))
        done = {c.get("type") for c in _conditions(job_status) if c.get("status") == "True"}
        if "Complete" in done:
            status.update({"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"})
        elif "Failed" in done:
            status.update(
                {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "SubmissionFailed"}
            )
        elif job_status.get("ready"):
            status["jobStatus"] = "RUNNING"
        else:
            status["jobStatus"] = "PENDING"
        if status["jobDeploymentStatus"] in ("Complete", "Failed"):
            status.setdefault("endTime", now)

    def _submitter_job(self, job: Obj, spec: Mapping[str, Any], rc: Obj, status: Obj) -> Obj:
        md = job["metadata"]
        given = spec.get("submitterPodTemplate")
        template: Obj = clone(given) if isinstance(given, Mapping) else _default_submitter(rc)
        template_md = template["metadata"] = _map(template.get("metadata"))
        pod_spec = template["spec"]  # checked: an object with containers
        pod_spec.setdefault("restartPolicy", "Never")
        containers = pod_spec.get("containers") or []
        if containers and isinstance(containers[0], dict) and not containers[0].get("command"):
            entrypoint = str(spec.get("entrypoint") or "")
            address = (
                f"{status['rayClusterName']}-head-svc.{md['namespace']}.svc.cluster.local:{DASHBOARD_PORT}"
            )
            containers[0]["command"] = ["/bin/bash", "-ce", "--"]
            containers[0]["args"] = [
                f"ray job submit --address http://{address} --submission-id {status['jobId']} -- {entrypoint}"
            ]
        run_seconds = (md.get("annotations") or {}).get(RUN_SECONDS) or (md.get("labels") or {}).get(
            RUN_SECONDS
        )
        annotations = _map(template_md.get("annotations"))
        if run_seconds and RUN_SECONDS not in annotations:
            template_md["annotations"] = {**annotations, RUN_SECONDS: run_seconds}
        config = spec.get("submitterConfig")
        backoff = config.get("backoffLimit") if isinstance(config, Mapping) else None
        labels = {
            ORIGINATED_FROM_NAME_LABEL: md["name"],
            ORIGINATED_FROM_CRD_LABEL: "RayJob",
            CREATED_BY_LABEL: CREATED_BY,
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": md["name"],
                "namespace": md["namespace"],
                "labels": labels,
                "ownerReferences": [controller_ref(job)],
            },
            "spec": {
                "backoffLimit": backoff
                if isinstance(backoff, int) and not isinstance(backoff, bool) and backoff >= 0
                else DEFAULT_SUBMITTER_BACKOFF,
                "template": template,
            },
        }

    # --- RayService -----------------------------------------------------------------------------------------
    def _service(self, svc: Obj) -> None:
        md = svc["metadata"]
        spec = svc.get("spec")
        old = _map(svc.get("status"))
        problem = cluster_problem(
            spec.get("rayClusterConfig") if isinstance(spec, Mapping) else None, "spec.rayClusterConfig"
        )
        if not isinstance(spec, Mapping):
            problem = SpecError("spec", "must be an object")
        if problem is not None:
            self._refuse(SERVICES, svc, "InvalidRayServiceSpec", problem)
            self._write_status(SERVICES, svc, {**old, "reason": f"{problem.field}: {problem.problem}"})
            return
        assert isinstance(spec, Mapping)
        active = _text(_map(old.get("activeServiceStatus")).get("rayClusterName"))
        pending = _text(_map(old.get("pendingServiceStatus")).get("rayClusterName"))
        name = active or pending or self._new_cluster_name(md["name"], md["namespace"])
        rc = self._child_cluster(svc, SERVICES, "RayService", spec["rayClusterConfig"], name)
        cluster_status = _map((rc or {}).get("status"))
        now = self._now()
        conditions = _conditions(old)
        status: Obj = {"observedGeneration": md.get("generation", 1)}
        if rc is not None and cluster_status.get("state") == "ready":
            running = [p for p in self.controllers.owned_pods(rc) if _phase(p) == "Running"]
            status.update(
                {
                    "serviceStatus": "Running",
                    "numServeEndpoints": len(running),
                    "activeServiceStatus": {
                        "rayClusterName": name,
                        "rayClusterStatus": clone(cluster_status),
                    },
                    "pendingServiceStatus": {},
                    "conditions": [
                        _condition(
                            "Ready",
                            "True",
                            "NonZeroServeEndpoints",
                            "Number of serve endpoints is greater than 0",
                            now,
                            conditions,
                        ),
                        _condition(
                            "UpgradeInProgress",
                            "False",
                            "NoPendingCluster",
                            "No pending cluster exists",
                            now,
                            conditions,
                        ),
                    ],
                }
            )
        else:
            status.update(
                {
                    "numServeEndpoints": 0,
                    "activeServiceStatus": {},
                    "pendingServiceStatus": {
                        "rayClusterName": name,
                        "rayClusterStatus": clone(cluster_status),
                    },
                    "conditions": [
                        _condition(
                            "Ready", "False", "Initializing", "RayService is initializing", now, conditions
                        ),
                        _condition(
                            "UpgradeInProgress",
                            "False",
                            "NoActiveCluster",
                            "No active cluster exists, and the RayService is initializing",
                            now,
                            conditions,
                        ),
                    ],
                }
            )
        self._write_status(SERVICES, svc, status)


def _pod_prefix(cluster: str, group: str, node_type: str) -> str:
    base = cluster if node_type == "head" else f"{cluster}-{group}"
    return f"{base[:NAME_PREFIX_MAX]}-{node_type}-".lower()


def _default_submitter(rc: Obj) -> Obj:
    """KubeRay's ``GetDefaultSubmitterTemplate``: the head container's image, small requests, Never."""
    head = ((rc.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}
    containers = (head.get("spec") or {}).get("containers") or [{}]
    image = containers[0].get("image", "rayproject/ray:latest") if isinstance(containers[0], Mapping) else ""
    return {
        "metadata": {},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "resources": {
                        "limits": {"cpu": "1", "memory": "1Gi"},
                        "requests": {"cpu": "500m", "memory": "200Mi"},
                    },
                }
            ],
        },
    }


def job_problem(spec: Any) -> SpecError | None:
    """What KubeRay's ``ValidateRayJobSpec`` (and its CRD schema) refuse in a RayJob spec; None when valid."""
    try:
        _check_job(spec)
    except SpecError as problem:
        return problem
    return None


def _check_job(spec: Any) -> None:
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "must be an object")
    suspend = _flag(spec, "spec", "suspend")
    shutdown = _flag(spec, "spec", "shutdownAfterJobFinishes")
    if spec.get("submissionMode", "K8sJobMode") not in SUBMISSION_MODES:
        raise SpecError("spec.submissionMode", f"must be one of {', '.join(SUBMISSION_MODES)}")
    if suspend and not shutdown:
        raise SpecError(
            "spec.suspend",
            "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended",
        )
    if spec.get("submitterPodTemplate") is not None:
        _check_template(spec["submitterPodTemplate"], "spec.submitterPodTemplate", "submitterPodTemplate")
    ttl = spec.get("ttlSecondsAfterFinished", 0)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
        raise SpecError("spec.ttlSecondsAfterFinished", "must be a non-negative integer")
    selector = spec.get("clusterSelector")
    if selector is None:
        if spec.get("rayClusterSpec") is None:
            raise SpecError("spec.rayClusterSpec", "one of RayClusterSpec or ClusterSelector must be set")
        _check_cluster(spec["rayClusterSpec"], "spec.rayClusterSpec")
        return
    name = selector.get(CLUSTER_LABEL) if isinstance(selector, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SpecError(
            f"spec.clusterSelector[{CLUSTER_LABEL}]", "cluster name in ClusterSelector should not be empty"
        )
    if suspend:
        raise SpecError("spec.suspend", "the ClusterSelector mode doesn't support the suspend operation")


OPERATOR = OperatorSpec(
    name="kuberay",
    crds=RAY_CRDS,
    storages=_COMPONENTS,
    owners={
        (f"{GROUP}/{version}", kind): f"{GROUP}/{plural}"
        for version in VERSIONS
        for kind, plural, _ in _KINDS
    },
    start=RayOperator,
)
