"""Minimal workload controllers, so that Jobs, Deployments and StatefulSets apply unchanged.

- **Job** (batch/v1, non-indexed): keeps up to `parallelism` pods (named `<job>-<random5>`, labelled
  `batch.kubernetes.io/job-name` and `controller-uid`, owned with controller=true and
  blockOwnerDeletion=true) while fewer than `completions` have succeeded; a deleted or evicted pod is
  replaced; status active/ready/succeeded/failed, and the Complete (with SuccessCriteriaMet) or Failed
  (more failures than `backoffLimit`) condition. `suspend: true` removes the active pods.
- **Deployment** (apps/v1): one ReplicaSet `<deployment>-<template hash>` per pod template, scaled to
  `spec.replicas`; older ReplicaSets are scaled to 0 at once (no rolling surge).
- **ReplicaSet**: keeps `spec.replicas` pods `<replicaset>-<random5>`, replacing deleted ones.
- **StatefulSet**: pods `<statefulset>-<start>..<start+N-1>` (`spec.ordinals.start`, 0 by default), all
  created at once (as with podManagementPolicy Parallel), recreated with the same name after deletion,
  ordinals out of that range removed on scale-down.
- DaemonSets are stored only.
- **Operators of workload CRDs** (Kubeflow Training, ...): `tools.kubesim.operators`, each started here,
  its storages listened to, its objects reconciled in `run_once` like the built-in kinds.

Pods keep everything their template says (schedulerName, labels, annotations, priorityClassName, ...).
Each controller reacts to changes of its objects and of the pods they own: storage listeners mark keys
dirty, `run_once` reconciles them (called from `Cluster.settle`). Creating a pod the API refuses (for
example an unknown priority class) records a FailedCreate event on the owner and does not retry until the
owner changes. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from tools.kubesim.default_storage_class import RetroactiveDefault
from tools.kubesim.dra import DraController
from tools.kubesim.ephemeral_volumes import EphemeralVolumes
from tools.kubesim.errors import ApiError
from tools.kubesim.kinds import JOB_CONTROLLER_UID_LABELS, JOB_NAME_LABELS
from tools.kubesim.objects import (
    NAME_ALPHABET,
    clone,
    condition,
    controller_of,
    controller_ref,
    count_of,
    is_ready,
    random_suffix,
    rfc3339,
)
from tools.kubesim.operators import OPERATORS, Operator, operator_of_storage, storage_of_owner
from tools.kubesim.resources import ResourceType
from tools.kubesim.storage import StorageController
from tools.kubesim.store import Change, Store
from tools.kubesim.writes import DeferredCreate, Write

__all__ = ["ClusterApi", "Controllers", "template_hash"]

Obj = dict[str, Any]
DirtyKey = tuple[str, str, str]
"""(storage, namespace, name)"""

_JOBS = "batch/jobs"
_DEPLOYMENTS = "apps/deployments"
_REPLICASETS = "apps/replicasets"
_STATEFULSETS = "apps/statefulsets"
_OWNER_STORAGE = {
    ("batch/v1", "Job"): _JOBS,
    ("apps/v1", "ReplicaSet"): _REPLICASETS,
    ("apps/v1", "StatefulSet"): _STATEFULSETS,
    ("apps/v1", "Deployment"): _DEPLOYMENTS,
}
_TERMINAL = ("Succeeded", "Failed")
_COMPONENT = {
    _JOBS: "job-controller",
    _REPLICASETS: "replicaset-controller",
    _STATEFULSETS: "statefulset-controller",
    _DEPLOYMENTS: "deployment-controller",
}


def _component(storage: str) -> str:
    """The controller that reports on an owner kept in `storage` (the source of its events)."""
    operator = operator_of_storage(storage)
    return operator.storages[storage] if operator is not None else _COMPONENT[storage]


def template_hash(template: Obj) -> str:
    """A stable 10-character hash of a pod template (the `pod-template-hash` label value)."""
    digest = hashlib.sha256(msgspec.json.encode(template, order="sorted")).digest()
    return "".join(NAME_ALPHABET[b % len(NAME_ALPHABET)] for b in digest[:10])


def _is_active(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL and not pod["metadata"].get(
        "deletionTimestamp"
    )


def _ordinal_start(spec: Obj) -> int:
    """A StatefulSet's first ordinal, ``spec.ordinals.start`` (0 when absent or not a whole number >= 0)."""
    ordinals = spec.get("ordinals")
    start = ordinals.get("start", 0) if isinstance(ordinals, dict) else 0
    return start if isinstance(start, int) and not isinstance(start, bool) and 0 <= start <= 10**9 else 0


def _condition(type_: str, status: str, reason: str, message: str, now: str) -> Obj:
    """A Job's (or a Deployment's) condition: probed and changed `now`."""
    return condition(type_, status, reason, message, lastProbeTime=now, lastTransitionTime=now)


class ClusterApi(Protocol):
    """The simulated cluster as its controllers and the operators call it (`tools.kubesim.cluster.Cluster`
    is one); typed here so that this module need not import the cluster, which holds these controllers."""

    @property
    def store(self) -> Store: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def deferred(self) -> deque[DeferredCreate]: ...
    @property
    def defer_creates(self) -> Callable[[], bool]: ...
    def now(self) -> float: ...
    def type_of(self, storage_key: str) -> ResourceType: ...
    def find(self, storage_key: str, namespace: str | None, name: str) -> Obj | None: ...
    def objects(self, storage_key: str, namespace: str | None = None) -> list[Obj]: ...
    def create(self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False) -> Obj: ...
    def begin_create(self, rt: ResourceType, namespace: str | None, body: Any) -> Write: ...
    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: Any = None,
        *,
        dry_run: bool = False,
    ) -> Obj: ...
    def remove(self, storage_key: str, namespace: str, name: str, policy: str) -> Obj | None: ...
    def record_event(self, about: Obj, type_: str, reason: str, message: str, component: str) -> None: ...


class Controllers:
    """The Job, Deployment, ReplicaSet and StatefulSet controllers of one cluster, with the volume, DRA,
    default-class and ephemeral-volume controllers they are given (`tools.kubesim.assembly` builds them)."""

    def __init__(
        self,
        cluster: ClusterApi,
        *,
        storage: StorageController,
        dra: DraController,
        default_class: RetroactiveDefault,
        ephemeral: EphemeralVolumes,
    ) -> None:
        self.cluster = cluster
        self.dirty: dict[DirtyKey, None] = {}
        self.in_flight: dict[str, set[str]] = {}
        """owner uid -> names of the pods it created that wait for admission webhooks (`Cluster.deferred`):
        counted as created, as the real controllers' expectations do, so none is created twice."""
        self.job_finished: dict[str, dict[str, set[str]]] = {}
        """job uid -> {"succeeded": pod uids, "failed": pod uids}: pods counted once, even after deletion."""
        store = cluster.store
        for key in (_JOBS, _DEPLOYMENTS, _REPLICASETS, _STATEFULSETS):
            store.storage(key).listeners.append(self._own_change(key))
        store.storage("pods").listeners.append(self._pod_change)
        self.operators: dict[str, Operator] = {spec.name: spec.start(self) for spec in OPERATORS}
        self.storage = storage
        """The volume controller, the CSI provisioner and the CSINodes (`tools.kubesim.storage`)."""
        self.dra = dra
        """The resourceclaim controller, the DRA GPU driver and ComputeDomains (`tools.kubesim.dra`)."""
        self.default_class = default_class
        """The default StorageClass given to claims that asked for none (`tools.kubesim.default_storage_class`)."""
        self.ephemeral = ephemeral
        """The claims of pods' generic ephemeral volumes (`tools.kubesim.ephemeral_volumes`)."""
        self._watched: dict[str, object] = {}
        """storage key -> the operator's storage this controller listens to (a recreated CRD has a new one)."""

    def storage_added(self, key: str) -> None:
        """A CRD's storage was registered: listen to it when an operator reconciles its kind (`operators`)."""
        if operator_of_storage(key) is None:
            return
        storage = self.cluster.store.storage(key)
        if self._watched.get(key) is storage:
            return
        self._watched[key] = storage
        storage.listeners.append(self._own_change(key))

    def _own_change(self, storage: str) -> Any:
        def listener(change: Change) -> None:
            md = change.obj["metadata"]
            if change.type == "DELETED" and storage == _JOBS:
                self.job_finished.pop(md.get("uid", ""), None)
                return
            self.dirty[storage, md.get("namespace", ""), md["name"]] = None
            # Any controlled object's change reaches its owner: a ReplicaSet's its Deployment, a Job's its
            # CronJob or an operator's job, a Deployment its Knative Revision, a StatefulSet its Notebook.
            self._mark_owner(change.obj)

        return listener

    def _pod_change(self, change: Change) -> None:
        self._mark_owner(change.obj)

    def _mark_owner(self, obj: Obj) -> None:
        ref = controller_of(obj)
        if ref is None:
            return
        api_version, kind = str(ref.get("apiVersion", "")), str(ref.get("kind", ""))
        storage = _OWNER_STORAGE.get((api_version, kind)) or storage_of_owner(api_version, kind)
        if storage is not None:
            self.dirty[storage, obj["metadata"].get("namespace", ""), str(ref.get("name", ""))] = None

    def run_once(self) -> bool:
        """Reconcile every dirty object once; True when there was anything to do."""
        if not self.dirty:
            return (
                self.ephemeral.run_once()
                | self.default_class.run_once()
                | self.dra.run_once()
                | self.storage.run_once()
            )
        self.ephemeral.run_once()
        self.default_class.run_once()
        self.storage.run_once()
        self.dra.run_once()
        batch = list(self.dirty)
        self.dirty.clear()
        for storage, ns, name in batch:
            obj = self.cluster.store.storage(storage).get(ns, name)
            if storage == _JOBS:
                self._job(ns, name, obj)
            elif obj is None:
                continue
            elif storage == _DEPLOYMENTS:
                self._deployment(obj)
            elif storage == _REPLICASETS:
                self._replicaset(obj)
            elif storage == _STATEFULSETS:
                self._statefulset(obj)
            elif (operator := operator_of_storage(storage)) is not None:
                self.operators[operator.name].reconcile(storage, obj)
        return True

    # --- for the operators (`tools.kubesim.operators`) -----------------------------------------------------
    def owned_pods(self, owner: Obj) -> list[Obj]:
        """The pods `owner` controls."""
        return self._owned(owner)

    def waiting_for(self, owner: Obj) -> set[str]:
        """Names of the pods `owner` created that still wait for admission webhooks."""
        return self._waiting(owner)

    def create_pod_from(self, owner: Obj, storage: str, name: str, template: Obj) -> bool:
        """Create the pod `name` from a pod `template`, owned by `owner` (stored in `storage`)."""
        return self._create_pod(owner, storage, name, {}, template=template)

    def mark_dirty(self, storage: str, namespace: str, name: str) -> None:
        """Reconcile the object `name` of `storage` at the next `run_once` (an operator whose object depends
        on one it does not control: a RayJob on its RayCluster, a LeaderWorkerSet on its leaders' pods)."""
        self.dirty[storage, namespace, name] = None

    def create_owned(self, owner: Obj, owner_storage: str, storage: str, manifest: Obj) -> bool:
        """Create the object `manifest` describes in `storage` (a Job, a Deployment, another operator's
        custom object), for `owner` (kept in `owner_storage`); a refusal is a FailedCreate Warning on the
        owner, as a real controller reports it. False on a refusal."""
        cluster = self.cluster
        try:
            cluster.create(cluster.type_of(storage), manifest["metadata"].get("namespace"), manifest)
        except ApiError as exc:
            cluster.record_event(
                owner, "Warning", "FailedCreate", f"Error creating: {exc.message}", _component(owner_storage)
            )
            return False
        return True

    def write_status(self, storage: str, obj: Obj, status: Obj) -> None:
        """Store `obj` with `status` unless it already has it."""
        self._write_status(storage, obj, status)

    # --- shared -----------------------------------------------------------------------------------------------
    def _owned(self, owner: Obj, storage: str = "pods") -> list[Obj]:
        uid = owner["metadata"]["uid"]
        out = []
        store = self.cluster.store
        for key, ns, name in store.dependents_of(uid):
            if key != storage:
                continue
            obj = store.storage(key).get(ns, name)
            ref = controller_of(obj) if obj is not None else None
            if obj is not None and ref is not None and ref.get("uid") == uid:
                out.append(obj)
        return out

    def _create_pod(
        self,
        owner: Obj,
        storage: str,
        name: str,
        extra_labels: dict[str, str],
        spec_extra: Obj | None = None,
        *,
        template: Obj | None = None,
    ) -> bool:
        template = clone(
            template if template is not None else (owner.get("spec") or {}).get("template") or {}
        )
        template_md = template.get("metadata") or {}
        md: Obj = {
            "name": name,
            "namespace": owner["metadata"]["namespace"],
            "labels": {**(template_md.get("labels") or {}), **extra_labels},
            "ownerReferences": [controller_ref(owner)],
        }
        if template_md.get("annotations"):
            md["annotations"] = template_md["annotations"]
        if template_md.get("finalizers"):
            md["finalizers"] = template_md["finalizers"]
        spec = template.get("spec") or {}
        if spec_extra:
            spec.update(spec_extra)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}
        try:
            if self.cluster.defer_creates():
                write = self.cluster.begin_create(self.cluster.type_of("pods"), md["namespace"], pod)
                self.cluster.deferred.append(DeferredCreate(owner=owner, storage=storage, write=write))
                self.in_flight.setdefault(owner["metadata"]["uid"], set()).add(name)
                return True
            self.cluster.create(self.cluster.type_of("pods"), md["namespace"], pod)
        except ApiError as exc:
            self.cluster.record_event(
                owner, "Warning", "FailedCreate", f"Error creating: {exc.message}", _component(storage)
            )
            return False
        return True

    def admitted(self, item: DeferredCreate, error: ApiError | None, *, retry: bool = True) -> None:
        """A deferred pod was created (`error` None) or refused: forget it, and reconcile its owner again
        (after a refusal only when `retry`, which the server does after a pause, as a controller backs off)."""
        uid = item.owner["metadata"]["uid"]
        names = self.in_flight.get(uid)
        if names is not None:
            names.discard(item.write.obj["metadata"].get("name", ""))
            if not names:
                del self.in_flight[uid]
        if error is not None:
            self.cluster.record_event(
                item.owner,
                "Warning",
                "FailedCreate",
                f"Error creating: {error.message}",
                _component(item.storage),
            )
        if error is None or retry:
            md = item.owner["metadata"]
            self.dirty[item.storage, md.get("namespace", ""), md["name"]] = None

    def owner_alive(self, item: DeferredCreate) -> bool:
        md = item.owner["metadata"]
        current = self.cluster.store.storage(item.storage).get(md.get("namespace", ""), md["name"])
        return current is not None and current["metadata"].get("uid") == md.get("uid")

    def _waiting(self, owner: Obj) -> set[str]:
        return self.in_flight.get(owner["metadata"]["uid"], set())

    def _delete_pod(self, pod: Obj) -> None:
        md = pod["metadata"]
        self.cluster.remove("pods", md["namespace"], md["name"], "Background")

    def _write_status(self, storage: str, obj: Obj, status: Obj) -> None:
        if obj.get("status") == status:
            return
        self.cluster.store.put(storage, {**obj, "metadata": dict(obj["metadata"]), "status": status})

    def _unique_name(self, base: str, namespace: str) -> str:
        pods = self.cluster.store.storage("pods")
        while True:
            name = f"{base}-{random_suffix(self.cluster.rng)}"
            if pods.get(namespace, name) is None:
                return name

    # --- Job -------------------------------------------------------------------------------------------------
    def _job(self, ns: str, name: str, job: Obj | None) -> None:
        if job is None:
            return
        uid = job["metadata"]["uid"]
        spec = job.get("spec") or {}
        status = dict(job.get("status") or {})
        now = rfc3339(self.cluster.now())
        pods = self._owned(job)
        counted = self.job_finished.setdefault(uid, {"succeeded": set(), "failed": set()})
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Succeeded":
                counted["succeeded"].add(pod["metadata"]["uid"])
            elif phase == "Failed":
                counted["failed"].add(pod["metadata"]["uid"])
        succeeded = max(len(counted["succeeded"]), count_of(status, "succeeded", 0))
        failed = max(len(counted["failed"]), count_of(status, "failed", 0))
        active = [p for p in pods if _is_active(p)]
        conditions = list(status.get("conditions") or ())
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        )
        if not finished:
            completions = spec.get("completions")
            parallelism = count_of(spec, "parallelism", 1)
            if failed > count_of(spec, "backoffLimit", 6):
                for pod in active:
                    self._delete_pod(pod)
                active = []
                conditions += [
                    _condition(
                        "FailureTarget",
                        "True",
                        "BackoffLimitExceeded",
                        "Job has reached the specified backoff limit",
                        now,
                    ),
                    _condition(
                        "Failed",
                        "True",
                        "BackoffLimitExceeded",
                        "Job has reached the specified backoff limit",
                        now,
                    ),
                ]
            elif (succeeded >= completions) if completions is not None else (succeeded > 0 and not active):
                for pod in active:
                    self._delete_pod(pod)
                active = []
                conditions += [
                    _condition(
                        "SuccessCriteriaMet",
                        "True",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                        now,
                    ),
                    _condition(
                        "Complete",
                        "True",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                        now,
                    ),
                ]
                status["completionTime"] = now
            elif spec.get("suspend"):
                for pod in active:
                    self._delete_pod(pod)
                active = []
            else:
                want = (
                    parallelism
                    if completions is None
                    else min(parallelism, count_of(spec, "completions", 1) - succeeded)
                )
                if completions is None and succeeded > 0:
                    want = 0
                labels = dict.fromkeys(JOB_CONTROLLER_UID_LABELS, uid) | dict.fromkeys(JOB_NAME_LABELS, name)
                for _ in range(want - len(active) - len(self._waiting(job))):
                    if not self._create_pod(job, _JOBS, self._unique_name(name, ns), labels):
                        break
                if len(active) > want:
                    for pod in sorted(
                        active, key=lambda p: (bool(p["spec"].get("nodeName")), p["metadata"]["name"])
                    )[: len(active) - want]:
                        self._delete_pod(pod)
                active = [p for p in self._owned(job) if _is_active(p)]
                status.setdefault("startTime", now)
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if is_ready(p))
        status["terminating"] = 0
        status["uncountedTerminatedPods"] = {}
        for field, value in (("succeeded", succeeded), ("failed", failed)):
            if value:
                status[field] = value
            else:
                status.pop(field, None)
        if conditions:
            status["conditions"] = conditions
        current = self.cluster.store.storage(_JOBS).get(ns, name)
        if current is not None:
            self._write_status(_JOBS, current, status)

    # --- Deployment -------------------------------------------------------------------------------------------
    def _deployment(self, d: Obj) -> None:
        spec = d.get("spec") or {}
        md = d["metadata"]
        replicas = count_of(spec, "replicas", 1)
        template = spec.get("template") or {}
        pod_hash = template_hash(template)
        owned = self._owned(d, _REPLICASETS)
        current = next(
            (rs for rs in owned if (rs["metadata"].get("labels") or {}).get("pod-template-hash") == pod_hash),
            None,
        )
        revisions = [
            int((rs["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision", "0") or 0)
            for rs in owned
        ]
        rs_type = self.cluster.type_of(_REPLICASETS)
        if current is None:
            labels = {**((template.get("metadata") or {}).get("labels") or {}), "pod-template-hash": pod_hash}
            rs_template = clone(template)
            rs_template.setdefault("metadata", {})["labels"] = labels
            selector = clone(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})["pod-template-hash"] = pod_hash
            new_obj: Obj = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{md['name']}-{pod_hash}",
                    "namespace": md["namespace"],
                    "labels": labels,
                    "annotations": {
                        "deployment.kubernetes.io/revision": str(max(revisions, default=0) + 1),
                        "deployment.kubernetes.io/desired-replicas": str(replicas),
                    },
                    "ownerReferences": [controller_ref(d)],
                },
                "spec": {"replicas": replicas, "selector": selector, "template": rs_template},
            }
            try:
                self.cluster.create(rs_type, md["namespace"], new_obj)
            except ApiError as exc:
                self.cluster.record_event(d, "Warning", "FailedCreate", exc.message, _COMPONENT[_DEPLOYMENTS])
                return
        else:
            self._scale_rs(current, replicas)
        for rs in owned:
            if rs is not current and (rs.get("spec") or {}).get("replicas", 0) != 0:
                self._scale_rs(rs, 0)
        owned = self._owned(d, _REPLICASETS)
        new_rs = next(
            (rs for rs in owned if (rs["metadata"].get("labels") or {}).get("pod-template-hash") == pod_hash),
            None,
        )
        total = sum(count_of(rs.get("status"), "replicas", 0) for rs in owned)
        ready = sum(count_of(rs.get("status"), "readyReplicas", 0) for rs in owned)
        available = sum(count_of(rs.get("status"), "availableReplicas", 0) for rs in owned)
        updated = count_of(new_rs.get("status"), "replicas", 0) if new_rs else 0
        now = rfc3339(self.cluster.now())
        old_conditions = {c.get("type"): c for c in (d.get("status") or {}).get("conditions") or ()}
        done = updated == replicas and available >= replicas and total == replicas

        def keep(c: Obj) -> Obj:
            prev = old_conditions.get(c["type"])
            if prev is not None and prev.get("status") == c["status"] and prev.get("reason") == c["reason"]:
                return dict(prev)
            return c

        status: Obj = {
            "observedGeneration": md.get("generation", 1),
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "conditions": [
                keep(
                    _condition(
                        "Available",
                        "True" if available >= replicas else "False",
                        "MinimumReplicasAvailable" if available >= replicas else "MinimumReplicasUnavailable",
                        "Deployment has minimum availability."
                        if available >= replicas
                        else "Deployment does not have minimum availability.",
                        now,
                    )
                ),
                keep(
                    _condition(
                        "Progressing",
                        "True",
                        "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                        f'ReplicaSet "{md["name"]}-{pod_hash}" has {"successfully progressed" if done else "is progressing"}.',
                        now,
                    )
                ),
            ],
        }
        if total - available > 0:
            status["unavailableReplicas"] = total - available
        for field in ("readyReplicas", "availableReplicas", "updatedReplicas", "replicas"):
            if status[field] == 0 and field != "replicas":
                del status[field]
        self._write_status(_DEPLOYMENTS, d, status)

    def _scale_rs(self, rs: Obj, replicas: int) -> None:
        if (rs.get("spec") or {}).get("replicas") == replicas:
            return
        md = dict(rs["metadata"])
        md["generation"] = int(md.get("generation", 1)) + 1
        md["annotations"] = {
            **(md.get("annotations") or {}),
            "deployment.kubernetes.io/desired-replicas": str(replicas),
        }
        self.cluster.store.put(
            _REPLICASETS, {**rs, "metadata": md, "spec": {**rs["spec"], "replicas": replicas}}
        )

    # --- ReplicaSet ---------------------------------------------------------------------------------------------
    def _replicaset(self, rs: Obj) -> None:
        spec = rs.get("spec") or {}
        md = rs["metadata"]
        want = count_of(spec, "replicas", 1)
        active = [p for p in self._owned(rs) if _is_active(p)]
        for _ in range(want - len(active) - len(self._waiting(rs))):
            if not self._create_pod(rs, _REPLICASETS, self._unique_name(md["name"], md["namespace"]), {}):
                break
        if len(active) > want:
            # Remove the least advanced pods first: unbound, then not ready, then the newest.
            victims = sorted(
                active,
                key=lambda p: (
                    bool(p["spec"].get("nodeName")),
                    is_ready(p),
                    -int(p["metadata"]["resourceVersion"]),
                ),
            )[: len(active) - want]
            for pod in victims:
                self._delete_pod(pod)
        active = [p for p in self._owned(rs) if _is_active(p)]
        ready = sum(1 for p in active if is_ready(p))
        status: Obj = {
            "replicas": len(active),
            "fullyLabeledReplicas": len(active),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": md.get("generation", 1),
        }
        for field in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
            if status[field] == 0:
                del status[field]
        current = self.cluster.store.storage(_REPLICASETS).get(md["namespace"], md["name"])
        if current is not None:
            self._write_status(_REPLICASETS, current, status)

    # --- StatefulSet --------------------------------------------------------------------------------------------
    def _statefulset(self, sts: Obj) -> None:
        spec = sts.get("spec") or {}
        md = sts["metadata"]
        want = count_of(spec, "replicas", 1)
        revision = f"{md['name']}-{template_hash(spec.get('template') or {})}"
        pods = self.cluster.store.storage("pods")
        owned = {p["metadata"]["name"]: p for p in self._owned(sts)}
        start = _ordinal_start(spec)
        for i in range(start, start + want):
            pod_name = f"{md['name']}-{i}"
            pod = owned.get(pod_name)
            if pod is not None and (pod.get("status") or {}).get("phase") in _TERMINAL:
                self._delete_pod(pod)
                pod = None
            if (
                pod is None
                and pods.get(md["namespace"], pod_name) is None
                and pod_name not in self._waiting(sts)
            ):
                labels = {
                    "statefulset.kubernetes.io/pod-name": pod_name,
                    "apps.kubernetes.io/pod-index": str(i),
                    "controller-revision-hash": revision,
                }
                extra: Obj = {"hostname": pod_name}
                if spec.get("serviceName"):
                    extra["subdomain"] = spec["serviceName"]
                if not self._create_pod(sts, _STATEFULSETS, pod_name, labels, extra):
                    break
        for pod_name, pod in owned.items():
            ordinal = pod_name.rsplit("-", 1)[-1]
            if (
                ordinal.isascii()
                and ordinal.isdigit()
                and len(ordinal) <= 18
                and not start <= int(ordinal) < start + want
            ):
                self._delete_pod(pod)
        active = [p for p in self._owned(sts) if _is_active(p)]
        ready = sum(1 for p in active if is_ready(p))
        status: Obj = {
            "observedGeneration": md.get("generation", 1),
            "replicas": len(active),
            "readyReplicas": ready,
            "currentReplicas": len(active),
            "updatedReplicas": len(active),
            "availableReplicas": ready,
            "currentRevision": revision,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        if not ready:
            del status["readyReplicas"]
        current = self.cluster.store.storage(_STATEFULSETS).get(md["namespace"], md["name"])
        if current is not None:
            self._write_status(_STATEFULSETS, current, status)
