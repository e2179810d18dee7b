"""JobSets in the simulated API server: the CRD, served from the start, and a simulated JobSet controller that
creates each replicated job's batch Jobs, so that a JobSet written for KAI (or for JobSet's own docs)
applies unchanged and kubesim's Job controller runs its pods.

**CRD** (`JOBSET_CRD`, created by `Cluster` at start through `OPERATOR`): ``jobset.x-k8s.io/v1alpha2``
JobSet, namespaced, schema-less, with the status subresource and JobSet's printer columns (TerminalState,
Restarts, Suspended, Age).

**Controller** (`JobSetController`, started by `tools.kubesim.controllers.Controllers` through `OPERATOR`):

- For each replicated job, ``replicas`` (default 1) batch/v1 Jobs named ``<jobset>-<replicated job>-<index>``
  from its Job template, owned by the JobSet (controller, blockOwnerDeletion). The Jobs and their pod
  templates carry the template's labels and annotations plus JobSet's: ``jobset.sigs.k8s.io/jobset-name``,
  ``jobset-uid``, ``replicatedjob-name``, ``replicatedjob-replicas``, ``global-replicas``, ``job-index``,
  ``job-global-index``, ``job-key`` (the SHA-1 of ``<namespace>/<job>``) and ``restart-attempt``, as labels
  and as annotations, so kubesim's Job controller gives every pod they create (KAI's jobset plugin reads
  the replicated-job name and job index there). The pod template's ``subdomain`` is the JobSet's network
  subdomain (default: its name) unless ``network.enableDNSHostnames`` is false; a suspended JobSet's Jobs
  are created suspended.
- ``startupPolicy.startupPolicyOrder``: ``AnyOrder`` (the default) creates every Job at once; ``InOrder``
  creates a replicated job's Jobs only once every Job of the one before is ready (ready and succeeded pods
  reach min(parallelism, completions)), with the StartupPolicyInProgress / StartupPolicyCompleted
  conditions.
- Status: ``replicatedJobsStatus`` (ready, succeeded, failed, active, suspended Jobs per replicated job),
  ``restarts``, ``terminalState`` and the conditions ``Completed`` (``successPolicy``: ``All`` (default)
  or ``Any`` of the Jobs of its ``targetReplicatedJobs``, every replicated job when none, complete) and
  ``Failed`` (a Job failed after ``failurePolicy.maxRestarts`` restarts; below it every Job is deleted,
  ``restarts`` counts one more and the Jobs are created again). A finished JobSet deletes its unfinished
  Jobs, as JobSet's controller does.
- A spec the real API server's schema or JobSet's webhook would refuse (no replicated jobs, a name missing
  or repeated, a count that is not a whole number >= 0, an unknown startup order or success operator, a
  template that is not an object) creates nothing and records a Warning ``InvalidSpec`` Event naming the
  field; replicas beyond `MAX_JOBS` Jobs in all, and a parallelism beyond `MAX_PARALLELISM`, are cut.

Not simulated: failure policy rules and their actions, ``dependsOn``, coordinator, exclusive placement,
the headless Service, TTL after finished, suspend after creation, managedBy. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tools.kubesim.errors import ApiError
from tools.kubesim.objects import clone, condition, controller_ref, put_condition, rfc3339
from tools.kubesim.operators import AGE_COLUMN, OperatorSpec, custom_resource_definition, printer_column

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = [
    "API_VERSION",
    "JOBSET_CRD",
    "JOBSET_NAME_LABEL",
    "JOB_INDEX_LABEL",
    "MAX_JOBS",
    "MAX_PARALLELISM",
    "REPLICATED_JOB_LABEL",
    "STORAGE",
    "InvalidJobSet",
    "JobSetController",
    "plan_of",
]

Obj = dict[str, Any]

GROUP = "jobset.x-k8s.io"
VERSION = "v1alpha2"
KIND = "JobSet"
PLURAL = "jobsets"
API_VERSION = f"{GROUP}/{VERSION}"
STORAGE = f"{GROUP}/{PLURAL}"
COMPONENT = "jobset-controller"
JOBS = "batch/jobs"

_PREFIX = "jobset.sigs.k8s.io/"
JOBSET_NAME_LABEL = _PREFIX + "jobset-name"
JOBSET_UID_LABEL = _PREFIX + "jobset-uid"
REPLICATED_JOB_LABEL = _PREFIX + "replicatedjob-name"
REPLICATED_JOB_REPLICAS_LABEL = _PREFIX + "replicatedjob-replicas"
GLOBAL_REPLICAS_LABEL = _PREFIX + "global-replicas"
JOB_INDEX_LABEL = _PREFIX + "job-index"
JOB_GLOBAL_INDEX_LABEL = _PREFIX + "job-global-index"
JOB_KEY_LABEL = _PREFIX + "job-key"
RESTART_ATTEMPT_LABEL = _PREFIX + "restart-attempt"

IN_ORDER = "InOrder"
ANY_ORDER = "AnyOrder"
MAX_JOBS = 1000
"""The most Jobs kubesim creates for one JobSet: it has no CRD schema to refuse a hostile count, and a
count of a billion would fill its memory."""
MAX_PARALLELISM = 1000
"""The most pods one of its Jobs runs at once (a larger ``parallelism`` is cut to it), for the same reason."""

_INT32_MAX = 2**31 - 1

JOBSET_CRD: Obj = custom_resource_definition(
    GROUP,
    KIND,
    PLURAL,
    [VERSION],
    subresources={"status": {}},
    columns=[
        printer_column("TerminalState", ".status.terminalState"),
        printer_column("Restarts", ".status.restarts"),
        printer_column("Suspended", ".spec.suspend"),
        AGE_COLUMN,
    ],
)
"""The JobSet CustomResourceDefinition kubesim serves from its start."""


class InvalidJobSet(Exception):  # noqa: N818 - a refusal reported as an Event, not a crash
    """A JobSet spec the real API server or JobSet's webhook would refuse; `field` names where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclass(frozen=True)
class ReplicatedJob:
    """One replicated job, checked: its name, Job count, pods per Job and Job template."""

    name: str
    replicas: int
    pods_per_job: int
    """min(parallelism, completions): how many pods a Job of it runs at once."""
    template: Obj
    """The JobTemplateSpec (metadata and spec)."""


@dataclass(frozen=True)
class Plan:
    """What a JobSet asks for, checked."""

    jobs: tuple[ReplicatedJob, ...]
    order: str
    success_any: bool
    success_targets: frozenset[str]
    max_restarts: int
    suspend: bool
    subdomain: str | None


def _count(value: object, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT32_MAX:
        raise InvalidJobSet(field, f"must be a whole number >= 0, got {_shown(value)}")
    return value


def _object(value: object, field: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidJobSet(field, f"must be an object, got {_shown(value)}")
    return value


def _strings(value: object, field: str) -> dict[str, str]:
    found = _object(value, field)
    for key, item in found.items():
        if not isinstance(item, str):
            raise InvalidJobSet(f"{field}[{key}]", f"must be a string, got {_shown(item)}")
    return found


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text):,} characters)"


def plan_of(js: Obj) -> Plan:
    """The JobSet's spec, checked; `InvalidJobSet` names the first field the real API would refuse."""
    spec = _object(js.get("spec"), "spec")
    raw = spec.get("replicatedJobs")
    if not isinstance(raw, list) or not raw:
        raise InvalidJobSet("spec.replicatedJobs", "must be a non-empty list")
    jobs: list[ReplicatedJob] = []
    total = 0
    for i, item in enumerate(raw):
        where = f"spec.replicatedJobs[{i}]"
        rj = _object(item, where)
        name = rj.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidJobSet(f"{where}.name", "missing")
        if any(j.name == name for j in jobs):
            raise InvalidJobSet(f"{where}.name", f"{name!r} is named twice")
        replicas = min(_count(rj.get("replicas"), f"{where}.replicas", 1), MAX_JOBS - total)
        total += replicas
        template = _object(rj.get("template"), f"{where}.template")
        metadata = _object(template.get("metadata"), f"{where}.template.metadata")
        _strings(metadata.get("labels"), f"{where}.template.metadata.labels")
        _strings(metadata.get("annotations"), f"{where}.template.metadata.annotations")
        job_spec = _object(template.get("spec"), f"{where}.template.spec")
        pods = _pod_template(job_spec, f"{where}.template.spec.template")
        pods_md = pods.get("metadata") or {}
        _strings(pods_md.get("labels"), f"{where}.template.spec.template.metadata.labels")
        _strings(pods_md.get("annotations"), f"{where}.template.spec.template.metadata.annotations")
        parallelism = min(
            _count(job_spec.get("parallelism"), f"{where}.template.spec.parallelism", 1), MAX_PARALLELISM
        )
        completions = _count(job_spec.get("completions"), f"{where}.template.spec.completions", parallelism)
        _count(job_spec.get("backoffLimit"), f"{where}.template.spec.backoffLimit", 6)
        if not isinstance(job_spec.get("suspend", False), bool):
            raise InvalidJobSet(f"{where}.template.spec.suspend", "must be true or false")
        jobs.append(ReplicatedJob(name, replicas, min(parallelism, completions), template))
    startup = _object(spec.get("startupPolicy"), "spec.startupPolicy")
    order = startup.get("startupPolicyOrder", ANY_ORDER)
    if order not in (ANY_ORDER, IN_ORDER):
        raise InvalidJobSet(
            "spec.startupPolicy.startupPolicyOrder", f"must be AnyOrder or InOrder, got {_shown(order)}"
        )
    success = _object(spec.get("successPolicy"), "spec.successPolicy")
    operator = success.get("operator", "All")
    if operator not in ("All", "Any"):
        raise InvalidJobSet("spec.successPolicy.operator", f"must be All or Any, got {_shown(operator)}")
    targets = success.get("targetReplicatedJobs") or []
    if not isinstance(targets, list) or not all(t in {j.name for j in jobs} for t in targets):
        raise InvalidJobSet(
            "spec.successPolicy.targetReplicatedJobs", "must name replicated jobs of the JobSet"
        )
    failure = _object(spec.get("failurePolicy"), "spec.failurePolicy")
    max_restarts = _count(failure.get("maxRestarts"), "spec.failurePolicy.maxRestarts", 0)
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        raise InvalidJobSet("spec.suspend", "must be true or false")
    network = _object(spec.get("network"), "spec.network")
    subdomain = network.get("subdomain") or js["metadata"]["name"]
    if not isinstance(subdomain, str):
        raise InvalidJobSet("spec.network.subdomain", f"must be a string, got {_shown(subdomain)}")
    return Plan(
        jobs=tuple(jobs),
        order=order,
        success_any=operator == "Any",
        success_targets=frozenset(targets),
        max_restarts=max_restarts,
        suspend=suspend,
        subdomain=None if network.get("enableDNSHostnames") is False else subdomain,
    )


def _pod_template(job_spec: Obj, field: str) -> Obj:
    pods = _object(job_spec.get("template"), field)
    _object(pods.get("metadata"), f"{field}.metadata")
    _object(pods.get("spec"), f"{field}.spec")
    return pods


def job_key(namespace: str, job: str) -> str:
    """JobSet's ``job-key``: the SHA-1 of the namespaced Job name."""
    return hashlib.sha1(f"{namespace}/{job}".encode(), usedforsecurity=False).hexdigest()


def _finished(obj: Obj, *types: str) -> bool:
    return any(
        c.get("type") in types and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


class JobSetController:
    """JobSet's controller, reconciling one JobSet at a time for `Controllers`."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers

    def reconcile(self, storage: str, js: Obj) -> None:  # noqa: ARG002 - one storage: jobsets
        try:
            plan = plan_of(js)
        except InvalidJobSet as exc:
            self.controllers.cluster.record_event(js, "Warning", "InvalidSpec", str(exc), COMPONENT)
            return
        jobs = self._jobs(js, plan)
        old = dict(js.get("status") or {})
        restarts = int(old.get("restarts") or 0)
        finished = old.get("terminalState") is not None
        if not finished:
            failed = any(_finished(j, "Failed") for group in jobs.values() for j in group)
            if failed and restarts < plan.max_restarts:
                self._delete(j for group in jobs.values() for j in group)
                old["restarts"] = restarts + 1
                old["restartsCountTowardsMax"] = int(old.get("restartsCountTowardsMax") or 0) + 1
                self._write(js, old)
                return
            if not failed and not self._succeeded(plan, jobs):
                self._create_missing(js, plan, restarts)
                jobs = self._jobs(js, plan)
        status = self._status(plan, jobs, old)
        self._write(js, status)
        if not finished and status.get("terminalState") is not None:
            self._delete(
                j for group in jobs.values() for j in group if not _finished(j, "Complete", "Failed")
            )

    # --- Jobs ------------------------------------------------------------------------------------------------
    def _job_name(self, js: Obj, rj: ReplicatedJob, index: int) -> str:
        return f"{js['metadata']['name']}-{rj.name}-{index}"

    def _jobs(self, js: Obj, plan: Plan) -> dict[str, list[Obj]]:
        """The JobSet's Jobs that exist, by replicated job."""
        md = js["metadata"]
        store = self.controllers.cluster.store.storage(JOBS)
        out: dict[str, list[Obj]] = {}
        for rj in plan.jobs:
            found = []
            for index in range(rj.replicas):
                job = store.get(md["namespace"], self._job_name(js, rj, index))
                refs = (job or {}).get("metadata", {}).get("ownerReferences") or ()
                if job is not None and any(r.get("uid") == md["uid"] and r.get("controller") for r in refs):
                    found.append(job)
            out[rj.name] = found
        return out

    def _create_missing(self, js: Obj, plan: Plan, restarts: int) -> None:
        """Create the Jobs that do not exist yet: all of them (AnyOrder), or replicated job by replicated job,
        each once the one before has started (InOrder)."""
        md = js["metadata"]
        store = self.controllers.cluster.store.storage(JOBS)
        global_index = 0
        total = sum(rj.replicas for rj in plan.jobs)
        for rj in plan.jobs:
            for index in range(rj.replicas):
                name = self._job_name(js, rj, index)
                if store.get(md["namespace"], name) is None:
                    manifest = self._manifest(js, plan, rj, index, global_index, total, restarts)
                    if not self.controllers.create_owned(js, STORAGE, JOBS, manifest):
                        return
                global_index += 1
            if plan.order == IN_ORDER and self._started(rj, self._jobs(js, plan)[rj.name]) < rj.replicas:
                return

    def _manifest(
        self, js: Obj, plan: Plan, rj: ReplicatedJob, index: int, global_index: int, total: int, restarts: int
    ) -> Obj:
        md = js["metadata"]
        name = self._job_name(js, rj, index)
        marks = {
            JOBSET_NAME_LABEL: md["name"],
            JOBSET_UID_LABEL: md["uid"],
            REPLICATED_JOB_LABEL: rj.name,
            REPLICATED_JOB_REPLICAS_LABEL: str(rj.replicas),
            GLOBAL_REPLICAS_LABEL: str(total),
            JOB_INDEX_LABEL: str(index),
            JOB_GLOBAL_INDEX_LABEL: str(global_index),
            JOB_KEY_LABEL: job_key(md["namespace"], name),
            RESTART_ATTEMPT_LABEL: str(restarts),
        }
        template = clone(rj.template)
        job_md = template.get("metadata") or {}
        spec = template.get("spec") or {}
        pods = spec.setdefault("template", {})
        pods_md = pods.setdefault("metadata", {})
        pods_md["labels"] = {**(pods_md.get("labels") or {}), **marks}
        pods_md["annotations"] = {**(pods_md.get("annotations") or {}), **marks}
        pod_spec = pods.setdefault("spec", {})
        if plan.subdomain is not None:
            pod_spec.setdefault("subdomain", plan.subdomain)
        if plan.suspend:
            spec["suspend"] = True
        if "parallelism" in spec:
            spec["parallelism"] = min(spec["parallelism"], MAX_PARALLELISM)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": md["namespace"],
                "labels": {**(job_md.get("labels") or {}), **marks},
                "annotations": {**(job_md.get("annotations") or {}), **marks},
                "ownerReferences": [controller_ref(js)],
            },
            "spec": spec,
        }

    def _delete(self, jobs: Iterable[Obj]) -> None:
        cluster = self.controllers.cluster
        for job in list(jobs):
            md = job["metadata"]
            try:
                cluster.delete(
                    cluster.type_of(JOBS), md["namespace"], md["name"], {"propagationPolicy": "Background"}
                )
            except ApiError:
                continue  # already gone

    # --- status ----------------------------------------------------------------------------------------------
    def _ready(self, rj: ReplicatedJob, jobs: list[Obj]) -> int:
        """Jobs whose ready and succeeded pods reach the pods a Job runs (JobSet's ``ready``)."""
        count = 0
        for job in jobs:
            status = job.get("status") or {}
            if _finished(job, "Complete", "Failed"):
                continue
            if int(status.get("ready") or 0) + int(status.get("succeeded") or 0) >= rj.pods_per_job:
                count += 1
        return count

    def _started(self, rj: ReplicatedJob, jobs: list[Obj]) -> int:
        """Jobs that are ready or already complete."""
        return self._ready(rj, jobs) + sum(1 for j in jobs if _finished(j, "Complete"))

    def _succeeded(self, plan: Plan, jobs: dict[str, list[Obj]]) -> bool:
        """Whether the success policy is met: All (or Any) of the target replicated jobs' Jobs complete."""
        targets = [rj for rj in plan.jobs if not plan.success_targets or rj.name in plan.success_targets]
        done = [sum(1 for j in jobs[rj.name] if _finished(j, "Complete")) for rj in targets]
        if plan.success_any:
            return any(done)
        return all(n >= rj.replicas for n, rj in zip(done, targets, strict=True))

    def _status(self, plan: Plan, jobs: dict[str, list[Obj]], old: Obj) -> Obj:
        now = rfc3339(self.controllers.cluster.now())
        conditions: list[Obj] = [dict(c) for c in old.get("conditions") or ()]

        def put(type_: str, status: str, reason: str, message: str) -> None:
            put_condition(conditions, condition(type_, status, reason, message, lastTransitionTime=now))

        replicated = []
        for rj in plan.jobs:
            own = jobs[rj.name]
            replicated.append(
                {
                    "name": rj.name,
                    "ready": self._ready(rj, own),
                    "succeeded": sum(1 for j in own if _finished(j, "Complete")),
                    "failed": sum(1 for j in own if _finished(j, "Failed")),
                    "active": sum(
                        1
                        for j in own
                        if not _finished(j, "Complete", "Failed") and (j.get("status") or {}).get("active")
                    ),
                    "suspended": sum(1 for j in own if (j.get("spec") or {}).get("suspend")),
                }
            )
        status: Obj = {**old, "replicatedJobsStatus": replicated}
        status.setdefault("restarts", 0)
        terminal = old.get("terminalState")
        if terminal is None:
            if any(r["failed"] for r in replicated):
                if plan.max_restarts:
                    put(
                        "Failed",
                        "True",
                        "ReachedMaxRestarts",
                        "jobset failed due to reaching max number of restarts",
                    )
                else:
                    put("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures")
                terminal = "Failed"
            elif self._succeeded(plan, jobs):
                put("Completed", "True", "AllJobsCompleted", "jobset completed successfully")
                terminal = "Completed"
        if plan.order == IN_ORDER:
            started = all(self._started(rj, jobs[rj.name]) >= rj.replicas for rj in plan.jobs)
            if started or terminal is not None:
                put(
                    "StartupPolicyInProgress",
                    "False",
                    "InOrderStartupPolicyCompleted",
                    "all replicated jobs have started",
                )
                put(
                    "StartupPolicyCompleted",
                    "True",
                    "InOrderStartupPolicyCompleted",
                    "all replicated jobs have started",
                )
            else:
                put(
                    "StartupPolicyInProgress",
                    "True",
                    "InOrderStartupPolicyInProgress",
                    "in order startup policy is in progress",
                )
        if terminal is not None:
            status["terminalState"] = terminal
        if conditions:
            status["conditions"] = conditions
        return status

    def _write(self, js: Obj, status: Obj) -> None:
        md = js["metadata"]
        current = self.controllers.cluster.store.storage(STORAGE).get(md["namespace"], md["name"])
        if current is not None and current["metadata"].get("uid") == md.get("uid"):
            self.controllers.write_status(STORAGE, current, status)


OPERATOR = OperatorSpec(
    name="jobset",
    crds=(JOBSET_CRD,),
    storages={STORAGE: COMPONENT},
    owners={(API_VERSION, KIND): STORAGE},
    start=JobSetController,
)
