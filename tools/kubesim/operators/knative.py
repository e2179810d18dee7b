"""Knative Serving in the simulated API server: its CRDs, served from the start, and a simulated Serving
controller that turns a Knative Service into the Configuration, Revision and Deployment Knative makes, so
that a Service written for Knative (and for KAI) applies unchanged and its pods run.

**CRDs** (`KNATIVE_CRDS`, created by `Cluster` at start through `OPERATOR`): Service (short names
``ksvc``, ``kservice``), Configuration (``config``, ``cfg``) and Revision (``rev``), all
``serving.knative.dev/v1``, namespaced, schema-less, with the status subresource and the columns
``kubectl get ksvc`` prints (URL, latest created and ready revision, Ready and its reason).

**Controller** (`KnativeServing`, started by `tools.kubesim.controllers.Controllers` through `OPERATOR`):

- A Service gets a Configuration of its name (its labels plus ``serving.knative.dev/service`` and
  ``serviceUID``, its annotations but kubectl's last-applied one, ``spec.template`` copied), owned by the
  Service; a changed template is copied again, which makes the Configuration's next generation. No Route
  is made: the Service's status says what a Route would (``url`` ``http://<name>.<namespace>.example.com``,
  Knative's default domain, ``address``, all traffic to the latest ready Revision).
- A Configuration gets, for each generation, a Revision ``<configuration>-<generation, 5 digits>`` (or the
  name ``spec.template.metadata.name`` gives), owned by the Configuration, with the template's labels and
  annotations, the labels ``serving.knative.dev/configuration``, ``configurationUID``,
  ``configurationGeneration`` (and ``service``, ``serviceUID`` from the Configuration's), and the
  template's spec.
- A Revision gets a Deployment ``<revision>-deployment`` owned by the Revision, labelled with the
  Revision's labels plus ``serving.knative.dev/revision``, ``revisionUID`` and ``app``, selecting on
  ``revisionUID``, its pod template carrying the same labels, the Revision's annotations and its pod spec
  (unnamed containers are ``user-container``); kubesim's Deployment controller makes the pods. Replicas
  (`scale_of`): the larger of ``autoscaling.knative.dev/initial-scale`` (Knative's default 1) and
  ``min-scale``, at most ``max-scale`` (when not 0), the older ``initialScale``/``minScale``/``maxScale``
  spellings read when the new ones are absent; a Revision no longer routed (neither its Configuration's
  latest created nor latest ready, nor named in the Service's ``spec.traffic``) goes to 0, as Knative
  scales unrouted Revisions to zero.
- Status: Revision ``actualReplicas`` (ready pods), ``desiredReplicas`` and Ready once all its pods are
  ready (and from then on); Configuration ``latestCreatedRevisionName``, ``latestReadyRevisionName`` and
  Ready (the latest created is ready); Service the same two names, ``ConfigurationsReady``,
  ``RoutesReady`` and Ready. Conditions are sorted by type, as Knative writes them.

Malformed specs (kubesim has no Knative webhook to refuse them): a template or Revision spec that is not an
object or lists no container makes nothing, records a Warning Event naming the field on the object and
sets its Ready condition False; an unreadable scale annotation (not a whole number >= 0, or a min-scale
above max-scale) is ignored for the Deployment's size (so the Revision's pods still exist, and the
pod-grouper holds them back naming the annotation) and recorded as a Warning Event on the Revision.

Not simulated: Routes, Ingresses and the Kubernetes Services Knative makes, traffic and request-driven
autoscaling (no scale-to-zero for want of requests), the queue-proxy sidecar, tag and percent splits,
revision garbage collection, the ``serving.knative.dev/creator`` annotations. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shared.kube import values
from tools.kubesim.objects import clone, controller_of, controller_ref, rfc3339
from tools.kubesim.operators import OperatorSpec, custom_resource_definition, printer_column
from tools.kubesim.store import Change

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = [
    "CONFIGURATION_LABEL",
    "KNATIVE_CRDS",
    "MAX_REPLICAS",
    "REVISION_LABEL",
    "SERVICE_LABEL",
    "KnativeServing",
    "child_name",
    "scale_of",
]

Obj = dict[str, Any]

GROUP = "serving.knative.dev"
API_VERSION = f"{GROUP}/v1"
SERVICES = f"{GROUP}/services"
CONFIGURATIONS = f"{GROUP}/configurations"
REVISIONS = f"{GROUP}/revisions"
DEPLOYMENTS = "apps/deployments"

SERVICE_LABEL = f"{GROUP}/service"
SERVICE_UID_LABEL = f"{GROUP}/serviceUID"
CONFIGURATION_LABEL = f"{GROUP}/configuration"
CONFIGURATION_UID_LABEL = f"{GROUP}/configurationUID"
CONFIGURATION_GENERATION_LABEL = f"{GROUP}/configurationGeneration"
REVISION_LABEL = f"{GROUP}/revision"
REVISION_UID_LABEL = f"{GROUP}/revisionUID"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_AUTOSCALING = "autoscaling.knative.dev/"
INITIAL_SCALE = (_AUTOSCALING + "initial-scale", _AUTOSCALING + "initialScale")
MIN_SCALE = (_AUTOSCALING + "min-scale", _AUTOSCALING + "minScale")
MAX_SCALE = (_AUTOSCALING + "max-scale", _AUTOSCALING + "maxScale")
"""Each annotation's current spelling, then its older one (read when the current one is absent)."""

DEFAULT_INITIAL_SCALE = 1
"""Knative's ``initial-scale`` default (config-autoscaler)."""

MAX_REPLICAS = 1000
"""The most pods kubesim gives one Revision: it has no webhook to refuse a hostile scale."""

DOMAIN = "example.com"
"""Knative's default domain (config-domain), in a Service's URL."""

LONGEST_NAME = 63
"""Knative's ``kmeta.ChildName`` keeps a child's name a DNS label (it is a label value too)."""

_REVISION_SPEC_ONLY = (
    "containerConcurrency",
    "timeoutSeconds",
    "responseStartTimeoutSeconds",
    "idleTimeoutSeconds",
)
"""RevisionSpec fields that are not the pod's."""

_COMPONENTS = {
    SERVICES: "service-controller",
    CONFIGURATIONS: "configuration-controller",
    REVISIONS: "revision-controller",
}


# --- CRDs -----------------------------------------------------------------------------------------------
def _crd(kind: str, plural: str, short_names: list[str], columns: list[Obj]) -> Obj:
    return custom_resource_definition(
        GROUP,
        kind,
        plural,
        ["v1"],
        short_names=short_names,
        categories=["all", "knative", "serving"],
        subresources={"status": {}},
        columns=columns,
        labels={"serving.knative.dev/release": "v1.17.0"},
    )


# Knative's columns select the Ready condition with a filter ([?(@.type=='Ready')]); kubesim's printer
# follows plain paths only, so they name its place: conditions are written sorted by type.
KNATIVE_CRDS: tuple[Obj, ...] = (
    _crd(
        "Service",
        "services",
        ["kservice", "ksvc"],
        [
            printer_column("URL", ".status.url"),
            printer_column("LatestCreated", ".status.latestCreatedRevisionName"),
            printer_column("LatestReady", ".status.latestReadyRevisionName"),
            printer_column("Ready", ".status.conditions[1].status"),
            printer_column("Reason", ".status.conditions[1].reason"),
        ],
    ),
    _crd(
        "Configuration",
        "configurations",
        ["config", "cfg"],
        [
            printer_column("LatestCreated", ".status.latestCreatedRevisionName"),
            printer_column("LatestReady", ".status.latestReadyRevisionName"),
            printer_column("Ready", ".status.conditions[0].status"),
            printer_column("Reason", ".status.conditions[0].reason"),
        ],
    ),
    _crd(
        "Revision",
        "revisions",
        ["rev"],
        [
            printer_column("Ready", ".status.conditions[2].status"),
            printer_column("Reason", ".status.conditions[2].reason"),
            printer_column("Actual Replicas", ".status.actualReplicas", "integer"),
            printer_column("Desired Replicas", ".status.desiredReplicas", "integer"),
        ],
    ),
)
"""The CustomResourceDefinitions kubesim serves from its start."""


# --- pure helpers ---------------------------------------------------------------------------------------
def child_name(parent: str, suffix: str) -> str:
    """Knative's ``kmeta.ChildName``: ``parent + suffix``, the parent cut and an md5 of it put in when
    that would pass 63 characters."""
    if len(parent) + len(suffix) <= LONGEST_NAME:
        return parent + suffix
    digest = hashlib.md5(parent.encode(), usedforsecurity=False).hexdigest()
    head = max(0, LONGEST_NAME - len(suffix) - len(digest))
    return (parent[:head] + digest)[: max(0, LONGEST_NAME - len(suffix))] + suffix


def _annotation(annotations: Mapping[str, Any], spellings: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in spellings:
        if key in annotations:
            return key, annotations[key]
    return None


def scale_of(annotations: Mapping[str, Any]) -> tuple[int, list[str]]:
    """How many pods a routed Revision with these annotations keeps, and the problems with them (each
    names the annotation): the larger of initial-scale and min-scale, at most max-scale when not 0, and
    at most `MAX_REPLICAS`. A value that is not a whole number >= 0 is ignored, and so is a max-scale
    below min-scale (Knative's webhook refuses both)."""
    problems: list[str] = []

    def read(spellings: tuple[str, ...], default: int) -> int:
        found = _annotation(annotations, spellings)
        if found is None:
            return default
        key, raw = found
        try:
            return values.whole(raw, low=0, high=values.INT32_MAX, what="a whole number of pods")
        except values.InvalidValueError as exc:
            problems.append(f"metadata.annotations[{key}]: {exc}")
            return default

    initial = read(INITIAL_SCALE, DEFAULT_INITIAL_SCALE)
    low = read(MIN_SCALE, 0)
    high = read(MAX_SCALE, 0)
    if high and low > high:
        problems.append(
            f"metadata.annotations[{MIN_SCALE[0]}]: must be at most max-scale ({high}), got {low}"
        )
        high = 0
    replicas = max(initial, low)
    if high:
        replicas = min(replicas, high)
    return min(replicas, MAX_REPLICAS), problems


def _pod_spec_problem(spec: Any, where: str) -> tuple[str, str] | None:
    """What makes `spec` no pod spec a Knative webhook would take (the field and why), or None."""
    if not isinstance(spec, dict):
        return where, "must be an object"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return f"{where}.containers", "must list at least one container"
    for i, container in enumerate(containers):
        if not isinstance(container, dict):
            return f"{where}.containers[{i}]", "must be an object"
    return None


def _string_map_problem(value: Any, where: str) -> tuple[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return where, "must map names to strings"
    return None


def _template_problem(template: Any, where: str) -> tuple[str, str] | None:
    """What makes a Service's or Configuration's revision template malformed (the field and why), or None."""
    if not isinstance(template, dict):
        return where, "must be an object"
    md = template.get("metadata")
    if md is not None and not isinstance(md, dict):
        return f"{where}.metadata", "must be an object"
    md = md or {}
    name = md.get("name")
    if name is not None and not isinstance(name, str):
        return f"{where}.metadata.name", "must be a string"
    return (
        _string_map_problem(md.get("labels"), f"{where}.metadata.labels")
        or _string_map_problem(md.get("annotations"), f"{where}.metadata.annotations")
        or _pod_spec_problem(template.get("spec"), f"{where}.spec")
    )


def _condition(old: Mapping[str, Obj], type_: str, status: str, reason: str, message: str, now: str) -> Obj:
    """A Knative condition; the old one's transition time is kept when its status did not change."""
    cond: Obj = {"type": type_, "status": status}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    prev = old.get(type_)
    same = prev is not None and prev.get("status") == status
    cond["lastTransitionTime"] = prev.get("lastTransitionTime", now) if same and prev else now
    return cond


def _conditions_of(obj: Obj) -> dict[str, Obj]:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return {c["type"]: c for c in conditions if isinstance(c, dict) and isinstance(c.get("type"), str)}


def _is_true(obj: Obj | None, type_: str) -> bool:
    return obj is not None and _conditions_of(obj).get(type_, {}).get("status") == "True"


def _controlled_by(obj: Obj | None, owner: Obj) -> bool:
    ref = controller_of(obj) if obj is not None else None
    return ref is not None and ref.get("uid") == owner["metadata"]["uid"]


def _int_label(obj: Obj, key: str) -> int:
    text = (obj["metadata"].get("labels") or {}).get(key, "")
    return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) < 10 else 0


# --- the controller -------------------------------------------------------------------------------------
class KnativeServing:
    """Knative Serving's Service, Configuration and Revision controllers, for `Controllers`."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers
        controllers.cluster.store.storage(DEPLOYMENTS).listeners.append(self._deployment_changed)

    def reconcile(self, storage: str, obj: Obj) -> None:
        if storage == SERVICES:
            self._service(obj)
        elif storage == CONFIGURATIONS:
            self._configuration(obj)
        elif storage == REVISIONS:
            self._revision(obj)

    # --- plumbing ---------------------------------------------------------------------------------------
    def _deployment_changed(self, change: Change) -> None:
        """A Revision's Deployment changed (its pods became ready, ...): reconcile the Revision."""
        ref = controller_of(change.obj)
        if ref is not None and ref.get("apiVersion") == API_VERSION and ref.get("kind") == "Revision":
            self._mark(REVISIONS, change.obj["metadata"].get("namespace", ""), str(ref.get("name", "")))

    def _mark(self, storage: str, namespace: str, name: str) -> None:
        self.controllers.mark_dirty(storage, namespace, name)

    def _get(self, storage: str, namespace: str, name: str) -> Obj | None:
        found: Obj | None = self.controllers.cluster.store.storage(storage).get(namespace, name)
        return found

    def _owner(self, obj: Obj, storage: str, kind: str) -> Obj | None:
        """The object of `kind` (kept in `storage`) that controls `obj`, when it still exists."""
        ref = controller_of(obj)
        if ref is None or ref.get("kind") != kind or ref.get("apiVersion") != API_VERSION:
            return None
        owner = self._get(storage, obj["metadata"].get("namespace", ""), str(ref.get("name", "")))
        return owner if owner is not None and owner["metadata"].get("uid") == ref.get("uid") else None

    def _owned(self, owner: Obj, storage: str) -> list[Obj]:
        store = self.controllers.cluster.store
        out: list[Obj] = []
        for key, ns, name in store.dependents_of(owner["metadata"]["uid"]):
            obj = self._get(key, ns, name) if key == storage else None
            if _controlled_by(obj, owner):
                assert obj is not None
                out.append(obj)
        return out

    def _warn(self, storage: str, obj: Obj, reason: str, message: str) -> None:
        self.controllers.cluster.record_event(obj, "Warning", reason, message, _COMPONENTS[storage])

    def _write_status(self, storage: str, obj: Obj, status: Obj) -> bool:
        """Store `status` on the current `obj`; True when it changed."""
        md = obj["metadata"]
        current = self._get(storage, md.get("namespace", ""), md["name"])
        if (
            current is None
            or current["metadata"].get("uid") != md.get("uid")
            or current.get("status") == status
        ):
            return False
        self.controllers.write_status(storage, current, status)
        return True

    def _now(self) -> str:
        return rfc3339(self.controllers.cluster.now())

    # --- Service ----------------------------------------------------------------------------------------
    def _service(self, svc: Obj) -> None:
        md = svc["metadata"]
        ns, name = md["namespace"], md["name"]
        template = (svc.get("spec") or {}).get("template")
        problem = _template_problem(template, "spec.template")
        config = self._get(CONFIGURATIONS, ns, name)
        if problem is not None:
            field, why = problem
            self._warn(SERVICES, svc, "InvalidSpec", f"{field}: {why}")
            self._service_status(svc, None, ("InvalidSpec", f"{field}: {why}"))
            return
        labels = {**(md.get("labels") or {}), SERVICE_LABEL: name, SERVICE_UID_LABEL: md["uid"]}
        annotations = {k: v for k, v in (md.get("annotations") or {}).items() if k != LAST_APPLIED}
        spec = {"template": clone(template)}
        if config is None:
            manifest: Obj = {
                "apiVersion": API_VERSION,
                "kind": "Configuration",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [controller_ref(svc)],
                },
                "spec": spec,
            }
            self.controllers.create_owned(svc, SERVICES, CONFIGURATIONS, manifest)
            config = self._get(CONFIGURATIONS, ns, name)
        elif not _controlled_by(config, svc):
            message = f'Service "{name}" does not own Configuration: "{name}"'
            self._service_status(svc, None, ("NotOwned", message))
            return
        else:
            cmd = config["metadata"]
            if (
                config.get("spec") != spec
                or cmd.get("labels") != labels
                or cmd.get("annotations") != annotations
            ):
                new_md = {**cmd, "labels": labels, "annotations": annotations}
                if config.get("spec") != spec:
                    new_md["generation"] = int(cmd.get("generation", 1)) + 1
                self.controllers.cluster.store.put(
                    CONFIGURATIONS, {**config, "metadata": new_md, "spec": spec}
                )
                config = self._get(CONFIGURATIONS, ns, name)
        self._service_status(svc, config, None)

    def _service_status(self, svc: Obj, config: Obj | None, failure: tuple[str, str] | None) -> None:
        md = svc["metadata"]
        ns, name = md["namespace"], md["name"]
        old = _conditions_of(svc)
        now = self._now()
        cstatus = (config.get("status") or {}) if config is not None else {}
        created = cstatus.get("latestCreatedRevisionName")
        ready_name = cstatus.get("latestReadyRevisionName")
        status: Obj = {"observedGeneration": md.get("generation", 1)}
        if failure is not None:
            reason, message = failure
            configs = ("False", reason, message)
            routes = ("False", reason, message)
        elif _is_true(config, "Ready") and ready_name:
            configs = routes = ("True", "", "")
        else:
            waiting = f'Configuration "{name}" is waiting for a Revision to become ready.'
            configs = ("Unknown", "RevisionMissing", waiting)
            routes = ("Unknown", "RevisionMissing", waiting) if not ready_name else ("True", "", "")
        ready = configs if configs[0] != "True" else routes
        status["conditions"] = [
            _condition(old, "ConfigurationsReady", *configs, now),
            _condition(old, "Ready", *ready, now),
            _condition(old, "RoutesReady", *routes, now),
        ]
        if created:
            status["latestCreatedRevisionName"] = created
        if ready_name:
            status["latestReadyRevisionName"] = ready_name
            status["url"] = f"http://{name}.{ns}.{DOMAIN}"
            status["address"] = {"url": f"http://{name}.{ns}.svc.cluster.local"}
            status["traffic"] = [{"revisionName": ready_name, "latestRevision": True, "percent": 100}]
        self._write_status(SERVICES, svc, status)

    # --- Configuration ----------------------------------------------------------------------------------
    def _configuration(self, config: Obj) -> None:
        md = config["metadata"]
        ns, name = md["namespace"], md["name"]
        template = (config.get("spec") or {}).get("template")
        problem = _template_problem(template, "spec.template")
        generation = int(md.get("generation", 1))
        old = _conditions_of(config)
        now = self._now()
        if problem is not None:
            field, why = problem
            self._warn(CONFIGURATIONS, config, "InvalidSpec", f"{field}: {why}")
            status: Obj = {
                "observedGeneration": generation,
                "conditions": [_condition(old, "Ready", "False", "InvalidSpec", f"{field}: {why}", now)],
            }
            if self._write_status(CONFIGURATIONS, config, status):
                self._mark_owner(config, SERVICES, "Service")
            return
        assert isinstance(template, dict)
        tmd = template.get("metadata") or {}
        rev_name = tmd.get("name") or child_name(name, f"-{generation:05d}")
        revision = self._get(REVISIONS, ns, rev_name)
        if revision is None:
            self.controllers.create_owned(
                config, CONFIGURATIONS, REVISIONS, self._revision_for(config, rev_name)
            )
            revision = self._get(REVISIONS, ns, rev_name)
        revisions = self._owned(config, REVISIONS)
        ready = [r for r in revisions if _is_true(r, "Ready")]
        latest_ready = max(ready, key=lambda r: _int_label(r, CONFIGURATION_GENERATION_LABEL), default=None)
        status = {"observedGeneration": generation}
        if revision is not None and _controlled_by(revision, config):
            status["latestCreatedRevisionName"] = rev_name
            if _is_true(revision, "Ready"):
                cond = _condition(old, "Ready", "True", "", "", now)
            else:
                cond = _condition(old, "Ready", "Unknown", "", "", now)
        else:
            message = f'Configuration "{name}" does not own Revision: "{rev_name}"'
            cond = _condition(old, "Ready", "False", "NotOwned", message, now)
        if latest_ready is not None:
            status["latestReadyRevisionName"] = latest_ready["metadata"]["name"]
        status["conditions"] = [cond]
        if self._write_status(CONFIGURATIONS, config, status):
            for r in revisions:
                self._mark(REVISIONS, ns, r["metadata"]["name"])
            self._mark_owner(config, SERVICES, "Service")

    def _revision_for(self, config: Obj, name: str) -> Obj:
        md = config["metadata"]
        template = config["spec"]["template"]
        tmd = template.get("metadata") or {}
        labels = {
            **(tmd.get("labels") or {}),
            CONFIGURATION_LABEL: md["name"],
            CONFIGURATION_UID_LABEL: md["uid"],
            CONFIGURATION_GENERATION_LABEL: str(md.get("generation", 1)),
        }
        for key in (SERVICE_LABEL, SERVICE_UID_LABEL):
            if key in (md.get("labels") or {}):
                labels[key] = md["labels"][key]
        return {
            "apiVersion": API_VERSION,
            "kind": "Revision",
            "metadata": {
                "name": name,
                "namespace": md["namespace"],
                "labels": labels,
                "annotations": dict(tmd.get("annotations") or {}),
                "ownerReferences": [controller_ref(config)],
            },
            "spec": clone(template["spec"]),
        }

    def _mark_owner(self, obj: Obj, storage: str, kind: str) -> None:
        ref = controller_of(obj)
        if ref is not None and ref.get("kind") == kind and ref.get("apiVersion") == API_VERSION:
            self._mark(storage, obj["metadata"].get("namespace", ""), str(ref.get("name", "")))

    # --- Revision ---------------------------------------------------------------------------------------
    def _revision(self, revision: Obj) -> None:
        md = revision["metadata"]
        ns, name = md["namespace"], md["name"]
        spec = revision.get("spec")
        old = _conditions_of(revision)
        now = self._now()
        problem = _pod_spec_problem(spec, "spec") or _string_map_problem(
            md.get("annotations"), "metadata.annotations"
        )
        if problem is not None:
            field, why = problem
            self._warn(REVISIONS, revision, "InvalidSpec", f"{field}: {why}")
            failed = ("False", "InvalidSpec", f"{field}: {why}")
            self._revision_status(revision, 0, 0, failed, old, now)
            return
        scale, problems = scale_of(md.get("annotations") or {})
        replicas = scale if self._routed(revision) else 0
        deployment_name = f"{name}-deployment"
        deployment = self._get(DEPLOYMENTS, ns, deployment_name)
        if deployment is None:
            for text in problems:
                self._warn(REVISIONS, revision, "InvalidAnnotation", text)
            self.controllers.create_owned(
                revision, REVISIONS, DEPLOYMENTS, self._deployment_for(revision, deployment_name, replicas)
            )
            deployment = self._get(DEPLOYMENTS, ns, deployment_name)
        elif (
            _controlled_by(deployment, revision)
            and (deployment.get("spec") or {}).get("replicas") != replicas
        ):
            dmd = dict(deployment["metadata"])
            dmd["generation"] = int(dmd.get("generation", 1)) + 1
            self.controllers.cluster.store.put(
                DEPLOYMENTS,
                {**deployment, "metadata": dmd, "spec": {**deployment["spec"], "replicas": replicas}},
            )
        if deployment is None or not _controlled_by(deployment, revision):
            message = f'Revision "{name}" does not own Deployment: "{deployment_name}"'
            self._revision_status(revision, replicas, 0, ("False", "NotOwned", message), old, now)
            return
        ready_pods = int((deployment.get("status") or {}).get("readyReplicas", 0) or 0)
        if _is_true(revision, "Ready") or (ready_pods >= max(1, replicas)):
            state = ("True", "", "")
        else:
            state = ("Unknown", "Deploying", "")
        self._revision_status(revision, replicas, ready_pods, state, old, now)

    def _revision_status(
        self,
        revision: Obj,
        desired: int,
        actual: int,
        state: tuple[str, str, str],
        old: Mapping[str, Obj],
        now: str,
    ) -> None:
        if state[0] != "True":
            active = (
                ("Unknown", state[1], state[2]) if state[0] == "Unknown" else ("False", state[1], state[2])
            )
        elif desired == 0:
            active = ("False", "NoTraffic", "The target is not receiving traffic.")
        else:
            active = ("True", "", "")
        status: Obj = {
            "observedGeneration": revision["metadata"].get("generation", 1),
            "actualReplicas": actual,
            "desiredReplicas": desired,
            "conditions": [
                _condition(old, "Active", *active, now),
                _condition(old, "ContainerHealthy", *state, now),
                _condition(old, "Ready", *state, now),
                _condition(old, "ResourcesAvailable", *state, now),
            ],
        }
        if self._write_status(REVISIONS, revision, status):
            self._mark_owner(revision, CONFIGURATIONS, "Configuration")

    def _routed(self, revision: Obj) -> bool:
        """Whether traffic may reach the Revision: its Configuration's latest created or latest ready, or
        named in its Service's ``spec.traffic``; one without a Configuration keeps its pods."""
        name = revision["metadata"]["name"]
        config = self._owner(revision, CONFIGURATIONS, "Configuration")
        if config is None:
            return True
        cstatus = config.get("status") or {}
        if name in (cstatus.get("latestCreatedRevisionName"), cstatus.get("latestReadyRevisionName")):
            return True
        if not cstatus.get("latestCreatedRevisionName"):
            return True
        svc = self._owner(config, SERVICES, "Service")
        traffic = (svc.get("spec") or {}).get("traffic") if svc is not None else None
        return isinstance(traffic, list) and any(
            isinstance(t, dict) and t.get("revisionName") == name for t in traffic
        )

    def _deployment_for(self, revision: Obj, name: str, replicas: int) -> Obj:
        md = revision["metadata"]
        labels = {**(md.get("labels") or {}), REVISION_LABEL: md["name"], REVISION_UID_LABEL: md["uid"]}
        labels.setdefault("app", md["name"])
        annotations = {k: v for k, v in (md.get("annotations") or {}).items() if k != LAST_APPLIED}
        pod_spec = {k: v for k, v in clone(revision["spec"]).items() if k not in _REVISION_SPEC_ONLY}
        for container in pod_spec["containers"]:
            if not container.get("name"):
                container["name"] = "user-container"
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": md["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [controller_ref(revision)],
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {REVISION_UID_LABEL: md["uid"]}},
                "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
            },
        }


OPERATOR = OperatorSpec(
    name="knative",
    crds=KNATIVE_CRDS,
    storages=_COMPONENTS,
    owners={
        (API_VERSION, "Service"): SERVICES,
        (API_VERSION, "Configuration"): CONFIGURATIONS,
        (API_VERSION, "Revision"): REVISIONS,
    },
    start=KnativeServing,
)
