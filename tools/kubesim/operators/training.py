"""Kubeflow training jobs in the simulated API server: their CRDs, served from the start, and a simulated
training operator that creates their replicas' pods, so that a PyTorchJob written for KAI applies unchanged.

**CRDs** (`TRAINING_CRDS`, created by `Cluster` at start like the built-in priority classes, through `OPERATOR`): PyTorchJob,
TFJob, XGBoostJob and JAXJob (kubeflow.org/v1, Kubeflow Training Operator v1) and MPIJob
(kubeflow.org/v2beta1, MPI Operator v2); namespaced, schema-less, with the status subresource.

**Controller** (`TrainingOperator`, started by `tools.kubesim.controllers.Controllers` through `OPERATOR`):

- Training Operator v1 kinds: one pod per replica index of each replica spec (``spec.pytorchReplicaSpecs``,
  ``tfReplicaSpecs``, ``xgbReplicaSpecs``, ``jaxReplicaSpecs``), named ``<job>-<replica type lowercased>-<i>``
  and labelled ``training.kubeflow.org/job-name``, ``replica-type`` (lowercased), ``replica-index`` and
  ``operator-name`` (``pytorchjob-controller``, ...), plus ``training.kubeflow.org/job-role: master`` where
  the operator's ``IsMasterRole`` says so: the Master of a PyTorchJob or XGBoostJob, the Chief or Master of a
  TFJob (worker 0 when it has neither), index 0 of a JAXJob.
- MPIJob: the workers as pods ``<job>-worker-<i>`` (``job-role: worker``, ``replica-index``) and the
  launcher as a batch/v1 Job ``<job>-launcher`` (``job-role: launcher``) whose pod kubesim's Job controller
  creates, as MPI Operator v2 does; labels ``training.kubeflow.org/job-name`` and ``operator-name:
  mpi-operator``. With ``launcherCreationPolicy: WaitForWorkersReady`` the launcher Job is created only
  once every worker pod is Ready (the operator's default, ``AtStartup``, creates it with the workers).
- Every object carries the template's labels, annotations and spec (schedulerName, priorityClassName, ...)
  and a controller ownerReference to the job (blockOwnerDeletion); a replica spec's ``restartPolicy`` becomes
  the pod's (``ExitCode`` as ``Never``). A deleted pod is recreated while the job is not finished.
- Status: ``replicaStatuses`` (active/succeeded/failed per replica type), ``startTime``, and the conditions
  Created, then Running (the leader's pod runs: Master, Chief, the job-role master or the launcher; without
  one, every pod runs), then Succeeded (the leader succeeded; without one, every pod) with Running set to
  False, or Failed when a pod fails; ``completionTime`` once finished. An elastic PyTorchJob
  (``spec.elasticPolicy``) without a Master runs once any worker runs and succeeds once any worker
  succeeded, as the training operator decides for it. Pods are kept when the job finishes (cleanPodPolicy
  None).
- A malformed replica spec (the replica specs or one of them not an object, ``replicas`` not a whole
  number from 0 to 2^31-1), which the real API server's schema refuses, creates nothing for the job and
  records a Warning Event ``<Kind>FailedValidation`` naming the field, as the operator reports a job that
  fails its validation; kubesim has no CRD schema.

Not simulated: the per-replica headless Services, the framework environment variables (MASTER_ADDR, RANK,
TF_CONFIG, PET_NNODES, ...), the MPI hostfile ConfigMap and SSH Secret, an elastic job's
HorizontalPodAutoscaler (``elasticPolicy.metrics``) and the scale subresource it drives, suspend policies,
restarts by exit code, backoffLimit and activeDeadlineSeconds. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tools.kubesim.objects import clone, condition, controller_ref, is_ready, put_condition, rfc3339
from tools.kubesim.operators import AGE_COLUMN, OperatorSpec, custom_resource_definition

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = [
    "JOB_NAME_LABEL",
    "JOB_ROLE_LABEL",
    "OPERATOR_NAME_LABEL",
    "REPLICA_INDEX_LABEL",
    "REPLICA_TYPE_LABEL",
    "TRAINING_CRDS",
    "TRAINING_KINDS",
    "TrainingKind",
    "TrainingOperator",
]

Obj = dict[str, Any]

GROUP = "kubeflow.org"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"

_TERMINAL = ("Succeeded", "Failed")

WAIT_FOR_WORKERS = "WaitForWorkersReady"
"""MPI Operator v2's ``launcherCreationPolicy`` that creates the launcher once every worker is ready."""


@dataclass(frozen=True)
class TrainingKind:
    """One kind of training job: its API and how its operator names and labels its replicas."""

    kind: str
    version: str
    plural: str
    replica_specs: str
    """The spec field holding {replica type: replica spec}."""
    operator_name: str

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    @property
    def storage(self) -> str:
        return f"{GROUP}/{self.plural}"

    def is_master(self, types: list[str], rtype: str, index: int) -> bool:
        """The training operator's ``IsMasterRole`` for this kind."""
        if self.kind == "TFJob":
            if "Chief" in types or "Master" in types:
                return rtype in ("Chief", "Master")
            return rtype == "Worker" and index == 0
        if self.kind == "JAXJob":
            return index == 0
        return rtype == "Master"


TRAINING_KINDS: tuple[TrainingKind, ...] = (
    TrainingKind("PyTorchJob", "v1", "pytorchjobs", "pytorchReplicaSpecs", "pytorchjob-controller"),
    TrainingKind("TFJob", "v1", "tfjobs", "tfReplicaSpecs", "tfjob-controller"),
    TrainingKind("XGBoostJob", "v1", "xgboostjobs", "xgbReplicaSpecs", "xgboostjob-controller"),
    TrainingKind("JAXJob", "v1", "jaxjobs", "jaxReplicaSpecs", "jaxjob-controller"),
    TrainingKind("MPIJob", "v2beta1", "mpijobs", "mpiReplicaSpecs", "mpi-operator"),
)
_BY_STORAGE = {k.storage: k for k in TRAINING_KINDS}


TRAINING_CRDS: tuple[Obj, ...] = tuple(
    custom_resource_definition(
        GROUP, k.kind, k.plural, [k.version], subresources={"status": {}}, columns=[AGE_COLUMN]
    )
    for k in TRAINING_KINDS
)
"""The CustomResourceDefinitions kubesim serves from its start."""


MAX_REPLICAS = 1000
"""The most pods kubesim creates for one replica spec: it has no CRD schema to refuse a hostile count, and
a count of a billion would fill its memory."""


INT32_MAX = 2**31 - 1


def replica_spec_problem(specs: object, field: str) -> tuple[str, str] | None:
    """The first (field, problem) of a malformed replica specs field, which the real API server's schema
    would refuse; None when every replica spec is an object whose ``replicas`` (when set) is a whole
    number from 0 to 2^31-1."""
    if specs is None:
        return None
    if not isinstance(specs, dict):
        return f"spec.{field}", "must be an object of replica specs"
    for rtype, spec in specs.items():
        if not isinstance(spec, dict):
            return f"spec.{field}.{rtype}", "must be a replica spec object"
        raw = spec.get("replicas", 1)
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= INT32_MAX:
            shown = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:40] + "..."
            return (
                f"spec.{field}.{rtype}.replicas",
                f"must be a whole number from 0 to {INT32_MAX}, got {shown}",
            )
    return None


def replicas_of(spec: Obj) -> int:
    """A replica spec's ``replicas`` (1 when absent); what the real API server's schema (an int32 >= 0) would
    refuse (text, a bool, a float, a negative, "²", 5,000 digits) creates no pod, and a count beyond
    `MAX_REPLICAS` creates that many."""
    raw = spec.get("replicas", 1)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        return 0
    return min(raw, MAX_REPLICAS)


def _elastic_without_master(kind: TrainingKind, job: Obj, specs: Obj) -> bool:
    """A PyTorchJob with an elastic policy and no Master replica."""
    return (
        kind.kind == "PyTorchJob"
        and isinstance((job.get("spec") or {}).get("elasticPolicy"), dict)
        and "Master" not in specs
    )


def _phase(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


class TrainingOperator:
    """Kubeflow's training-operator and MPI operator, reconciling one job at a time for `Controllers`."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers

    def reconcile(self, storage: str, job: Obj) -> None:
        kind = _BY_STORAGE[storage]
        status = job.get("status") or {}
        finished = any(
            c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
        raw_specs = (job.get("spec") or {}).get(kind.replica_specs)
        problem = replica_spec_problem(raw_specs, kind.replica_specs)
        if problem is not None:
            field, message = problem
            self.controllers.cluster.record_event(
                job, "Warning", f"{kind.kind}FailedValidation", f"{field}: {message}", kind.operator_name
            )
            return
        specs: Obj = raw_specs or {}
        if not finished:
            if kind.kind == "MPIJob":
                self._mpi_objects(kind, job, specs)
            else:
                self._pods(kind, job, specs)
        self._status(kind, job, specs)

    # --- creating replicas ------------------------------------------------------------------------------------
    def _base_labels(self, kind: TrainingKind, job: Obj) -> dict[str, str]:
        return {OPERATOR_NAME_LABEL: kind.operator_name, JOB_NAME_LABEL: job["metadata"]["name"]}

    def _replica_template(self, spec: Obj, labels: dict[str, str]) -> Obj:
        template: Obj = clone(spec.get("template") or {})
        md = template.setdefault("metadata", {})
        md["labels"] = {**(md.get("labels") or {}), **labels}
        pod_spec = template.setdefault("spec", {})
        policy = spec.get("restartPolicy")
        if policy:
            pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        return template

    def _pods(self, kind: TrainingKind, job: Obj, specs: Obj) -> None:
        types = list(specs)
        for rtype, spec in specs.items():
            if not isinstance(spec, dict):
                continue
            for index in range(replicas_of(spec)):
                labels = {
                    **self._base_labels(kind, job),
                    REPLICA_TYPE_LABEL: rtype.lower(),
                    REPLICA_INDEX_LABEL: str(index),
                }
                if kind.is_master(types, rtype, index):
                    labels[JOB_ROLE_LABEL] = "master"
                name = f"{job['metadata']['name']}-{rtype.lower()}-{index}"
                if not self._ensure_pod(kind, job, name, self._replica_template(spec, labels)):
                    return

    def _mpi_objects(self, kind: TrainingKind, job: Obj, specs: Obj) -> None:
        name = job["metadata"]["name"]
        worker = specs.get("Worker")
        workers = replicas_of(worker) if isinstance(worker, dict) else 0
        if isinstance(worker, dict):
            for index in range(replicas_of(worker)):
                labels = {
                    **self._base_labels(kind, job),
                    JOB_ROLE_LABEL: "worker",
                    REPLICA_INDEX_LABEL: str(index),
                }
                if not self._ensure_pod(
                    kind, job, f"{name}-worker-{index}", self._replica_template(worker, labels)
                ):
                    return
        launcher = specs.get("Launcher")
        if not isinstance(launcher, dict):
            return
        ns = job["metadata"]["namespace"]
        if self.controllers.cluster.store.storage("batch/jobs").get(ns, f"{name}-launcher") is not None:
            return
        policy = (job.get("spec") or {}).get("launcherCreationPolicy")
        if policy == WAIT_FOR_WORKERS and self._ready_workers(job) < workers:
            return
        template = self._replica_template(
            launcher, {**self._base_labels(kind, job), JOB_ROLE_LABEL: "launcher"}
        )
        template["spec"].setdefault("restartPolicy", "Never")
        launcher_job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{name}-launcher",
                "namespace": ns,
                "labels": dict(template["metadata"]["labels"]),
                "ownerReferences": [controller_ref(job)],
            },
            "spec": {"backoffLimit": 0, "template": template},
        }
        self.controllers.create_owned(job, kind.storage, "batch/jobs", launcher_job)

    def _ready_workers(self, job: Obj) -> int:
        """The job's worker pods that are Ready (the MPI operator's ``countReadyWorkerPods``)."""
        return sum(
            1
            for pod in self.controllers.owned_pods(job)
            if (pod["metadata"].get("labels") or {}).get(JOB_ROLE_LABEL) == "worker"
            and not pod["metadata"].get("deletionTimestamp")
            and is_ready(pod)
        )

    def _ensure_pod(self, kind: TrainingKind, job: Obj, name: str, template: Obj) -> bool:
        """Create the pod `name` from `template` unless it exists or waits for admission; False on a refusal."""
        ctl = self.controllers
        ns = job["metadata"]["namespace"]
        if ctl.cluster.store.storage("pods").get(ns, name) is not None or name in ctl.waiting_for(job):
            return True
        return ctl.create_pod_from(job, kind.storage, name, template)

    # --- status -----------------------------------------------------------------------------------------------
    def _status(self, kind: TrainingKind, job: Obj, specs: Obj) -> None:
        ctl = self.controllers
        md = job["metadata"]
        pods = ctl.owned_pods(job)
        by_type: dict[str, list[Obj]] = {}
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            rtype = labels.get(REPLICA_TYPE_LABEL) or labels.get(JOB_ROLE_LABEL) or ""
            by_type.setdefault(rtype, []).append(pod)
        leaders: list[Obj] = []
        replica_statuses: Obj = {}
        for rtype in specs:
            key = rtype.lower()
            group = by_type.get(key, [])
            if kind.kind == "MPIJob" and rtype == "Launcher":
                group = self._launcher_pods(job)
                leaders = group
            replica_statuses[rtype] = {
                "active": sum(1 for p in group if _phase(p) not in _TERMINAL),
                "succeeded": sum(1 for p in group if _phase(p) == "Succeeded"),
                "failed": sum(1 for p in group if _phase(p) == "Failed"),
            }
        if kind.kind != "MPIJob":
            leaders = [p for p in pods if (p["metadata"].get("labels") or {}).get(JOB_ROLE_LABEL) == "master"]
            if kind.kind == "JAXJob":
                leaders = []
        all_pods = pods + (self._launcher_pods(job) if kind.kind == "MPIJob" else [])
        expected = sum(replicas_of(s) for s in specs.values() if isinstance(s, dict))
        watched = leaders or all_pods
        complete = len(all_pods) >= expected
        running = (
            bool(watched)
            and (bool(leaders) or complete)
            and all(_phase(p) in ("Running", "Succeeded") for p in watched)
        )
        succeeded = (
            bool(watched) and (bool(leaders) or complete) and all(_phase(p) == "Succeeded" for p in watched)
        )
        if _elastic_without_master(kind, job, specs):
            # The training operator: an elastic job runs while any worker runs, and is done once one is.
            running = any(_phase(p) == "Running" for p in all_pods)
            succeeded = any(_phase(p) == "Succeeded" for p in all_pods)
        failed = [p for p in all_pods if _phase(p) == "Failed"]

        old = job.get("status") or {}
        now = rfc3339(ctl.cluster.now())
        conditions: list[Obj] = [dict(c) for c in old.get("conditions") or ()]
        ref = f"{kind.kind} {md['namespace']}/{md['name']}"

        def set_condition(type_: str, status: str, reason: str, message: str) -> None:
            """Set a JobCondition (a False one only replaces an existing one, as the operator does)."""
            new = condition(type_, status, reason, message, lastUpdateTime=now, lastTransitionTime=now)
            put_condition(conditions, new)

        done = any(c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True" for c in conditions)
        set_condition("Created", "True", f"{kind.kind}Created", f"{ref} is created.")
        if not done:
            if succeeded:
                set_condition("Running", "False", f"{kind.kind}Running", f"{ref} is running.")
                set_condition("Succeeded", "True", f"{kind.kind}Succeeded", f"{ref} successfully completed.")
            elif failed:
                set_condition("Running", "False", f"{kind.kind}Running", f"{ref} is running.")
                pod_name = failed[0]["metadata"]["name"]
                set_condition(
                    "Failed", "True", f"{kind.kind}Failed", f"{ref} is failed because pod {pod_name} failed."
                )
            elif running:
                set_condition("Running", "True", f"{kind.kind}Running", f"{ref} is running.")
        status: Obj = {"conditions": conditions, "replicaStatuses": replica_statuses}
        if old.get("startTime") or all_pods:
            status["startTime"] = old.get("startTime") or now
        finished_now = any(
            c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True" for c in conditions
        )
        if finished_now:
            status["completionTime"] = old.get("completionTime") or now
        current = ctl.cluster.store.storage(kind.storage).get(md["namespace"], md["name"])
        if current is not None and current["metadata"].get("uid") == md.get("uid"):
            ctl.write_status(kind.storage, current, status)

    def _launcher_pods(self, job: Obj) -> list[Obj]:
        md = job["metadata"]
        launcher = self.controllers.cluster.store.storage("batch/jobs").get(
            md["namespace"], f"{md['name']}-launcher"
        )
        if launcher is None:
            return []
        return self.controllers.owned_pods(launcher)


OPERATOR = OperatorSpec(
    name="training",
    crds=TRAINING_CRDS,
    storages={k.storage: k.operator_name for k in TRAINING_KINDS},
    owners={(k.api_version, k.kind): k.storage for k in TRAINING_KINDS},
    start=TrainingOperator,
)
