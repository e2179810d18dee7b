"""Dynamic Resource Allocation (resource.k8s.io/v1) as the core sees it: device classes, resource slices,
resource claims and claim templates, and what a pod asks of them.

Immutable msgspec Structs, one per Kubernetes kind the DRA filter reads (`shared.core.dra`, kube-
scheduler's DynamicResources plugin and its structured allocator), gathered in `Dra`, which rides on
`Snapshot.dra`. A pod names its claims in `Pod.resource_claims` (`PodClaim`: a claim by name, or one made
from a template and named in the pod's status). Built by `shared.kube.dra` from the API objects; a class,
claim or template that does not translate (a selector that does not compile, a claim without requests)
keeps its name and carries its `problem` (the object and the field), so a pod that uses it is held with
those words rather than silently scheduled.

Attributes are keyed by their fully qualified name (``<domain>/<name>``; an unqualified name in a slice
is in its driver's domain, as Kubernetes reads it); capacities are in thousandths of their unit
(Kubernetes' milli-value: memory of 80Gi is 85899345920000). Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.model.objects import LabelSelectorTerm

__all__ = [
    "ADMIN_ACCESS_LABEL",
    "ALL",
    "EXACT_COUNT",
    "RESERVED_FOR_MAX",
    "AllocationMode",
    "Attribute",
    "ClaimConstraint",
    "ClaimHold",
    "Device",
    "DeviceClass",
    "DeviceRequest",
    "DeviceResult",
    "Dra",
    "DraObject",
    "PodClaim",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "ResourceSlice",
    "extended_claim_name",
    "qualified",
]

AllocationMode = Literal["ExactCount", "All"]
EXACT_COUNT: AllocationMode = "ExactCount"
ALL: AllocationMode = "All"
RESERVED_FOR_MAX = 256
"""How many consumers a claim's ``status.reservedFor`` may list (resource.k8s.io/v1)."""
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
"""The namespace label (value ``"true"``) without which a claim may not request admin access (Kubernetes
1.34; ``resource.k8s.io/admin-access`` in 1.33)."""


def qualified(name: str, driver: str) -> str:
    """An attribute or capacity name with its domain: an unqualified one is in the driver's domain."""
    return name if "/" in name else f"{driver}/{name}"


class Attribute(msgspec.Struct, frozen=True, omit_defaults=True):
    """One typed device attribute, exactly one of the four set (the API's int, bool, string, version)."""

    number: int | None = None
    flag: bool | None = None
    text: str | None = None
    version: str | None = None
    """A semantic version (``1.2.3``)."""

    @property
    def value(self) -> object:
        """The one value set (what matchAttribute compares; None when none is)."""
        for v in (self.number, self.flag, self.text, self.version):
            if v is not None:
                return v
        return None


class Device(msgspec.Struct, frozen=True, kw_only=True):
    """One device a slice publishes."""

    name: str
    attributes: dict[str, Attribute] = msgspec.field(default_factory=dict)
    """Qualified name -> value."""
    capacity: dict[str, int] = msgspec.field(default_factory=dict)
    """Qualified name -> amount in thousandths of its unit."""


class ResourceSlice(msgspec.Struct, frozen=True, kw_only=True, tag="resourceslice"):
    """A ResourceSlice: devices of one driver's pool, local to one node or reachable from several."""

    name: str
    driver: str
    pool: str
    node: str = ""
    """``spec.nodeName``: the devices are on this node ("": see `all_nodes` and `node_selector`)."""
    all_nodes: bool = False
    node_selector: tuple[LabelSelectorTerm, ...] = ()
    """Nodes from which the devices are reachable (terms ORed), when neither `node` nor `all_nodes`."""
    devices: tuple[Device, ...] = ()
    generation: int = 0
    """``spec.pool.generation``: a pool's slices of an older generation than its newest are ignored (the
    driver is replacing them), as the structured allocator does."""


class DeviceClass(msgspec.Struct, frozen=True, kw_only=True, tag="deviceclass"):
    """A DeviceClass: CEL selectors every device of the class meets."""

    name: str
    selectors: tuple[str, ...] = ()
    extended_resource_name: str = ""
    """KEP-5004: a pod requesting this extended resource without a claim is allocated devices of the
    class (every class also answers to ``deviceclass.resource.kubernetes.io/<name>``)."""
    problem: str = ""
    """Why the class cannot be used as written (a selector that does not compile), naming the field."""


class DeviceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a claim: `exactly` one kind of device, or the first of `first_available` that can
    be allocated (each a request of its own, named ``<request>/<subrequest>`` in results)."""

    name: str
    device_class: str = ""
    selectors: tuple[str, ...] = ()
    mode: AllocationMode = EXACT_COUNT
    count: int = 1
    first_available: tuple[DeviceRequest, ...] = ()
    admin_access: bool = False
    """``exactly.adminAccess``: the devices are given without being taken (in use or not, and still free
    for every other claim); only in a namespace labelled `ADMIN_ACCESS_LABEL` ``"true"``."""


class ClaimConstraint(msgspec.Struct, frozen=True, kw_only=True):
    """``matchAttribute``: every device allocated for `requests` (all of the claim's when empty) has the
    same value of the attribute."""

    requests: tuple[str, ...] = ()
    match_attribute: str = ""


class DeviceResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One device allocated for a request (``status.allocation.devices.results[]``)."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    """Allocated for an admin-access request: not taken for any other claim (``adminAccess`` of the
    result)."""
    cluster_wide: bool = False
    """From a slice of all nodes or of a node selector, not a node's own: the binder holds it in its pool's
    ledger entry too (`services.binder.pool_ledger`), since no one node's entry covers it. Not on the
    claim's status (the core sets it; a status read back does not carry it)."""

    @property
    def id(self) -> tuple[str, str, str]:
        """Driver, pool, device: what two claims may never share."""
        return (self.driver, self.pool, self.device)


class ClaimHold(msgspec.Struct, frozen=True, kw_only=True):
    """Devices a binder reserved for one claim in a node's ledger (`Reservation.devices`), in the same
    compare-and-set as the rest of the pod's reservation: what the claim holds before its status shows it
    (the binder writes the status a moment later, and the state service mirrors it back later still)."""

    claim: str
    """The claim's key (``<namespace>/<name>``)."""
    devices: tuple[DeviceResult, ...]
    node: str = ""
    """The node the allocation is for ("": any node, cluster-wide devices), as on the claim's status."""


class ResourceClaim(msgspec.Struct, frozen=True, kw_only=True, tag="resourceclaim"):
    """A ResourceClaim: what it asks for and, once allocated, what it got and who uses it."""

    name: str
    namespace: str
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[ClaimConstraint, ...] = ()
    allocated: bool = False
    """``status.allocation`` is set (`devices` and `node` are then what it holds)."""
    devices: tuple[DeviceResult, ...] = ()
    node: str = ""
    """The one node an allocation may be used on ("": any, or as `node_selector` says)."""
    node_selector: tuple[LabelSelectorTerm, ...] = ()
    """An allocation's node selector when it is not one node's."""
    reserved_for: tuple[str, ...] = ()
    """``status.reservedFor``: the uids (or names, for an entry without one) of the pods using it."""
    deleting: bool = False
    problem: str = ""
    """Why the claim cannot be used as written (it did not translate), naming the object and the field."""
    queue: str = ""
    """Its ``kai.scheduler/queue`` label ("" without one): KAI lets a GPU claim shared by name be used only
    by pods of that queue (`shared.core.dra`)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ResourceClaimTemplate(msgspec.Struct, frozen=True, kw_only=True, tag="resourceclaimtemplate"):
    """A ResourceClaimTemplate (the claim it makes is what the core checks; the template's own problem
    holds a pod whose claim is not made yet)."""

    name: str
    namespace: str
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[ClaimConstraint, ...] = ()
    problem: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodClaim(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a pod's ``spec.resourceClaims``."""

    name: str
    """The entry's name (what containers' ``resources.claims`` refer to)."""
    claim: str = ""
    """The ResourceClaim it uses, in the pod's namespace: ``resourceClaimName``, or for a template the
    claim the resourceclaim controller made (``status.resourceClaimStatuses``); "" while not made yet."""
    template: str = ""
    """``resourceClaimTemplateName`` ("" for a claim by name)."""
    device_class: str = ""
    """KEP-5004: not an entry of the pod's but its request of a DeviceClass's extended resource, to be
    allocated through a claim Kairos makes (`extended_claim_name`): `count` devices of this class."""
    count: int = 0


def extended_claim_name(pod: str) -> str:
    """The claim the binder makes for a pod's DRA-backed extended resources (KEP-5004)."""
    return f"{pod}-extended-resources"


DraObject = DeviceClass | ResourceSlice | ResourceClaim | ResourceClaimTemplate


class Dra(msgspec.Struct, frozen=True, kw_only=True):
    """Every DRA object one scheduling cycle reads, in a stable order."""

    classes: tuple[DeviceClass, ...] = ()
    slices: tuple[ResourceSlice, ...] = ()
    claims: tuple[ResourceClaim, ...] = ()
    templates: tuple[ResourceClaimTemplate, ...] = ()
    held: tuple[ClaimHold, ...] = ()
    """Devices the binders' ledger holds for claims whose status does not show an allocation yet (the
    replica fills it from the node ledgers' reservations, `shared.bus.replica`): taken for every other
    claim, and the claim's allocation until its status shows one (`shared.core.dra`)."""

    @classmethod
    def of(cls, objects: list[DraObject]) -> Dra:
        """The objects sorted into their kinds, each kind in name order."""
        return cls(
            classes=tuple(sorted((o for o in objects if isinstance(o, DeviceClass)), key=lambda c: c.name)),
            slices=tuple(sorted((o for o in objects if isinstance(o, ResourceSlice)), key=lambda s: s.name)),
            claims=tuple(sorted((o for o in objects if isinstance(o, ResourceClaim)), key=lambda c: c.key)),
            templates=tuple(
                sorted((o for o in objects if isinstance(o, ResourceClaimTemplate)), key=lambda t: t.key)
            ),
        )

    def __bool__(self) -> bool:
        return bool(self.classes or self.slices or self.claims or self.templates or self.held)
