"""Just enough of Kubernetes' protobuf encoding to read what `kubectl create <kind>` sends.

kubectl's typed generators (`kubectl create namespace|configmap|secret|serviceaccount|priorityclass|
deployment|job|cronjob|service|poddisruptionbudget|quota|role|rolebinding|clusterrole|clusterrolebinding`)
POST their object as `application/vnd.kubernetes.protobuf`: the magic bytes `k8s\\0`, then a
runtime.Unknown message (type meta, raw object bytes). `kubectl auth can-i` and `kubectl auth whoami` send their
reviews so too. `decode_object(body)` turns such a body into the JSON-like object the rest of the server handles, using field tables for those kinds only (the field
numbers are those of the Kubernetes API's protobuf definitions). Empty singular values are dropped, as
JSON's `omitempty` would; a field the tables do not know that carries a value is refused with 415, so
nothing is lost silently. Called by the HTTP shell (`tools.kubesim.server`). Pure: no I/O.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from tools.kubesim.errors import ApiError

__all__ = ["MAGIC", "decode_object"]

Obj = dict[str, Any]
MAGIC = b"k8s\x00"

# Field kinds: str, bytes (base64 in JSON), int, bool, map (string values), mapbytes, mapquantity, quantity,
# time, intorstr, or a message name. A trailing "*" marks a repeated field; "!" keeps a zero value.
_MESSAGES: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {
        1: ("typeMeta", "TypeMeta"),
        2: ("raw", "bytes"),
        3: ("contentEncoding", "str"),
        4: ("contentType", "str"),
    },
    "TypeMeta": {1: ("apiVersion", "str"), 2: ("kind", "str")},
    "ObjectMeta": {
        1: ("name", "str"),
        2: ("generateName", "str"),
        3: ("namespace", "str"),
        5: ("uid", "str"),
        6: ("resourceVersion", "str"),
        7: ("generation", "int"),
        8: ("creationTimestamp", "time"),
        11: ("labels", "map"),
        12: ("annotations", "map"),
        14: ("finalizers", "str*"),
    },
    "LabelSelector": {1: ("matchLabels", "map"), 2: ("matchExpressions", "LabelSelectorRequirement*")},
    "LabelSelectorRequirement": {1: ("key", "str"), 2: ("operator", "str"), 3: ("values", "str*")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "str*")},
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map"),
        3: ("binaryData", "mapbytes"),
        4: ("immutable", "bool"),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "mapbytes"),
        3: ("type", "str"),
        4: ("stringData", "map"),
        5: ("immutable", "bool"),
    },
    "ServiceAccount": {1: ("metadata", "ObjectMeta")},
    "PriorityClass": {
        1: ("metadata", "ObjectMeta"),
        2: ("value", "int!"),
        3: ("globalDefault", "bool"),
        4: ("description", "str"),
        5: ("preemptionPolicy", "str"),
    },
    "Deployment": {1: ("metadata", "ObjectMeta"), 2: ("spec", "DeploymentSpec")},
    "DeploymentSpec": {
        1: ("replicas", "int!"),
        2: ("selector", "LabelSelector"),
        3: ("template", "PodTemplateSpec"),
        4: ("strategy", "DeploymentStrategy"),
        5: ("minReadySeconds", "int"),
        6: ("revisionHistoryLimit", "int!"),
        7: ("paused", "bool"),
        9: ("progressDeadlineSeconds", "int!"),
    },
    "DeploymentStrategy": {1: ("type", "str")},
    "Job": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec")},
    "JobSpec": {
        1: ("parallelism", "int!"),
        2: ("completions", "int!"),
        3: ("activeDeadlineSeconds", "int!"),
        4: ("selector", "LabelSelector"),
        5: ("manualSelector", "bool"),
        6: ("template", "PodTemplateSpec"),
        7: ("backoffLimit", "int!"),
        8: ("ttlSecondsAfterFinished", "int!"),
        9: ("completionMode", "str"),
        10: ("suspend", "bool"),
    },
    "CronJob": {1: ("metadata", "ObjectMeta"), 2: ("spec", "CronJobSpec")},
    "CronJobSpec": {
        1: ("schedule", "str"),
        2: ("startingDeadlineSeconds", "int!"),
        3: ("concurrencyPolicy", "str"),
        4: ("suspend", "bool"),
        5: ("jobTemplate", "JobTemplateSpec"),
        6: ("successfulJobsHistoryLimit", "int!"),
        7: ("failedJobsHistoryLimit", "int!"),
        8: ("timeZone", "str"),
    },
    "JobTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec")},
    "PodSpec": {
        2: ("containers", "Container*"),
        3: ("restartPolicy", "str"),
        4: ("terminationGracePeriodSeconds", "int!"),
        5: ("activeDeadlineSeconds", "int!"),
        6: ("dnsPolicy", "str"),
        7: ("nodeSelector", "map"),
        8: ("serviceAccountName", "str"),
        9: ("serviceAccount", "str"),
        10: ("nodeName", "str"),
        11: ("hostNetwork", "bool"),
        12: ("hostPID", "bool"),
        13: ("hostIPC", "bool"),
        16: ("hostname", "str"),
        17: ("subdomain", "str"),
        19: ("schedulerName", "str"),
        20: ("initContainers", "Container*"),
        24: ("priorityClassName", "str"),
        25: ("priority", "int!"),
    },
    "Container": {
        1: ("name", "str"),
        2: ("image", "str"),
        3: ("command", "str*"),
        4: ("args", "str*"),
        5: ("workingDir", "str"),
        6: ("ports", "ContainerPort*"),
        7: ("env", "EnvVar*"),
        8: ("resources", "ResourceRequirements"),
        13: ("terminationMessagePath", "str"),
        14: ("imagePullPolicy", "str"),
        16: ("stdin", "bool"),
        17: ("stdinOnce", "bool"),
        18: ("tty", "bool"),
        20: ("terminationMessagePolicy", "str"),
    },
    "ContainerPort": {
        1: ("name", "str"),
        2: ("hostPort", "int"),
        3: ("containerPort", "int!"),
        4: ("protocol", "str"),
        5: ("hostIP", "str"),
    },
    "EnvVar": {1: ("name", "str"), 2: ("value", "str")},
    "ResourceRequirements": {1: ("limits", "mapquantity"), 2: ("requests", "mapquantity")},
    "Service": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ServiceSpec")},
    "ServiceSpec": {
        1: ("ports", "ServicePort*"),
        2: ("selector", "map"),
        3: ("clusterIP", "str"),
        4: ("type", "str"),
        5: ("externalIPs", "str*"),
        7: ("loadBalancerIP", "str"),
        10: ("externalName", "str"),
        11: ("externalTrafficPolicy", "str"),
        18: ("clusterIPs", "str*"),
    },
    "ServicePort": {
        1: ("name", "str"),
        2: ("protocol", "str"),
        3: ("port", "int!"),
        4: ("targetPort", "intorstr"),
        5: ("nodePort", "int"),
    },
    "PodDisruptionBudget": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodDisruptionBudgetSpec")},
    "PodDisruptionBudgetSpec": {
        1: ("minAvailable", "intorstr"),
        2: ("selector", "LabelSelector"),
        3: ("maxUnavailable", "intorstr"),
        4: ("unhealthyPodEvictionPolicy", "str"),
    },
    "ResourceQuota": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ResourceQuotaSpec")},
    "ResourceQuotaSpec": {1: ("hard", "mapquantity"), 2: ("scopes", "str*")},
    "PolicyRule": {
        1: ("verbs", "str*"),
        2: ("apiGroups", "str*"),
        3: ("resources", "str*"),
        4: ("resourceNames", "str*"),
        5: ("nonResourceURLs", "str*"),
    },
    "Subject": {1: ("kind", "str"), 2: ("apiGroup", "str"), 3: ("name", "str"), 4: ("namespace", "str")},
    "RoleRef": {1: ("apiGroup", "str"), 2: ("kind", "str"), 3: ("name", "str")},
    "Role": {1: ("metadata", "ObjectMeta"), 2: ("rules", "PolicyRule*")},
    "ClusterRole": {1: ("metadata", "ObjectMeta"), 2: ("rules", "PolicyRule*")},
    "RoleBinding": {1: ("metadata", "ObjectMeta"), 2: ("subjects", "Subject*"), 3: ("roleRef", "RoleRef")},
    "ClusterRoleBinding": {
        1: ("metadata", "ObjectMeta"),
        2: ("subjects", "Subject*"),
        3: ("roleRef", "RoleRef"),
    },
}
_KINDS = {
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
    ("v1", "Service"),
    ("v1", "ResourceQuota"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
}

_REVIEWS = {
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
    ("authentication.k8s.io/v1", "SelfSubjectReview"),
}


def _unsupported(problem: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the simulated API server reads protobuf only for kubectl's create generators ({problem}); "
        "send JSON (kubectl apply/create -f)",
    )


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if i >= len(data):
            raise _unsupported("truncated varint")
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """The (field number, wire type, value) triples of one message."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            length, i = _varint(data, i)
            value = data[i : i + length]
            i += length
        elif wire == 1:
            value = data[i : i + 8]
            i += 8
        elif wire == 5:
            value = data[i : i + 4]
            i += 4
        else:
            raise _unsupported(f"wire type {wire}")
        if i > len(data):
            raise _unsupported("truncated field")
        out.append((number, wire, value))
    return out


def _empty(data: bytes) -> bool:
    """Whether an unknown length-delimited field is an empty string or a message of empty values only."""
    if not data:
        return True
    try:
        fields = _fields(data)
    except ApiError:
        return False
    return all((w == 0 and not v) or (w == 2 and _empty(v)) for _, w, v in fields)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _map_entry(data: bytes, kind: str) -> tuple[str, Any]:
    key = ""
    value: Any = "" if kind != "mapquantity" else "0"
    for number, _, raw in _fields(data):
        if number == 1:
            key = raw.decode()
        elif number == 2:
            if kind == "map":
                value = raw.decode()
            elif kind == "mapbytes":
                value = base64.b64encode(raw).decode()
            else:
                value = _quantity(raw)
    return key, value


def _quantity(data: bytes) -> str:
    for number, _, raw in _fields(data):
        if number == 1:
            return str(raw.decode())
    return "0"


def _time(data: bytes) -> str | None:
    seconds = 0
    for number, _, raw in _fields(data):
        if number == 1:
            seconds = _signed(raw)
    if not seconds:
        return None
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(data: bytes) -> int | str:
    kind, int_value, str_value = 0, 0, ""
    for number, _, raw in _fields(data):
        if number == 1:
            kind = raw
        elif number == 2:
            int_value = _signed(raw)
        elif number == 3:
            str_value = raw.decode()
    return str_value if kind == 1 else int_value


def _scalar(kind: str, wire: int, raw: Any) -> Any:
    match kind:
        case "str":
            return raw.decode()
        case "bytes":
            return base64.b64encode(raw).decode()
        case "int":
            return _signed(raw) if wire == 0 else 0
        case "bool":
            return bool(raw)
        case "quantity":
            return _quantity(raw)
        case "time":
            return _time(raw)
        case "intorstr":
            return _int_or_string(raw)
    return _message(kind, raw)


def _message(name: str, data: bytes) -> Obj:
    schema = _MESSAGES[name]
    out: Obj = {}
    for number, wire, raw in _fields(data):
        entry = schema.get(number)
        if entry is None:
            if (wire == 0 and raw) or (wire == 2 and not _empty(raw)):
                raise _unsupported(f"field {number} of {name} is not understood")
            continue
        json_name, spec = entry
        repeated = spec.endswith("*")
        keep = spec.endswith("!")
        kind = spec.rstrip("*!")
        if kind in ("map", "mapbytes", "mapquantity"):
            key, value = _map_entry(raw, kind)
            out.setdefault(json_name, {})[key] = value
            continue
        value = _scalar(kind, wire, raw)
        if repeated:
            out.setdefault(json_name, []).append(value)
        elif keep or value not in ("", 0, False, None, {}):
            out[json_name] = value
    return out


def decode_object(body: bytes) -> Obj:
    """The JSON form of a protobuf-encoded object from one of kubectl's create generators; 415 otherwise."""
    if not body.startswith(MAGIC):
        raise _unsupported("the body does not start with the k8s protobuf magic")
    envelope = _message("Unknown", body[len(MAGIC) :])
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    if (api_version, kind) in _REVIEWS:
        # The answer does not depend on the question (everything is allowed), so it is not read.
        return {"apiVersion": api_version, "kind": kind}
    if (api_version, kind) not in _KINDS:
        raise _unsupported(f"{api_version} {kind} is not one of them")
    raw = base64.b64decode(envelope.get("raw", ""))
    return {"apiVersion": api_version, "kind": kind, **_message(kind, raw)}
