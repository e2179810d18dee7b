"""Kubernetes DRA objects (resource.k8s.io/v1) -> the model's (`shared.model.dra`): the JSON Kairos reads of
DeviceClasses, ResourceSlices, ResourceClaims and ResourceClaimTemplates, and their translations,
validated.

Called by the state service's DRA mirror (`services.state.mirror.dra_mirror`) for every object its informers
see, and by `shared.kube.translate.pod_of` for a pod's ``spec.resourceClaims`` (`pod_claims_of`). A class,
claim or template that does not translate (a selector that does not compile, a request without a device
class, a claim or template without requests) is not dropped: it becomes the model object under its name
with its `problem` naming the object and the field, so a pod that uses it is held with those words
(`shared.core.dra`) and nothing else is affected. A slice that does not translate raises `InvalidObject`;
the mirror keeps it out (devices Kairos cannot read are devices no claim gets).

Selectors are compiled here (`shared.core.dra_cel.check`, cached by text), so a bad one is named by its
field; the core evaluates them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from shared.core import dra_cel
from shared.errors import InvalidObject
from shared.kube import selectors, values, wire
from shared.kube.keys import QUEUE_LABEL
from shared.kube.kinds import WireObject, WireStruct, decoder
from shared.kube.quantity import QuantityError, milli_value
from shared.model.dra import (
    ALL,
    EXACT_COUNT,
    Attribute,
    ClaimConstraint,
    Device,
    DeviceClass,
    DeviceRequest,
    DeviceResult,
    PodClaim,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    qualified,
)
from shared.model.objects import LabelSelectorTerm

__all__ = [
    "GROUP",
    "KINDS",
    "VERSION",
    "WireClaim",
    "WireClaimTemplate",
    "WireDeviceClass",
    "WireResourceSlice",
    "claim_of",
    "class_of",
    "decode",
    "pod_claims_of",
    "slice_of",
    "template_of",
]

GROUP = "resource.k8s.io"
VERSION = "v1"


# --- the wire ---------------------------------------------------------------------------------------------
class CelSelector(WireStruct, frozen=True, kw_only=True):
    expression: str = ""


class DeviceSelector(WireStruct, frozen=True, kw_only=True):
    cel: CelSelector | None = None


class WireAttribute(WireStruct, frozen=True, kw_only=True):
    int: Any = None
    bool: Any = None
    string: Any = None
    version: Any = None


class WireCapacity(WireStruct, frozen=True, kw_only=True):
    value: str | int | float = 0


class WireDevice(WireStruct, frozen=True, kw_only=True):
    name: str = ""
    attributes: dict[str, WireAttribute] = msgspec.field(default_factory=dict)
    capacity: dict[str, WireCapacity] = msgspec.field(default_factory=dict)


class SliceSpec(WireStruct, frozen=True, kw_only=True):
    driver: str = ""
    pool: dict[str, Any] = msgspec.field(default_factory=dict)
    node_name: str | None = None
    all_nodes: bool | None = None
    node_selector: wire.NodeSelector | None = None
    devices: list[WireDevice] = msgspec.field(default_factory=list)


class ClassSpec(WireStruct, frozen=True, kw_only=True):
    selectors: list[DeviceSelector] = msgspec.field(default_factory=list)
    extended_resource_name: str | None = None


class ExactRequest(WireStruct, frozen=True, kw_only=True):
    device_class_name: str = ""
    selectors: list[DeviceSelector] = msgspec.field(default_factory=list)
    allocation_mode: str = ""
    count: int | None = None
    admin_access: Any = None
    """Checked in `_request` (a value that is not a boolean is named by its field, not a failed decode)."""


class SubRequest(ExactRequest, frozen=True, kw_only=True):
    name: str = ""


class WireRequest(WireStruct, frozen=True, kw_only=True):
    name: str = ""
    exactly: ExactRequest | None = None
    first_available: list[SubRequest] = msgspec.field(default_factory=list)


class WireConstraint(WireStruct, frozen=True, kw_only=True):
    requests: list[str] = msgspec.field(default_factory=list)
    match_attribute: str | None = None


class DeviceClaim(WireStruct, frozen=True, kw_only=True):
    requests: list[WireRequest] = msgspec.field(default_factory=list)
    constraints: list[WireConstraint] = msgspec.field(default_factory=list)


class ClaimSpec(WireStruct, frozen=True, kw_only=True):
    devices: DeviceClaim = msgspec.field(default_factory=DeviceClaim)


class WireResult(WireStruct, frozen=True, kw_only=True):
    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    admin_access: bool | None = None


class DeviceAllocation(WireStruct, frozen=True, kw_only=True):
    results: list[WireResult] = msgspec.field(default_factory=list)


class Allocation(WireStruct, frozen=True, kw_only=True):
    devices: DeviceAllocation = msgspec.field(default_factory=DeviceAllocation)
    node_selector: wire.NodeSelector | None = None


class Consumer(WireStruct, frozen=True, kw_only=True):
    resource: str = ""
    name: str = ""
    uid: str = ""


class ClaimStatus(WireStruct, frozen=True, kw_only=True):
    allocation: Allocation | None = None
    reserved_for: list[Consumer] = msgspec.field(default_factory=list)


class WireDeviceClass(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "DeviceClass"
    spec: ClassSpec = msgspec.field(default_factory=ClassSpec)


class WireResourceSlice(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "ResourceSlice"
    spec: SliceSpec = msgspec.field(default_factory=SliceSpec)


class WireClaim(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "ResourceClaim"
    spec: ClaimSpec = msgspec.field(default_factory=ClaimSpec)
    status: ClaimStatus = msgspec.field(default_factory=ClaimStatus)


class TemplateSpec(WireStruct, frozen=True, kw_only=True):
    spec: ClaimSpec = msgspec.field(default_factory=ClaimSpec)


class WireClaimTemplate(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "ResourceClaimTemplate"
    spec: TemplateSpec = msgspec.field(default_factory=TemplateSpec)


WireDra = WireDeviceClass | WireResourceSlice | WireClaim | WireClaimTemplate
KINDS: dict[str, type[WireDra]] = {
    "deviceclasses": WireDeviceClass,
    "resourceslices": WireResourceSlice,
    "resourceclaims": WireClaim,
    "resourceclaimtemplates": WireClaimTemplate,
}
"""Resource name -> the wire type of its objects."""
decode: Callable[[str, bytes | str], WireDra] = decoder(KINDS)
"""One object of `resource` (a key of `KINDS`) from its JSON; InvalidObject names the kind and the object."""


# --- pods -------------------------------------------------------------------------------------------------
def pod_claims_of(pod: wire.Pod) -> tuple[PodClaim, ...]:
    """A pod's ``spec.resourceClaims``, each with the claim it uses (a template's: the one named in
    ``status.resourceClaimStatuses``, "" until the resourceclaim controller made it)."""
    if not pod.spec.resource_claims:
        return ()
    made = {s.name: s.resource_claim_name or "" for s in pod.status.resource_claim_statuses}
    out: list[PodClaim] = []
    for entry in pod.spec.resource_claims:
        if entry.resource_claim_name:
            out.append(PodClaim(name=entry.name, claim=entry.resource_claim_name))
        elif entry.resource_claim_template_name:
            template = entry.resource_claim_template_name
            out.append(PodClaim(name=entry.name, claim=made.get(entry.name, ""), template=template))
    return tuple(out)


# --- translation ------------------------------------------------------------------------------------------
def _selectors(where: tuple[str, str], at: str, given: list[DeviceSelector]) -> tuple[str, ...]:
    out: list[str] = []
    for i, selector in enumerate(given):
        field = f"{at}[{i}].cel.expression"
        if selector.cel is None:
            raise InvalidObject(*where, f"{at}[{i}].cel", "required (the only kind of selector)")
        try:
            dra_cel.check(selector.cel.expression)
        except dra_cel.CelError as exc:
            raise InvalidObject(*where, field, str(exc)) from None
        out.append(selector.cel.expression)
    return tuple(out)


def class_of(raw: WireDeviceClass) -> DeviceClass:
    """The model class; one whose selectors do not compile keeps its name and carries the problem."""
    base = DeviceClass(name=raw.metadata.name)
    where = (raw.KIND, raw.label)
    try:
        return msgspec.structs.replace(
            base,
            selectors=_selectors(where, "spec.selectors", raw.spec.selectors),
            extended_resource_name=raw.spec.extended_resource_name or "",
        )
    except InvalidObject as exc:
        return msgspec.structs.replace(base, problem=str(exc))


def _request(
    where: tuple[str, str], at: str, name: str, exact: ExactRequest, *, exactly: bool = True
) -> DeviceRequest:
    """One request (`exactly`: an ``exactly`` one, the only kind that may ask for admin access; a
    subrequest's ``adminAccess`` is not a field of the API and is ignored)."""
    admin = exact.admin_access if exactly else None
    if admin is not None and not isinstance(admin, bool):
        raise InvalidObject(*where, f"{at}.adminAccess", f"must be a boolean, got {values.shown(admin)}")
    if not exact.device_class_name:
        raise InvalidObject(*where, f"{at}.deviceClassName", "required")
    mode = exact.allocation_mode or EXACT_COUNT
    if mode not in (EXACT_COUNT, ALL):
        raise InvalidObject(*where, f"{at}.allocationMode", f"must be ExactCount or All, got {mode!r}")
    count = 1 if exact.count is None else exact.count
    if mode == EXACT_COUNT and count < 1:
        raise InvalidObject(*where, f"{at}.count", f"must be at least 1, got {count}")
    return DeviceRequest(
        name=name,
        device_class=exact.device_class_name,
        selectors=_selectors(where, f"{at}.selectors", exact.selectors),
        mode=mode,
        count=count if mode == EXACT_COUNT else 0,
        admin_access=bool(admin),
    )


def _devices_claim(
    where: tuple[str, str], at: str, spec: DeviceClaim
) -> tuple[tuple[DeviceRequest, ...], tuple[ClaimConstraint, ...]]:
    if not spec.requests:
        raise InvalidObject(*where, f"{at}.requests", "must have at least one request")
    requests: list[DeviceRequest] = []
    names: set[str] = set()
    for i, request in enumerate(spec.requests):
        here = f"{at}.requests[{i}]"
        if not request.name:
            raise InvalidObject(*where, f"{here}.name", "required")
        if request.name in names:
            raise InvalidObject(*where, f"{here}.name", f"duplicate request name {request.name!r}")
        names.add(request.name)
        if (request.exactly is None) == (not request.first_available):
            raise InvalidObject(*where, here, "exactly one of exactly and firstAvailable must be set")
        if request.exactly is not None:
            requests.append(_request(where, f"{here}.exactly", request.name, request.exactly))
            continue
        subs = tuple(
            _request(where, f"{here}.firstAvailable[{j}]", sub.name, sub, exactly=False)
            for j, sub in enumerate(request.first_available)
        )
        requests.append(DeviceRequest(name=request.name, first_available=subs))
    constraints: list[ClaimConstraint] = []
    for i, constraint in enumerate(spec.constraints):
        here = f"{at}.constraints[{i}]"
        if not constraint.match_attribute:
            raise InvalidObject(*where, f"{here}.matchAttribute", "required")
        for j, name in enumerate(constraint.requests):
            if name.split("/", 1)[0] not in names:
                raise InvalidObject(*where, f"{here}.requests[{j}]", f"no request named {name!r}")
        constraints.append(
            ClaimConstraint(requests=tuple(constraint.requests), match_attribute=constraint.match_attribute)
        )
    return tuple(requests), tuple(constraints)


def claim_of(raw: WireClaim) -> ResourceClaim:
    """The model claim; one that does not translate keeps its name and carries the problem."""
    meta = raw.metadata
    base = ResourceClaim(
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        deleting=meta.deletion_timestamp is not None,
        queue=meta.labels.get(QUEUE_LABEL, ""),
    )
    where = (raw.KIND, raw.label)
    status = raw.status
    reserved = tuple(c.uid or c.name for c in status.reserved_for)
    try:
        requests, constraints = _devices_claim(where, "spec.devices", raw.spec.devices)
    except InvalidObject as exc:
        return msgspec.structs.replace(base, reserved_for=reserved, problem=str(exc))
    claim = msgspec.structs.replace(base, requests=requests, constraints=constraints, reserved_for=reserved)
    if status.allocation is None:
        return claim
    devices = tuple(
        DeviceResult(
            request=r.request,
            driver=r.driver,
            pool=r.pool,
            device=r.device,
            admin_access=bool(r.admin_access),
        )
        for r in status.allocation.devices.results
    )
    node, terms = _allocation_nodes(where, status.allocation.node_selector)
    return msgspec.structs.replace(claim, allocated=True, devices=devices, node=node, node_selector=terms)


def _allocation_nodes(
    where: tuple[str, str], selector: wire.NodeSelector | None
) -> tuple[str, tuple[LabelSelectorTerm, ...]]:
    """An allocation's node selector: (the one node, ()) for the usual ``metadata.name In [node]``, else
    ("", the terms); ("", ()) for an allocation usable on any node."""
    if selector is None or not selector.node_selector_terms:
        return "", ()
    terms = selector.node_selector_terms
    if len(terms) == 1 and not terms[0].match_expressions and len(terms[0].match_fields) == 1:
        f = terms[0].match_fields[0]
        if f.key == "metadata.name" and f.operator == "In" and len(f.values) == 1:
            return f.values[0], ()
    try:
        out = [
            selectors.node_term(where, f"status.allocation.nodeSelector.nodeSelectorTerms[{i}]", t)
            for i, t in enumerate(terms)
        ]
    except InvalidObject:
        return "", ()
    return "", tuple(t for t in out if t is not None)


def template_of(raw: WireClaimTemplate) -> ResourceClaimTemplate:
    """The model template; one that does not translate keeps its name and carries the problem."""
    meta = raw.metadata
    base = ResourceClaimTemplate(name=meta.name, namespace=meta.namespace)
    try:
        requests, constraints = _devices_claim(
            (raw.KIND, raw.label), "spec.spec.devices", raw.spec.spec.devices
        )
    except InvalidObject as exc:
        return msgspec.structs.replace(base, problem=str(exc))
    return msgspec.structs.replace(base, requests=requests, constraints=constraints)


def slice_of(raw: WireResourceSlice) -> ResourceSlice:
    """The model slice; InvalidObject names the field that does not translate."""
    where = (raw.KIND, raw.label)
    spec = raw.spec
    if not spec.driver:
        raise InvalidObject(*where, "spec.driver", "required")
    pool = spec.pool.get("name")
    if not isinstance(pool, str) or not pool:
        raise InvalidObject(*where, "spec.pool.name", "required")
    try:  # int64, as the API's field: a larger one could not be written to the state bucket
        generation = values.whole_of(spec.pool.get("generation", 0), low=0, high=2**63 - 1)
    except values.InvalidValueError as exc:
        raise InvalidObject(*where, "spec.pool.generation", str(exc)) from None
    terms: tuple[LabelSelectorTerm, ...] = ()
    if spec.node_selector is not None:
        found = [
            selectors.node_term(where, f"spec.nodeSelector.nodeSelectorTerms[{i}]", t)
            for i, t in enumerate(spec.node_selector.node_selector_terms)
        ]
        terms = tuple(t for t in found if t is not None)
    devices = tuple(_device(where, f"spec.devices[{i}]", spec.driver, d) for i, d in enumerate(spec.devices))
    return ResourceSlice(
        name=raw.metadata.name,
        driver=spec.driver,
        pool=pool,
        node=spec.node_name or "",
        all_nodes=bool(spec.all_nodes),
        node_selector=terms,
        devices=devices,
        generation=generation,
    )


def _device(where: tuple[str, str], at: str, driver: str, raw: WireDevice) -> Device:
    if not raw.name:
        raise InvalidObject(*where, f"{at}.name", "required")
    attributes: dict[str, Attribute] = {}
    for name, a in raw.attributes.items():
        field = f"{at}.attributes[{name}]"
        if isinstance(a.int, int) and not isinstance(a.int, bool):
            attribute = Attribute(number=a.int)
        elif isinstance(a.bool, bool):
            attribute = Attribute(flag=a.bool)
        elif isinstance(a.string, str):
            attribute = Attribute(text=a.string)
        elif isinstance(a.version, str):
            attribute = Attribute(version=a.version)
        else:
            raise InvalidObject(*where, field, "must set one of int, bool, string, version")
        attributes[qualified(name, driver)] = attribute
    capacity: dict[str, int] = {}
    for name, c in raw.capacity.items():
        try:
            capacity[qualified(name, driver)] = milli_value(c.value)
        except QuantityError:
            raise InvalidObject(
                *where, f"{at}.capacity[{name}].value", f"{c.value!r} is not a quantity"
            ) from None
    return Device(name=raw.name, attributes=attributes, capacity=capacity)
