"""What the real API server does per kind on create and update, reduced to what clients can observe.

`prepare_create` fills the defaults a client reads back (a pod's schedulerName and Pending status, a Job's
parallelism/completions and selector, a Deployment's replicas, a Namespace's phase, a CRD's conditions)
and resets the status of kinds with a status subresource, as the real registry strategies do;
`validate` rejects obviously invalid objects with 422 Invalid; `check_pod_update` forbids the pod spec
changes the real server forbids (a pod is bound only through pods/binding); `to_events_v1` and
`from_events_v1` convert between the stored core/v1 Event and events.k8s.io/v1. Called by
`tools.kubesim.cluster`. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from tools.kubesim import admission
from tools.kubesim.errors import ApiError, bad_request, invalid
from tools.kubesim.objects import clone, meta, rfc3339
from tools.kubesim.resources import ResourceType

__all__ = [
    "JOB_CONTROLLER_UID_LABELS",
    "JOB_NAME_LABELS",
    "check_crd",
    "check_name",
    "check_pod_update",
    "default_object",
    "default_pod_spec",
    "from_events_v1",
    "prepare_create",
    "to_events_v1",
    "validate",
    "validate_create",
]

Obj = dict[str, Any]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kinds whose names must be DNS labels (the rest are DNS subdomains); events allow more (they use ".").
_LABEL_NAMED = {"namespaces", "services"}
_FREE_NAMED = {"events"}

JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
JOB_CONTROLLER_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")


def check_name(rt: ResourceType, name: Any, *, kind: str = "") -> None:
    """422 Invalid unless `name` is a valid object name for `rt`."""
    kind = kind or rt.kind
    if not isinstance(name, str) or not name:
        raise invalid(kind, "", "metadata.name", "Required value: name or generateName is required")
    if rt.storage in _FREE_NAMED:
        if "/" in name or len(name) > 253:
            raise invalid(kind, name, "metadata.name", "Invalid value: may not contain '/'", value=None)
        return
    if rt.storage in _LABEL_NAMED:
        ok = len(name) <= 63 and _DNS_LABEL.match(name) is not None
        rule = "a lowercase RFC 1123 label (at most 63 characters)"
    else:
        ok = len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None
        rule = "a lowercase RFC 1123 subdomain (at most 253 characters)"
    if not ok:
        raise invalid(kind, name, "metadata.name", f"must be {rule}", value=name)


def check_namespace_name(kind: str, name: str, namespace: Any) -> None:
    """422 Invalid unless `namespace` could name a namespace (a DNS label)."""
    if not isinstance(namespace, str) or len(namespace) > 63 or _DNS_LABEL.match(namespace) is None:
        raise invalid(kind, name, "metadata.namespace", "must be a lowercase RFC 1123 label", value=namespace)


def validate(rt: ResourceType, obj: Obj) -> None:
    """The per-kind checks the real server makes that a client is likely to trip over."""
    name = meta(obj).get("name", "")
    for field in ("labels", "annotations"):
        value = meta(obj).get(field)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
        ):
            raise invalid(rt.kind, name, f"metadata.{field}", "must be a map of strings")
    spec = obj.get("spec")
    if rt.storage == "pods":
        if not isinstance(spec, dict):
            raise invalid("Pod", name, "spec", "Required value")
        containers = spec.get("containers")
        if not isinstance(containers, list) or not containers:
            raise invalid("Pod", name, "spec.containers", "Required value")
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c.get("name"):
                raise invalid("Pod", name, f"spec.containers[{i}].name", "Required value")
            if not c.get("image"):
                raise invalid("Pod", name, f"spec.containers[{i}].image", "Required value")
    elif rt.storage == "scheduling.k8s.io/priorityclasses":
        if not isinstance(obj.get("value"), int) or isinstance(obj.get("value"), bool):
            raise invalid("PriorityClass", name, "value", "Required value: an integer")
        if obj["value"] > 1_000_000_000 and not name.startswith("system-"):
            raise invalid(
                "PriorityClass", name, "value", "must not be greater than 1000000000", value=obj["value"]
            )
    elif rt.storage in {
        "batch/jobs",
        "apps/deployments",
        "apps/replicasets",
        "apps/statefulsets",
        "apps/daemonsets",
    }:
        if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
            raise invalid(rt.kind, name, "spec.template", "Required value")
        template_spec = spec["template"].get("spec")
        if not isinstance(template_spec, dict) or not template_spec.get("containers"):
            raise invalid(rt.kind, name, "spec.template.spec.containers", "Required value")
        if rt.storage == "batch/jobs" and template_spec.get("restartPolicy", "Always") not in {
            "Never",
            "OnFailure",
        }:
            raise invalid(
                "Job",
                name,
                "spec.template.spec.restartPolicy",
                'Unsupported value: supported values: "OnFailure", "Never"',
                value=template_spec.get("restartPolicy", "Always"),
            )
        for field in ("replicas", "parallelism", "completions"):
            value = spec.get(field)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise invalid(
                    rt.kind, name, f"spec.{field}", "must be greater than or equal to 0", value=value
                )
    elif rt.storage == "apiextensions.k8s.io/customresourcedefinitions":
        check_crd(obj)
    elif rt.storage in (admission.MUTATING, admission.VALIDATING):
        admission.validate_configuration(rt.storage, obj)


def check_crd(crd: Obj) -> None:
    """422 Invalid unless the CRD names a group, names and at least one served version."""
    name = meta(crd).get("name", "")
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        raise invalid("CustomResourceDefinition", name, "spec", "Required value")
    group = spec.get("group")
    if not isinstance(group, str) or "." not in group:
        raise invalid(
            "CustomResourceDefinition", name, "spec.group", "should be a domain with at least one dot"
        )
    names = spec.get("names")
    if not isinstance(names, dict) or not names.get("plural") or not names.get("kind"):
        raise invalid("CustomResourceDefinition", name, "spec.names", "plural and kind are required")
    if name != f"{names['plural']}.{group}":
        raise invalid(
            "CustomResourceDefinition", name, "metadata.name", 'must be spec.names.plural+"."+spec.group'
        )
    if spec.get("scope", "Namespaced") not in {"Namespaced", "Cluster"}:
        raise invalid(
            "CustomResourceDefinition", name, "spec.scope", 'supported values: "Cluster", "Namespaced"'
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        raise invalid("CustomResourceDefinition", name, "spec.versions", "must have at least one version")
    for i, v in enumerate(versions):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"]:
            raise invalid("CustomResourceDefinition", name, f"spec.versions[{i}].name", "Required value")
    if sum(1 for v in versions if v.get("storage")) != 1:
        raise invalid(
            "CustomResourceDefinition",
            name,
            "spec.versions",
            "must have exactly one version marked as storage version",
        )


def default_object(rt: ResourceType, obj: Obj) -> None:
    """The defaults the real server fills in when it decodes an object (create and update, and again after a
    mutating webhook changed it), in place: a pod's spec, a webhook configuration's policies."""
    if rt.storage == "pods":
        if isinstance(obj.get("spec"), dict):
            default_pod_spec(obj["spec"])
    elif rt.storage in (admission.MUTATING, admission.VALIDATING):
        admission.default_configuration(rt.storage, obj)


def validate_create(rt: ResourceType, obj: Obj) -> None:
    """The checks the real server makes only when an object is created: a pod may not name its node while it
    carries scheduling gates."""
    if rt.storage == "pods":
        spec = obj.get("spec") or {}
        if spec.get("nodeName") and spec.get("schedulingGates"):
            raise invalid(
                "Pod",
                meta(obj).get("name", ""),
                "spec.nodeName",
                "Forbidden: cannot be set until all schedulingGates have been cleared",
            )


def prepare_create(rt: ResourceType, obj: Obj, now: float) -> None:
    """Fill defaults and reset status the way the real server does for a new object (in place)."""
    spec = obj.get("spec")
    match rt.storage:
        case "pods":
            assert isinstance(spec, dict)
            default_pod_spec(spec)
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
            if spec.get("schedulingGates"):
                # Set by the API server itself, so `kubectl get pods` shows SchedulingGated at once.
                obj["status"]["conditions"] = [
                    _condition(
                        "PodScheduled",
                        "False",
                        now,
                        "SchedulingGated",
                        "Scheduling is blocked due to non-empty scheduling gates",
                    )
                ]
            elif spec.get("nodeName"):
                # Created already bound (a static or DaemonSet-style pod): the scheduler is bypassed.
                obj["status"]["conditions"] = [_condition("PodScheduled", "True", now)]
        case "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            meta(obj).setdefault("labels", {})["kubernetes.io/metadata.name"] = meta(obj)["name"]
        case "batch/jobs":
            _prepare_job(obj)
        case "apps/deployments":
            assert isinstance(spec, dict)
            spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault(
                "strategy",
                {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
            )
            _default_selector(obj)
            obj["status"] = {}
        case "apps/replicasets":
            assert isinstance(spec, dict)
            spec.setdefault("replicas", 1)
            _default_selector(obj)
            obj["status"] = {"replicas": 0}
        case "apps/statefulsets":
            assert isinstance(spec, dict)
            spec.setdefault("replicas", 1)
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("serviceName", "")
            _default_selector(obj)
            obj["status"] = {"replicas": 0, "availableReplicas": 0}
        case "apps/daemonsets":
            _default_selector(obj)
            obj["status"] = {
                "currentNumberScheduled": 0,
                "desiredNumberScheduled": 0,
                "numberMisscheduled": 0,
                "numberReady": 0,
            }
        case "scheduling.k8s.io/priorityclasses":
            obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
            obj.setdefault("globalDefault", False)
        case "apiextensions.k8s.io/customresourcedefinitions":
            names = obj["spec"]["names"]
            accepted = dict(names)
            accepted.setdefault("singular", names["kind"].lower())
            accepted.setdefault("listKind", f"{names['kind']}List")
            names.setdefault("singular", accepted["singular"])
            names.setdefault("listKind", accepted["listKind"])
            ts = rfc3339(now)
            obj["status"] = {
                "acceptedNames": accepted,
                "storedVersions": [v["name"] for v in obj["spec"]["versions"] if v.get("storage")],
                "conditions": [
                    {
                        "type": "NamesAccepted",
                        "status": "True",
                        "reason": "NoConflicts",
                        "message": "no conflicts found",
                        "lastTransitionTime": ts,
                    },
                    {
                        "type": "Established",
                        "status": "True",
                        "reason": "InitialNamesAccepted",
                        "message": "the initial names have been accepted",
                        "lastTransitionTime": ts,
                    },
                ],
            }
        case _:
            if rt.crd and rt.has_status:
                obj.pop("status", None)


def default_pod_spec(spec: Obj) -> None:
    """The defaults the API server fills into every pod spec it decodes (create and update), in place."""
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if not isinstance(c, dict):
            continue
        image = str(c.get("image", ""))
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        resources = c.setdefault("resources", {})
        limits = resources.get("limits") or {}
        if limits:
            # A limit without a request is also the request (the API server's defaulting).
            resources["requests"] = {**limits, **(resources.get("requests") or {})}


def _condition(type_: str, status: str, now: float, reason: str = "", message: str = "") -> Obj:
    out: Obj = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": rfc3339(now)}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def _default_selector(obj: Obj) -> None:
    spec = obj["spec"]
    if not spec.get("selector"):
        labels = (spec.get("template", {}).get("metadata") or {}).get("labels") or {}
        if not labels:
            raise invalid(obj["kind"], meta(obj).get("name", ""), "spec.selector", "Required value")
        spec["selector"] = {"matchLabels": dict(labels)}


def _prepare_job(obj: Obj) -> None:
    spec = obj["spec"]
    uid = meta(obj)["uid"]
    name = meta(obj)["name"]
    if spec.get("parallelism") is None and spec.get("completions") is None:
        spec["completions"] = 1
    if spec.get("parallelism") is None:
        spec["parallelism"] = 1
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template = spec["template"]
    template_meta = template.setdefault("metadata", {})
    labels = template_meta.setdefault("labels", {})
    for key in JOB_CONTROLLER_UID_LABELS:
        labels[key] = uid
    for key in JOB_NAME_LABELS:
        labels[key] = name
    if not spec.get("manualSelector") or not spec.get("selector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    obj["status"] = {}


def _qos_class(spec: Obj) -> str:
    containers = [c for c in spec.get("containers", []) if isinstance(c, dict)]
    requests_any = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req = {k: v for k, v in (res.get("requests") or {}).items() if k in ("cpu", "memory")}
        lim = {k: v for k, v in (res.get("limits") or {}).items() if k in ("cpu", "memory")}
        if req or lim:
            requests_any = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and req[r] != lim[r]):
                guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# Pod spec fields an update may change (the real server allows a few more; none matter here).
_POD_MUTABLE = {"activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds"}


def check_pod_update(old: Obj, new: Obj) -> None:
    """422 Invalid when an update changes a pod's spec beyond images, tolerations and scheduling gates."""
    old_spec = dict(old.get("spec") or {})
    new_spec = dict(new.get("spec") or {})
    # Admission-computed fields a client may leave out of a full update.
    for field in ("priority", "priorityClassName", "preemptionPolicy"):
        if field not in new_spec and field in old_spec:
            new["spec"][field] = old_spec[field]
            new_spec[field] = old_spec[field]
    for field in _POD_MUTABLE:
        old_spec.pop(field, None)
        new_spec.pop(field, None)
    for spec in (old_spec, new_spec):
        for key in ("containers", "initContainers"):
            if isinstance(spec.get(key), list):
                spec[key] = [
                    {k: v for k, v in c.items() if k != "image"} for c in spec[key] if isinstance(c, dict)
                ]
    if old_spec != new_spec:
        name = meta(new).get("name", "")
        changed = sorted(k for k in set(old_spec) | set(new_spec) if old_spec.get(k) != new_spec.get(k))
        raise invalid(
            "Pod",
            name,
            "spec",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
            "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only "
            "additions to existing tolerations), `spec.terminationGracePeriodSeconds` "
            f"(changed: {', '.join('spec.' + c for c in changed)})",
        )
    old_gates = (old.get("spec") or {}).get("schedulingGates") or []
    new_gates = (new.get("spec") or {}).get("schedulingGates") or []
    if any(g not in old_gates for g in new_gates):
        raise invalid(
            "Pod", meta(new).get("name", ""), "spec.schedulingGates", "Forbidden: only deletion is allowed"
        )


# --- events.k8s.io/v1 <-> core/v1 ---------------------------------------------------------------------
_V1_FROM_CORE = (
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("action", "action"),
    ("reason", "reason"),
    ("regarding", "involvedObject"),
    ("related", "related"),
    ("note", "message"),
    ("type", "type"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)


def to_events_v1(core: Obj) -> Obj:
    out: Obj = {"kind": "Event", "apiVersion": "events.k8s.io/v1", "metadata": core.get("metadata", {})}
    for v1_field, core_field in _V1_FROM_CORE:
        value = core.get(core_field)
        if value not in (None, "", {}):
            out[v1_field] = value
    if isinstance(out.get("series"), dict) and "lastObservedTime" in out["series"]:
        out["series"] = {
            "count": out["series"].get("count", 0),
            "lastObservedTime": out["series"]["lastObservedTime"],
        }
    return out


def from_events_v1(v1: Obj) -> Obj:
    if v1.get("apiVersion") not in (None, "events.k8s.io/v1"):
        raise bad_request(f"expected apiVersion events.k8s.io/v1, got {v1.get('apiVersion')!r}")
    out: Obj = {"kind": "Event", "apiVersion": "v1", "metadata": v1.get("metadata", {})}
    for v1_field, core_field in _V1_FROM_CORE:
        value = v1.get(v1_field)
        if value is not None:
            out[core_field] = clone(value)
    out.setdefault("involvedObject", {})
    return out


def require_dict(body: Any, what: str = "the request body") -> Obj:
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", f"{what} must be a JSON object")
    return body
