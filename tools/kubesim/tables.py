"""Server-side printing: meta.k8s.io/v1 Tables, which `kubectl get` asks for (`Accept: ...;as=Table`).

`table(rt, objects, now=..., include=...)` renders a list (or one object, or one watch event's object) with
the columns `kubectl get` shows for the kind: pods (NAME, READY, STATUS, RESTARTS, AGE; wide: IP, NODE,
NOMINATED NODE, READINESS GATES), nodes, jobs, deployments, replicasets, statefulsets, events,
namespaces, priority classes, CRDs, and for custom resources their `additionalPrinterColumns`
(JSONPath subset: dotted paths with `[n]` indexes). Other kinds get NAME and AGE. Each row carries the
object as `includeObject` asks (Object, Metadata (the default) or None). Called by the HTTP shell
(`tools.kubesim.server`). Pure: no I/O; `now` is an argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from tools.kubesim.objects import labels_of, meta, parse_time
from tools.kubesim.resources import PrinterColumn, ResourceType

__all__ = ["human_duration", "jsonpath_value", "table"]

Obj = dict[str, Any]
Column = tuple[str, str, int, str]
"""(name, type, priority, description)"""
Cells = Callable[[Obj, float], list[Any]]

_NONE = "<none>"


def human_duration(seconds: float) -> str:
    """An age as kubectl prints it: 45s, 3m12s, 17m, 5h3m, 9h, 3d4h, 12d, 2y40d."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = (s % 3600) // 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    days = hours // 24
    if days < 365 * 2:
        return f"{days}d"
    years, rest = divmod(days, 365)
    if years < 8:
        return f"{years}y{rest}d" if rest else f"{years}y"
    return f"{years}y"


def _age(obj: Obj, now: float) -> str:
    created = parse_time(meta(obj).get("creationTimestamp"))
    return _NONE if created is None else human_duration(now - created)


def _since(value: Any, now: float) -> str:
    at = parse_time(value)
    return _NONE if at is None else human_duration(now - at)


def _name(obj: Obj) -> str:
    return str(meta(obj).get("name", ""))


def _containers(obj: Obj) -> tuple[str, str]:
    template = (obj.get("spec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    names = ",".join(str(c.get("name", "")) for c in containers if isinstance(c, dict))
    images = ",".join(str(c.get("image", "")) for c in containers if isinstance(c, dict))
    return names or _NONE, images or _NONE


def _selector(obj: Obj) -> str:
    sel = (obj.get("spec") or {}).get("selector") or {}
    parts = [f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or ():
        op = {"In": "in", "NotIn": "notin"}.get(e.get("operator", ""))
        if op:
            parts.append(f"{e.get('key')} {op} ({','.join(e.get('values') or ())})")
        elif e.get("operator") == "Exists":
            parts.append(str(e.get("key")))
        elif e.get("operator") == "DoesNotExist":
            parts.append(f"!{e.get('key')}")
    return ",".join(parts) or _NONE


# --- per-kind columns -----------------------------------------------------------------------------------
def _pod_status(pod: Obj) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason"):
            reason = state["terminated"]["reason"]
    if meta(pod).get("deletionTimestamp"):
        reason = "Terminating"
    elif status.get("phase") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
        for c in status.get("conditions") or ()
    ):
        reason = "SchedulingGated"
    return str(reason)


def _pod_cells(pod: Obj, now: float) -> list[Any]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount", 0)) for cs in statuses)
    gates = spec.get("readinessGates") or []
    gate_cell = _NONE
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
        passed = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        gate_cell = f"{passed}/{len(gates)}"
    return [
        _name(pod),
        f"{ready}/{len(spec.get('containers') or [])}",
        _pod_status(pod),
        restarts,
        _age(pod, now),
        status.get("podIP") or _NONE,
        spec.get("nodeName") or _NONE,
        status.get("nominatedNodeName") or _NONE,
        gate_cell,
    ]


_POD_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the pod"),
    ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
    ("Status", "string", 0, "The aggregate status of the containers in this pod."),
    ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted."),
    ("Age", "string", 0, "CreationTimestamp of the pod"),
    ("IP", "string", 1, "IP address allocated to the pod."),
    ("Node", "string", 1, "Name of the node the pod is assigned to."),
    (
        "Nominated Node",
        "string",
        1,
        "Name of the node where the pod would be scheduled if preemption succeeded.",
    ),
    ("Readiness Gates", "string", 1, "Readiness gates of the pod."),
]


def _node_cells(node: Obj, now: float) -> list[Any]:
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        k.split("/", 1)[1]
        for k in labels_of(node)
        if k.startswith("node-role.kubernetes.io/") and k.split("/", 1)[1]
    )
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or ()}
    return [
        _name(node),
        state,
        ",".join(roles) or _NONE,
        _age(node, now),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or _NONE,
        addresses.get("ExternalIP") or _NONE,
        info.get("osImage") or _NONE,
        info.get("kernelVersion") or _NONE,
        info.get("containerRuntimeVersion") or _NONE,
    ]


_NODE_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the node"),
    ("Status", "string", 0, "The status of the node"),
    ("Roles", "string", 0, "The roles of the node"),
    ("Age", "string", 0, "CreationTimestamp of the node"),
    ("Version", "string", 0, "Kubelet Version reported by the node."),
    ("Internal-IP", "string", 1, "List of internal IPs that are assigned to the node."),
    ("External-IP", "string", 1, "List of external IPs that are assigned to the node."),
    ("OS-Image", "string", 1, "OS image reported by the node."),
    ("Kernel-Version", "string", 1, "Kernel version reported by the node."),
    ("Container-Runtime", "string", 1, "Container runtime version reported by the node."),
]


def _job_cells(job: Obj, now: float) -> list[Any]:
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    if conditions.get("Complete") == "True":
        state = "Complete"
    elif conditions.get("Failed") == "True":
        state = "Failed"
    elif spec.get("suspend"):
        state = "Suspended"
    else:
        state = "Running"
    completions = spec.get("completions")
    done = (
        f"{status.get('succeeded', 0)}/{completions}"
        if completions is not None
        else f"{status.get('succeeded', 0)}/1 of {spec.get('parallelism', 1)}"
    )
    start = parse_time(status.get("startTime"))
    end = parse_time(status.get("completionTime"))
    duration = "" if start is None else human_duration((end if end is not None else now) - start)
    names, images = _containers(job)
    return [_name(job), state, done, duration, _age(job, now), names, images, _selector(job)]


_JOB_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the job"),
    ("Status", "string", 0, "Status of the job"),
    ("Completions", "string", 0, "The completion status of the job"),
    ("Duration", "string", 0, "Time required to complete the job"),
    ("Age", "string", 0, "CreationTimestamp of the job"),
    ("Containers", "string", 1, "Names of each container in the template"),
    ("Images", "string", 1, "Images referenced by each container in the template"),
    ("Selector", "string", 1, "Label selector of the job"),
]


def _deployment_cells(d: Obj, now: float) -> list[Any]:
    status = d.get("status") or {}
    names, images = _containers(d)
    return [
        _name(d),
        f"{status.get('readyReplicas', 0)}/{(d.get('spec') or {}).get('replicas', 0)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        _age(d, now),
        names,
        images,
        _selector(d),
    ]


_DEPLOYMENT_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the deployment"),
    ("Ready", "string", 0, "Number of ready replicas over desired replicas"),
    ("Up-to-date", "integer", 0, "Total number of updated replicas"),
    ("Available", "integer", 0, "Total number of available replicas"),
    ("Age", "string", 0, "CreationTimestamp of the deployment"),
    ("Containers", "string", 1, "Names of each container in the template"),
    ("Images", "string", 1, "Images referenced by each container in the template"),
    ("Selector", "string", 1, "Label selector of the deployment"),
]


def _replicaset_cells(rs: Obj, now: float) -> list[Any]:
    status = rs.get("status") or {}
    names, images = _containers(rs)
    return [
        _name(rs),
        (rs.get("spec") or {}).get("replicas", 0),
        status.get("replicas", 0),
        status.get("readyReplicas", 0),
        _age(rs, now),
        names,
        images,
        _selector(rs),
    ]


_REPLICASET_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the replica set"),
    ("Desired", "integer", 0, "Number of desired replicas"),
    ("Current", "integer", 0, "Number of actual replicas"),
    ("Ready", "integer", 0, "Number of ready replicas"),
    ("Age", "string", 0, "CreationTimestamp of the replica set"),
    ("Containers", "string", 1, "Names of each container in the template"),
    ("Images", "string", 1, "Images referenced by each container in the template"),
    ("Selector", "string", 1, "Label selector of the replica set"),
]


def _statefulset_cells(s: Obj, now: float) -> list[Any]:
    status = s.get("status") or {}
    names, images = _containers(s)
    return [
        _name(s),
        f"{status.get('readyReplicas', 0)}/{(s.get('spec') or {}).get('replicas', 0)}",
        _age(s, now),
        names,
        images,
    ]


_STATEFULSET_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the stateful set"),
    ("Ready", "string", 0, "Number of ready replicas over desired replicas"),
    ("Age", "string", 0, "CreationTimestamp of the stateful set"),
    ("Containers", "string", 1, "Names of each container in the template"),
    ("Images", "string", 1, "Images referenced by each container in the template"),
]


def _event_cells(e: Obj, now: float) -> list[Any]:
    involved = e.get("involvedObject") or {}
    last = e.get("lastTimestamp") or e.get("eventTime") or (e.get("series") or {}).get("lastObservedTime")
    first = e.get("firstTimestamp") or e.get("eventTime")
    source = e.get("source") or {}
    source_text = ", ".join(v for v in (source.get("component"), source.get("host")) if v) or e.get(
        "reportingComponent", ""
    )
    return [
        _since(last, now),
        e.get("type", ""),
        e.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        e.get("message", ""),
        involved.get("fieldPath", ""),
        source_text,
        _since(first, now),
        e.get("count", 1),
        _name(e),
    ]


_EVENT_COLUMNS: list[Column] = [
    ("Last Seen", "string", 0, "Time since the event was last seen"),
    ("Type", "string", 0, "Type of the event"),
    ("Reason", "string", 0, "Reason of the event"),
    ("Object", "string", 0, "The object the event is about"),
    ("Message", "string", 0, "Message of the event"),
    ("Subobject", "string", 1, "Field of the object"),
    ("Source", "string", 1, "Component reporting the event"),
    ("First Seen", "string", 1, "Time since the event was first seen"),
    ("Count", "integer", 1, "Number of times the event was seen"),
    ("Name", "string", 1, "Name of the event"),
]


def _namespace_cells(ns: Obj, now: float) -> list[Any]:
    return [_name(ns), (ns.get("status") or {}).get("phase", ""), _age(ns, now)]


_NAMESPACE_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the namespace"),
    ("Status", "string", 0, "The status of the namespace"),
    ("Age", "string", 0, "CreationTimestamp of the namespace"),
]


def _priorityclass_cells(pc: Obj, now: float) -> list[Any]:
    return [
        _name(pc),
        pc.get("value", 0),
        bool(pc.get("globalDefault", False)),
        _age(pc, now),
        pc.get("preemptionPolicy", ""),
    ]


_PRIORITYCLASS_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the priority class"),
    ("Value", "integer", 0, "Priority value"),
    ("Global-Default", "boolean", 0, "Whether the class is the default"),
    ("Age", "string", 0, "CreationTimestamp of the priority class"),
    ("PreemptionPolicy", "string", 1, "Preemption policy of the class"),
]


def _crd_cells(crd: Obj, now: float) -> list[Any]:
    del now  # the column is a date the client formats
    return [_name(crd), meta(crd).get("creationTimestamp", "")]


_CRD_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the custom resource definition"),
    ("Created At", "date", 0, "CreationTimestamp of the custom resource definition"),
]


def _lease_cells(lease: Obj, now: float) -> list[Any]:
    return [_name(lease), (lease.get("spec") or {}).get("holderIdentity") or _NONE, _age(lease, now)]


_LEASE_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the lease"),
    ("Holder", "string", 0, "Identity of the lease holder"),
    ("Age", "string", 0, "CreationTimestamp of the lease"),
]


def _configmap_cells(cm: Obj, now: float) -> list[Any]:
    return [_name(cm), len(cm.get("data") or {}) + len(cm.get("binaryData") or {}), _age(cm, now)]


_CONFIGMAP_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the config map"),
    ("Data", "integer", 0, "Number of data keys"),
    ("Age", "string", 0, "CreationTimestamp of the config map"),
]


def _secret_cells(s: Obj, now: float) -> list[Any]:
    return [_name(s), s.get("type", "Opaque"), len(s.get("data") or {}), _age(s, now)]


_SECRET_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the secret"),
    ("Type", "string", 0, "Type of the secret"),
    ("Data", "integer", 0, "Number of data keys"),
    ("Age", "string", 0, "CreationTimestamp of the secret"),
]


def _service_cells(s: Obj, now: float) -> list[Any]:
    spec = s.get("spec") or {}
    ports = ",".join(
        f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or () if isinstance(p, dict)
    )
    return [
        _name(s),
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP") or _NONE,
        _NONE,
        ports or _NONE,
        _age(s, now),
    ]


_SERVICE_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name of the service"),
    ("Type", "string", 0, "Type of the service"),
    ("Cluster-IP", "string", 0, "Cluster IP of the service"),
    ("External-IP", "string", 0, "External IPs of the service"),
    ("Port(s)", "string", 0, "Ports of the service"),
    ("Age", "string", 0, "CreationTimestamp of the service"),
]


def _webhook_configuration_cells(c: Obj, now: float) -> list[Any]:
    return [_name(c), len(c.get("webhooks") or ()), _age(c, now)]


_WEBHOOK_CONFIGURATION_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name must be unique within a namespace."),
    ("Webhooks", "integer", 0, "Webhooks is a list of webhooks and the affected resources and operations."),
    ("Age", "string", 0, "CreationTimestamp of the object"),
]


def _default_cells(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), _age(obj, now)]


_DEFAULT_COLUMNS: list[Column] = [
    ("Name", "string", 0, "Name must be unique within a namespace."),
    ("Age", "string", 0, "CreationTimestamp of the object"),
]

_BY_STORAGE: dict[str, tuple[list[Column], Cells]] = {
    "pods": (_POD_COLUMNS, _pod_cells),
    "admissionregistration.k8s.io/mutatingwebhookconfigurations": (
        _WEBHOOK_CONFIGURATION_COLUMNS,
        _webhook_configuration_cells,
    ),
    "admissionregistration.k8s.io/validatingwebhookconfigurations": (
        _WEBHOOK_CONFIGURATION_COLUMNS,
        _webhook_configuration_cells,
    ),
    "nodes": (_NODE_COLUMNS, _node_cells),
    "batch/jobs": (_JOB_COLUMNS, _job_cells),
    "apps/deployments": (_DEPLOYMENT_COLUMNS, _deployment_cells),
    "apps/replicasets": (_REPLICASET_COLUMNS, _replicaset_cells),
    "apps/statefulsets": (_STATEFULSET_COLUMNS, _statefulset_cells),
    "events": (_EVENT_COLUMNS, _event_cells),
    "namespaces": (_NAMESPACE_COLUMNS, _namespace_cells),
    "scheduling.k8s.io/priorityclasses": (_PRIORITYCLASS_COLUMNS, _priorityclass_cells),
    "apiextensions.k8s.io/customresourcedefinitions": (_CRD_COLUMNS, _crd_cells),
    "coordination.k8s.io/leases": (_LEASE_COLUMNS, _lease_cells),
    "configmaps": (_CONFIGMAP_COLUMNS, _configmap_cells),
    "secrets": (_SECRET_COLUMNS, _secret_cells),
    "services": (_SERVICE_COLUMNS, _service_cells),
}


# --- CRD printer columns ---------------------------------------------------------------------------------
_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def jsonpath_value(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (`.spec.queue`, `.status.conditions[0].type`), None when absent."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    value = obj
    for m in _PATH_PART.finditer(text.lstrip(".")):
        key, index = m.group(1), m.group(2)
        if key is not None:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        else:
            if not isinstance(value, list) or int(index) >= len(value):
                return None
            value = value[int(index)]
        if value is None:
            return None
    return value


def _crd_column_cell(column: PrinterColumn, obj: Obj, now: float) -> Any:
    value = jsonpath_value(obj, column.json_path)
    if value is None:
        return None
    if column.type == "date":
        at = parse_time(value)
        return human_duration(now - at) if at is not None else str(value)
    if column.type == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if column.type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if column.type == "boolean" and isinstance(value, bool):
        return value
    if isinstance(value, dict | list):
        import msgspec

        return msgspec.json.encode(value).decode()
    return str(value)


def _custom(rt: ResourceType) -> tuple[list[Column], Cells]:
    declared = list(rt.printer_columns)
    columns: list[Column] = [("Name", "string", 0, "Name must be unique within a namespace.")]
    columns += [
        (c.name, "string" if c.type == "date" else c.type, c.priority, c.description) for c in declared
    ]
    add_age = not any(c.name.lower() == "age" for c in declared)
    if add_age:
        columns.append(("Age", "string", 0, "CreationTimestamp of the object"))

    def cells(obj: Obj, now: float) -> list[Any]:
        row: list[Any] = [_name(obj)] + [_crd_column_cell(c, obj, now) for c in declared]
        if add_age:
            row.append(_age(obj, now))
        return row

    return columns, cells


def _partial_metadata(obj: Obj) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta(obj)}


def table(
    rt: ResourceType,
    objects: Iterable[Obj],
    *,
    now: float,
    include: str = "Metadata",
    resource_version: str = "",
    continue_token: str = "",
    with_columns: bool = True,
) -> Obj:
    """A meta.k8s.io/v1 Table of `objects` of type `rt` (`include`: Object, Metadata or None)."""
    if rt.crd:
        columns, cells = _custom(rt)
    else:
        columns, cells = _BY_STORAGE.get(rt.storage, (_DEFAULT_COLUMNS, _default_cells))
    rows: list[Obj] = []
    for obj in objects:
        row: Obj = {"cells": cells(obj, now)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = _partial_metadata(obj)
        rows.append(row)
    metadata: Obj = {}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    if continue_token:
        metadata["continue"] = continue_token
    out: Obj = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}
    if with_columns:
        out["columnDefinitions"] = [
            {
                "name": name,
                "type": type_,
                "format": "name" if i == 0 else "",
                "description": desc,
                "priority": prio,
            }
            for i, (name, type_, prio, desc) in enumerate(columns)
        ]
    out["rows"] = rows
    return out
