"""Label and field selectors as list and watch requests give them (`labelSelector`, `fieldSelector`).

`parse_labels("app=web,tier in (a,b),!legacy")` and `parse_fields("spec.nodeName=n1,status.phase!=Failed")`
return selector values whose `matches(obj)` the store's list and watch filters call
(`tools.kubesim.cluster`). Field selectors are checked against the fields each kind supports, as the
real server does (an unsupported field is a 400 BadRequest). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

from tools.kubesim.errors import bad_request

__all__ = [
    "EVERYTHING",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "field_value",
    "label_selector_of",
    "parse_fields",
    "parse_labels",
    "supported_fields",
]

Obj = dict[str, Any]

_KEY = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class Requirement(msgspec.Struct, frozen=True):
    """One label requirement: `op` is one of =, !=, in, notin, exists, !exists, gt, lt."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        match self.op:
            case "=" | "in":
                return value is not None and value in self.values
            case "!=" | "notin":
                return value is None or value not in self.values
            case "exists":
                return value is not None
            case "!exists":
                return value is None
            case "gt" | "lt":
                if value is None:
                    return False
                try:
                    have, bound = int(value), int(next(iter(self.values)))
                except ValueError:
                    return False
                return have > bound if self.op == "gt" else have < bound
        return False


class LabelSelector(msgspec.Struct, frozen=True):
    """Requirements that must all hold; empty selects everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, obj: Obj) -> bool:
        if not self.requirements:
            return True
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


EVERYTHING = LabelSelector()


def _split_top_level(text: str) -> list[str]:
    """`text` split at commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


_SET_OP = re.compile(r"^(?P<key>[^\s!=<>()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ_OP = re.compile(r"^(?P<key>[^\s!=<>()]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s!=<>()]*)$")


def _check_key(key: str, selector: str) -> None:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in selector {selector!r}")


def _check_value(value: str, selector: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise bad_request(
            f"unable to parse requirement: invalid label value {value!r} in selector {selector!r}"
        )


def parse_labels(text: str | None) -> LabelSelector:
    """A `labelSelector` query value; a malformed one is a 400 BadRequest naming it."""
    if not text:
        return EVERYTHING
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        if m := _SET_OP.match(part):
            key = m.group("key")
            values = frozenset(v.strip() for v in m.group("values").split(",") if v.strip())
            _check_key(key, text)
            for v in values:
                _check_value(v, text)
            reqs.append(Requirement(key, m.group("op"), values))
        elif m := _EQ_OP.match(part):
            key, op, value = m.group("key"), m.group("op"), m.group("value")
            _check_key(key, text)
            _check_value(value, text)
            name = {"==": "=", ">": "gt", "<": "lt"}.get(op, op)
            if name in {"gt", "lt"} and not re.fullmatch(r"-?\d+", value):
                raise bad_request(
                    f"unable to parse requirement: for {op!r}, value must be an integer in {text!r}"
                )
            reqs.append(Requirement(key, name, frozenset((value,))))
        elif part.startswith("!"):
            key = part[1:].strip()
            _check_key(key, text)
            reqs.append(Requirement(key, "!exists"))
        else:
            _check_key(part, text)
            reqs.append(Requirement(part, "exists"))
    return LabelSelector(tuple(reqs))


def label_selector_of(selector: Obj | None) -> LabelSelector:
    """A metav1.LabelSelector object (matchLabels, matchExpressions) as a `LabelSelector`.

    None selects nothing in Kubernetes' controllers, an empty object everything; callers decide about None.
    """
    reqs: list[Requirement] = [
        Requirement(str(k), "=", frozenset((str(v),)))
        for k, v in ((selector or {}).get("matchLabels") or {}).items()
    ]
    for expr in (selector or {}).get("matchExpressions") or ():
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}.get(
            expr.get("operator")
        )
        if op is None:
            raise bad_request(f"invalid label selector operator {expr.get('operator')!r}")
        reqs.append(
            Requirement(str(expr.get("key", "")), op, frozenset(str(v) for v in expr.get("values") or ()))
        )
    return LabelSelector(tuple(reqs))


# --- field selectors --------------------------------------------------------------------------------------
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (
        "spec.nodeName",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.restartPolicy",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "events": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "nodes": ("spec.unschedulable",),
    "namespaces": ("status.phase",),
    "secrets": ("type",),
    "jobs": ("status.successful",),
    "replicasets": ("status.replicas",),
}
# events.k8s.io/v1 names the same stored fields differently.
EVENTS_V1_FIELDS = {
    "regarding.kind": "involvedObject.kind",
    "regarding.namespace": "involvedObject.namespace",
    "regarding.name": "involvedObject.name",
    "regarding.uid": "involvedObject.uid",
    "regarding.apiVersion": "involvedObject.apiVersion",
    "regarding.resourceVersion": "involvedObject.resourceVersion",
    "regarding.fieldPath": "involvedObject.fieldPath",
    "reportingController": "reportingComponent",
}


def supported_fields(storage: str) -> tuple[str, ...]:
    return _COMMON_FIELDS + _FIELDS.get(storage, ())


def field_value(obj: Obj, path: str) -> str:
    """The value at the dotted `path` as a field selector compares it ("" when absent)."""
    if path == "source":
        source = obj.get("source") or {}
        return str(source.get("component", "")) if isinstance(source, dict) else ""
    if path == "status.successful":
        path = "status.succeeded"
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return ""
        value = value.get(part)
        if value is None:
            return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class FieldTerm(msgspec.Struct, frozen=True):
    field: str
    equal: bool
    value: str


class FieldSelector(msgspec.Struct, frozen=True):
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, obj: Obj) -> bool:
        return all((field_value(obj, term.field) == term.value) == term.equal for term in self.terms)

    def __bool__(self) -> bool:
        return bool(self.terms)

    def exact(self, field: str) -> str | None:
        """The value `field` must equal, when the selector pins it (an index can then serve the list)."""
        for term in self.terms:
            if term.field == field and term.equal:
                return term.value
        return None


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_fields(text: str | None, storage: str, rename: Callable[[str], str] | None = None) -> FieldSelector:
    """A `fieldSelector` query value for objects of `storage`; unsupported fields are a 400 BadRequest."""
    if not text:
        return FieldSelector()
    allowed = supported_fields(storage)
    terms: list[FieldTerm] = []
    for raw in _split_unescaped(text, ","):
        part = raw.strip()
        if not part:
            continue
        m = re.match(r"^(?P<field>[^=!]+?)\s*(?P<op>==|!=|=)(?P<value>.*)$", part)
        if m is None:
            raise bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        field = m.group("field").strip()
        if rename is not None:
            field = rename(field)
        if field not in allowed:
            raise bad_request(f'field label not supported: "{m.group("field").strip()}"')
        terms.append(FieldTerm(field, m.group("op") != "!=", _unescape(m.group("value"))))
    return FieldSelector(tuple(terms))
