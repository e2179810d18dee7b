"""LeaderWorkerSets in the simulated API server: the CRD, served from the start, and a simulated LWS
controller that makes a set's groups as LWS makes them, so that a LeaderWorkerSet written for KAI (or for
LWS's own docs) applies unchanged and kubesim's StatefulSet controller runs its pods.

**CRD** (`LWS_CRD`, created by `Cluster` at start through `OPERATOR`): ``leaderworkerset.x-k8s.io/v1``
LeaderWorkerSet (short name ``lws``), namespaced, schema-less, with the status and scale subresources. The
defaults LWS's schema gives (``replicas`` 1, ``leaderWorkerTemplate.size`` 1, ``startupPolicy``
LeaderCreated) are written into a set that leaves them out, as the API server would have stored them.

**Controller** (`LeaderWorkerSetController`, started by `tools.kubesim.controllers.Controllers` through
`OPERATOR`), as LWS's leaderworkerset and pod controllers and its pod webhook do:

- The leaders: a StatefulSet ``<lws>`` owned by the set (controller, blockOwnerDeletion), ``replicas``
  pods from ``leaderWorkerTemplate.leaderTemplate`` (the ``workerTemplate`` when there is none), labelled
  ``leaderworkerset.sigs.k8s.io/name``, ``worker-index: "0"`` and ``template-revision-hash`` and annotated
  with the group ``size``; Parallel pod management, service name ``<lws>``.
- A group's workers: once its leader pod exists (``startupPolicy: LeaderCreated``) or is Ready
  (``LeaderReady``), and is not being deleted, a StatefulSet named after the leader pod, ``<lws>-<g>``,
  owned by the leader pod, of ``size - 1`` pods with ordinals from 1 from ``workerTemplate``, labelled with
  the set's name, the group's ``group-index``, ``group-key`` (the SHA-1 of ``<namespace>/<leader>``) and
  ``template-revision-hash``, annotated with the ``size`` and the ``leader-name`` (and ``subgroup-size``
  under a ``subGroupPolicy``). None for a group of one.
- Every pod of the set, as LWS's pod webhook labels it: a leader gets its ``group-index`` (its ordinal)
  and ``group-key``, a worker its ``worker-index`` (its ordinal). kubesim has no such webhook, so the
  labels are written onto the pod just after its StatefulSet created it, before the next pass.
- Status: ``replicas`` (the leader StatefulSet's), ``readyReplicas`` (groups whose leader and workers are
  all Ready), ``updatedReplicas`` (groups with a leader: kubesim has no rolling update),
  ``hpaPodSelector``, and the condition ``Available`` (every group ready, AllGroupsReady) or
  ``Progressing`` (GroupsProgressing), the other set False.
- A spec LWS's schema or webhook would refuse (a template that is not an object, no worker template, a
  count that is not a whole number, a size below 1, an unknown startup policy, a sub-group size below 1)
  creates nothing and records a Warning ``InvalidSpec`` Event naming the field; a set of more than
  `MAX_PODS` pods in all makes fewer groups (and a group of more than `MAX_PODS` fewer workers).

LWS's controller watches every StatefulSet and pod it labels; `Controllers` marks an operator's object
dirty only for the pods it controls, so this controller listens to the pod and StatefulSet storages itself
and marks the set named by the ``leaderworkerset.sigs.k8s.io/name`` label.

Not simulated: rolling updates (a changed template reaches new groups only), ``restartPolicy``
(RecreateGroupOnPodRestart), the headless Service, exclusive and sub-group placement, network config,
the subgroup labels, ``volumeClaimTemplates``. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from tools.kubesim.objects import clone, controller_of, controller_ref, is_ready, rfc3339
from tools.kubesim.operators import AGE_COLUMN, OperatorSpec, custom_resource_definition
from tools.kubesim.store import Change

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = [
    "API_VERSION",
    "GROUP_INDEX_LABEL",
    "GROUP_KEY_LABEL",
    "LEADER_NAME_ANNOTATION",
    "LWS_CRD",
    "MAX_PODS",
    "NAME_LABEL",
    "SIZE_ANNOTATION",
    "STORAGE",
    "TEMPLATE_REVISION_LABEL",
    "WORKER_INDEX_LABEL",
    "LeaderWorkerSetController",
    "Plan",
    "SpecError",
    "plan_of",
]

Obj = dict[str, Any]

GROUP = "leaderworkerset.x-k8s.io"
API_VERSION = f"{GROUP}/v1"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
STORAGE = f"{GROUP}/{PLURAL}"
COMPONENT = "leaderworkerset"
"""The event source of LWS's controller manager."""

_PREFIX = "leaderworkerset.sigs.k8s.io/"
NAME_LABEL = _PREFIX + "name"
GROUP_INDEX_LABEL = _PREFIX + "group-index"
WORKER_INDEX_LABEL = _PREFIX + "worker-index"
GROUP_KEY_LABEL = _PREFIX + "group-key"
TEMPLATE_REVISION_LABEL = _PREFIX + "template-revision-hash"
SIZE_ANNOTATION = _PREFIX + "size"
LEADER_NAME_ANNOTATION = _PREFIX + "leader-name"
SUBGROUP_SIZE_ANNOTATION = _PREFIX + "subgroup-size"

LEADER_CREATED = "LeaderCreated"
LEADER_READY = "LeaderReady"

MAX_PODS = 1000
"""The most pods kubesim makes for one LeaderWorkerSet: it has no CRD schema to refuse a hostile count, and
a billion groups would fill its memory."""

_STATEFULSETS = "apps/statefulsets"

LWS_CRD: Obj = custom_resource_definition(
    GROUP,
    KIND,
    PLURAL,
    ["v1"],
    short_names=["lws"],
    subresources={
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.hpaPodSelector",
        },
    },
    columns=[AGE_COLUMN],
)
"""The CustomResourceDefinition kubesim serves from its start."""


class SpecError(Exception):
    """A LeaderWorkerSet spec LWS would refuse: the field and what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Plan:
    """What a valid LeaderWorkerSet asks for, its counts cut to `MAX_PODS` pods."""

    groups: int
    size: int
    startup: str
    leader_template: Obj
    worker_template: Obj
    sub_group_size: int | None
    revision: str
    """The template-revision-hash: the SHA-1 of the leaderWorkerTemplate."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _count(value: object, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(field, f"must be a whole number >= {low}, got {_shown(value)}")
    return value


def _object(value: object, field: str) -> Obj:
    if not isinstance(value, dict):
        raise SpecError(field, f"must be an object, got {_shown(value)}")
    return value


def plan_of(lws: Obj) -> Plan:
    """The groups `lws` asks for; `SpecError` naming the field for what LWS would refuse."""
    spec = _object(lws.get("spec"), "spec")
    lwt = _object(spec.get("leaderWorkerTemplate"), "spec.leaderWorkerTemplate")
    groups = _count(spec.get("replicas", 1), "spec.replicas", 0)
    size = _count(lwt.get("size", 1), "spec.leaderWorkerTemplate.size", 1)
    startup = spec.get("startupPolicy", LEADER_CREATED)
    if startup not in (LEADER_CREATED, LEADER_READY):
        raise SpecError("spec.startupPolicy", f"must be LeaderCreated or LeaderReady, got {_shown(startup)}")
    worker_template = _object(lwt.get("workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate")
    leader_template = worker_template
    if lwt.get("leaderTemplate") is not None:
        leader_template = _object(lwt["leaderTemplate"], "spec.leaderWorkerTemplate.leaderTemplate")
    for at, template in (("workerTemplate", worker_template), ("leaderTemplate", leader_template)):
        for part in ("metadata", "spec"):
            if template.get(part) is not None:
                _object(template[part], f"spec.leaderWorkerTemplate.{at}.{part}")
    sub_group_size = None
    policy = lwt.get("subGroupPolicy")
    if policy is not None:
        policy = _object(policy, "spec.leaderWorkerTemplate.subGroupPolicy")
        if "subGroupSize" in policy:
            field = "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize"
            sub_group_size = _count(policy["subGroupSize"], field, 1)
    size = min(size, MAX_PODS)
    groups = min(groups, MAX_PODS // size)
    revision = hashlib.sha1(msgspec.json.encode(lwt, order="sorted"), usedforsecurity=False).hexdigest()
    return Plan(groups, size, startup, leader_template, worker_template, sub_group_size, revision)


def group_key(namespace: str, leader: str) -> str:
    """LWS's group-key label: the SHA-1 of ``<namespace>/<leader pod>``."""
    return hashlib.sha1(f"{namespace}/{leader}".encode(), usedforsecurity=False).hexdigest()


def _ordinal(name: str, parent: str) -> int | None:
    """The ordinal of the pod ``<parent>-<n>`` of a StatefulSet, None for any other name."""
    head, _, tail = name.rpartition("-")
    if head != parent or not (tail.isascii() and tail.isdigit() and len(tail) <= 18):
        return None
    return int(tail)


def _template(base: Obj, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Obj:
    template: Obj = clone(base)
    md = template.setdefault("metadata", {})
    md["labels"] = {**(md.get("labels") or {}), **labels}
    md["annotations"] = {**(md.get("annotations") or {}), **annotations}
    template.setdefault("spec", {})
    return template


def _condition(type_: str, status: str, reason: str, message: str, now: str) -> Obj:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}


class LeaderWorkerSetController:
    """LWS's controllers and pod webhook, reconciling one LeaderWorkerSet at a time for `Controllers`."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers
        store = controllers.cluster.store
        for key in ("pods", _STATEFULSETS):
            store.storage(key).listeners.append(self._labelled_change)

    def _labelled_change(self, change: Change) -> None:
        """A pod or StatefulSet of a set changed: reconcile the set (LWS's controllers watch them)."""
        md = change.obj["metadata"]
        name = (md.get("labels") or {}).get(NAME_LABEL)
        if isinstance(name, str) and name:
            self.controllers.mark_dirty(STORAGE, md.get("namespace", ""), name)

    def reconcile(self, storage: str, lws: Obj) -> None:  # noqa: ARG002 - one storage: leaderworkersets
        if self._default(lws):
            return
        try:
            plan = plan_of(lws)
        except SpecError as exc:
            self.controllers.cluster.record_event(
                lws, "Warning", "InvalidSpec", f"{exc.field}: {exc.problem}", COMPONENT
            )
            return
        leaders = self._leader_statefulset(lws, plan)
        if leaders is None:
            return
        ns = lws["metadata"]["namespace"]
        ready = 0
        present = 0
        for owned in self.controllers.owned_pods(leaders):
            index = _ordinal(owned["metadata"]["name"], leaders["metadata"]["name"])
            if index is None:
                continue
            leader = self._label_leader(owned, index)
            present += 1
            workers = self._worker_statefulset(lws, plan, leader)
            if self._group_ready(leader, workers, plan):
                ready += 1
        self._status(lws, plan, ready, present, ns)

    # --- defaults and the leaders ------------------------------------------------------------------------------
    def _default(self, lws: Obj) -> bool:
        """Store the set with the defaults LWS's schema gives to what it leaves out; True when it did."""
        spec = lws.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("leaderWorkerTemplate"), dict):
            return False
        lwt = spec["leaderWorkerTemplate"]
        if "replicas" in spec and "startupPolicy" in spec and "size" in lwt:
            return False
        defaulted = {
            "replicas": 1,
            "startupPolicy": LEADER_CREATED,
            **spec,
            "leaderWorkerTemplate": {"size": 1, **lwt},
        }
        self.controllers.cluster.store.put(
            STORAGE, {**lws, "metadata": dict(lws["metadata"]), "spec": defaulted}
        )
        return True

    def _leader_statefulset(self, lws: Obj, plan: Plan) -> Obj | None:
        """The leaders' StatefulSet, created or scaled to the set's groups; None when it is not the set's."""
        md = lws["metadata"]
        ctl = self.controllers
        statefulsets = ctl.cluster.store.storage(_STATEFULSETS)
        current = statefulsets.get(md["namespace"], md["name"])
        if current is None:
            template = _template(
                plan.leader_template,
                {WORKER_INDEX_LABEL: "0", NAME_LABEL: md["name"], TEMPLATE_REVISION_LABEL: plan.revision},
                self._pod_annotations(plan),
            )
            manifest = {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {
                    "name": md["name"],
                    "namespace": md["namespace"],
                    "labels": {NAME_LABEL: md["name"], TEMPLATE_REVISION_LABEL: plan.revision},
                    "ownerReferences": [controller_ref(lws)],
                },
                "spec": {
                    "replicas": plan.groups,
                    "serviceName": md["name"],
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {NAME_LABEL: md["name"], WORKER_INDEX_LABEL: "0"}},
                    "template": template,
                },
            }
            if not ctl.create_owned(lws, STORAGE, _STATEFULSETS, manifest):
                return None
            current = statefulsets.get(md["namespace"], md["name"])
        if current is None or (controller_of(current) or {}).get("uid") != md["uid"]:
            return None
        if (current.get("spec") or {}).get("replicas") != plan.groups:
            current = ctl.cluster.store.put(
                _STATEFULSETS,
                {
                    **current,
                    "metadata": dict(current["metadata"]),
                    "spec": {**current["spec"], "replicas": plan.groups},
                },
            )
        return current

    def _pod_annotations(self, plan: Plan) -> dict[str, str]:
        out = {SIZE_ANNOTATION: str(plan.size)}
        if plan.sub_group_size is not None:
            out[SUBGROUP_SIZE_ANNOTATION] = str(plan.sub_group_size)
        return out

    def _label_leader(self, pod: Obj, index: int) -> Obj:
        md = pod["metadata"]
        labels = md.get("labels") or {}
        wanted = {GROUP_INDEX_LABEL: str(index), GROUP_KEY_LABEL: group_key(md["namespace"], md["name"])}
        return self._labelled(pod, {k: v for k, v in wanted.items() if k not in labels})

    def _labelled(self, pod: Obj, missing: Mapping[str, str]) -> Obj:
        """`pod` with the labels LWS's webhook would have given it at creation."""
        if not missing:
            return pod
        md = pod["metadata"]
        return self.controllers.cluster.store.put(
            "pods", {**pod, "metadata": {**md, "labels": {**(md.get("labels") or {}), **missing}}}
        )

    # --- a group's workers ---------------------------------------------------------------------------------------
    def _worker_statefulset(self, lws: Obj, plan: Plan, leader: Obj) -> Obj | None:
        """The group's workers' StatefulSet, created when the startup policy allows; its pods labelled."""
        ctl = self.controllers
        md = leader["metadata"]
        name = md["name"]
        statefulsets = ctl.cluster.store.storage(_STATEFULSETS)
        current = statefulsets.get(md["namespace"], name)
        if current is None:
            if plan.size == 1 or md.get("deletionTimestamp"):
                return None
            if plan.startup == LEADER_READY and not is_ready(leader):
                return None
            if not ctl.create_owned(lws, STORAGE, _STATEFULSETS, self._worker_manifest(lws, plan, leader)):
                return None
            current = statefulsets.get(md["namespace"], name)
        if current is None or (controller_of(current) or {}).get("uid") != md["uid"]:
            return None
        for pod in ctl.owned_pods(current):
            index = _ordinal(pod["metadata"]["name"], name)
            if index is not None and WORKER_INDEX_LABEL not in (pod["metadata"].get("labels") or {}):
                self._labelled(pod, {WORKER_INDEX_LABEL: str(index)})
        return current

    def _worker_manifest(self, lws: Obj, plan: Plan, leader: Obj) -> Obj:
        lws_name = lws["metadata"]["name"]
        md = leader["metadata"]
        group_labels = {
            GROUP_INDEX_LABEL: md["labels"][GROUP_INDEX_LABEL],
            NAME_LABEL: lws_name,
            GROUP_KEY_LABEL: md["labels"][GROUP_KEY_LABEL],
        }
        labels = {**group_labels, TEMPLATE_REVISION_LABEL: plan.revision}
        annotations = {**self._pod_annotations(plan), LEADER_NAME_ANNOTATION: md["name"]}
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": md["name"],
                "namespace": md["namespace"],
                "labels": labels,
                "ownerReferences": [controller_ref(leader)],
            },
            "spec": {
                "replicas": plan.size - 1,
                "ordinals": {"start": 1},
                "serviceName": lws_name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": group_labels},
                "template": _template(plan.worker_template, labels, annotations),
            },
        }

    def _group_ready(self, leader: Obj, workers: Obj | None, plan: Plan) -> bool:
        if not is_ready(leader) or leader["metadata"].get("deletionTimestamp"):
            return False
        if plan.size == 1:
            return True
        if workers is None:
            return False
        ready = [p for p in self.controllers.owned_pods(workers) if is_ready(p)]
        return len(ready) >= plan.size - 1

    # --- status ------------------------------------------------------------------------------------------------
    def _status(self, lws: Obj, plan: Plan, ready: int, present: int, ns: str) -> None:
        ctl = self.controllers
        md = lws["metadata"]
        now = rfc3339(ctl.cluster.now())
        old = lws.get("status") or {}
        conditions: list[Obj] = [dict(c) for c in old.get("conditions") or ()]
        available = ready == plan.groups
        wanted = (
            ("Available", "AllGroupsReady", "All replicas are ready")
            if available
            else ("Progressing", "GroupsProgressing", "Replicas are progressing")
        )
        other = "Progressing" if available else "Available"
        found = False
        for c in conditions:
            if c.get("type") == wanted[0]:
                found = True
                if c.get("status") != "True":
                    c.update(_condition(wanted[0], "True", wanted[1], wanted[2], now))
            elif c.get("type") == other and c.get("status") == "True":
                c.update(_condition(other, "False", c.get("reason", ""), c.get("message", ""), now))
        if not found:
            conditions.append(_condition(wanted[0], "True", wanted[1], wanted[2], now))
        status: Obj = {
            "conditions": conditions,
            "replicas": plan.groups,
            "readyReplicas": ready,
            "updatedReplicas": present,
            "hpaPodSelector": f"{NAME_LABEL}={md['name']},{WORKER_INDEX_LABEL}=0",
        }
        current = ctl.cluster.store.storage(STORAGE).get(ns, md["name"])
        if current is not None and current["metadata"].get("uid") == md.get("uid"):
            ctl.write_status(STORAGE, current, status)


OPERATOR = OperatorSpec(
    name="leaderworkerset",
    crds=(LWS_CRD,),
    storages={STORAGE: COMPONENT},
    owners={(API_VERSION, KIND): STORAGE},
    start=LeaderWorkerSetController,
)
