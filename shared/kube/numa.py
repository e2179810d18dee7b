"""NodeResourceTopology objects and pods as the ``numa`` plugin reads them: the translation to
`shared.model.numa`, validated.

A NodeResourceTopology (``topology.node.k8s.io/v1alpha2``, the CRD of NFD's topology-updater and the
resource-topology-exporter) is named after its node and lists zones; the zones of type ``Node`` are the
NUMA nodes, each with resources ``{name, capacity, allocatable, available}``. The kubelet Topology Manager's
policy and scope are the object's attributes ``topologyManagerPolicy`` / ``topologyManagerScope``, or, from
older exporters, the combined top-level ``topologyPolicies`` (``SingleNUMANodeContainerLevel`` ...), read
only when the attributes do not name a policy (as KAI does).

`decode_topology` decodes one object's JSON; `node_numa_of` checks it against its node and returns the
node's `NodeNuma` (None when it lists no NUMA zone). Everything wrong raises `InvalidObject` naming the
object and the field: a malformed document, a quantity that does not parse or is negative, a zone listed
twice, a resource listed twice in a zone, a zone's available above its allocatable, a zone's resource above
the node's allocatable, a policy or scope the kubelet does not have. KAI reads an unknown policy as
``none``; Kairos says so too, with a Warning (the node then schedules as without the object, which is what
``none`` does anyway).

`numa_request_of` is a pod's `NumaRequest` (None when the kubelet would align nothing of it), after KAI's
``requests.go``: per container the requests (limits where a request is missing), CPU only as whole CPUs
of a Guaranteed pod (the static CPU Manager pins nothing else), memory and huge pages only for a Guaranteed
pod; the pod-scope unit is the larger of the init peak and the long-running sum (native sidecars count
with the app containers), with the pod overhead added to every resource but CPU, as KAI adds it.

Called by the state service's NUMA overlay (`services.state.mirror.numa_overlay`) and by `shared.kube.translate`
(the pod). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import cast

import msgspec

from shared.errors import InvalidObject
from shared.kube import keys, wire
from shared.kube.quantity import QuantityError, ceil_int, parse_quantity
from shared.kube.values import shown
from shared.model import Node
from shared.model.numa import (
    POLICIES,
    SCOPES,
    NodeNuma,
    NumaRequest,
    NumaZone,
    TopologyPolicy,
    TopologyScope,
    is_qos_gated,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "NodeResourceTopology",
    "decode_topology",
    "node_numa_of",
    "numa_request_of",
    "zone_order",
]

GROUP, VERSION, PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeResourceTopology"
ZONE_TYPE_NODE = "Node"
"""The zone type of a NUMA node; other zone types (sockets, dies) are not what the kubelet aligns on."""
POLICY_ATTRIBUTE = "topologyManagerPolicy"
SCOPE_ATTRIBUTE = "topologyManagerScope"

_LEGACY: Mapping[str, tuple[TopologyPolicy, TopologyScope]] = {
    "None": ("none", "container"),
    "BestEffort": ("best-effort", "container"),
    "BestEffortContainerLevel": ("best-effort", "container"),
    "BestEffortPodLevel": ("best-effort", "pod"),
    "Restricted": ("restricted", "container"),
    "RestrictedContainerLevel": ("restricted", "container"),
    "RestrictedPodLevel": ("restricted", "pod"),
    "SingleNUMANodeContainerLevel": ("single-numa-node", "container"),
    "SingleNUMANodePodLevel": ("single-numa-node", "pod"),
}
"""The older exporters' combined ``topologyPolicies`` values."""

Quantity = str | int | float


class _Wire(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    pass


class _Meta(_Wire, frozen=True, kw_only=True):
    name: str = ""
    uid: str = ""


class Attribute(_Wire, frozen=True, kw_only=True):
    name: str = ""
    value: str = ""


class ResourceInfo(_Wire, frozen=True, kw_only=True):
    name: str = ""
    capacity: Quantity = 0
    allocatable: Quantity = 0
    available: Quantity = 0


class Zone(_Wire, frozen=True, kw_only=True):
    name: str = ""
    type: str = ""
    resources: list[ResourceInfo] = msgspec.field(default_factory=list)


class NodeResourceTopology(_Wire, frozen=True, kw_only=True):
    """The part of a NodeResourceTopology Kairos reads (costs and zone attributes are not)."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    topology_policies: list[str] = msgspec.field(default_factory=list)
    attributes: list[Attribute] = msgspec.field(default_factory=list)
    zones: list[Zone] = msgspec.field(default_factory=list)


class _Named(msgspec.Struct):
    metadata: dict[str, object] | None = None


_DECODER = msgspec.json.Decoder(NodeResourceTopology)
_NAMED = msgspec.json.Decoder(_Named)
_AT = re.compile(r"^(?P<problem>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)


def decode_topology(data: bytes | str) -> NodeResourceTopology:
    """One NodeResourceTopology's JSON; `InvalidObject` naming the field when it does not match."""
    try:
        return _DECODER.decode(data)
    except msgspec.MsgspecError as exc:
        name = ""
        try:
            meta = _NAMED.decode(data).metadata
            if meta is not None and isinstance(meta.get("name"), str):
                name = str(meta["name"])
        except msgspec.MsgspecError:
            pass
        match = _AT.match(str(exc)) if isinstance(exc, msgspec.ValidationError) else None
        if match is not None:
            raise InvalidObject(KIND, name, match["path"].lstrip("."), match["problem"]) from exc
        raise InvalidObject(KIND, name, "", f"not a valid JSON document: {exc}") from exc


def node_numa_of(nrt: NodeResourceTopology, node: Node) -> NodeNuma | None:
    """The node's NUMA zones and Topology Manager setting, checked against the node's allocatable; None
    when the object lists no zone of type ``Node``."""
    name = nrt.metadata.name
    policy, scope = _policy_and_scope(nrt)
    zones: list[NumaZone] = []
    seen: dict[str, int] = {}
    for i, zone in enumerate(nrt.zones):
        if zone.type != ZONE_TYPE_NODE:
            continue
        if not zone.name:
            raise InvalidObject(KIND, name, f"zones[{i}].name", "a zone needs a name")
        if zone.name in seen:
            raise InvalidObject(
                KIND,
                name,
                f"zones[{i}].name",
                f"zone {shown(zone.name)} is listed twice (also zones[{seen[zone.name]}])",
            )
        seen[zone.name] = i
        zones.append(_zone(name, i, zone, node))
    if not zones:
        return None
    return NodeNuma(policy=policy, scope=scope, zones=tuple(sorted(zones, key=zone_order)))


def zone_order(zone: NumaZone) -> tuple[int, int, str]:
    """Zones by their NUMA id, the number their name ends in (``node-1`` before ``node-10``), then by name:
    the kubelet prefers the lowest NUMA node among equally narrow placements."""
    digits = re.search(r"(\d+)$", zone.name)
    if digits is None:
        return (1, 0, zone.name)
    return (0, int(digits.group(1)[-18:]), zone.name)


def _zone(name: str, i: int, zone: Zone, node: Node) -> NumaZone:
    allocatable: dict[str, float] = {}
    available: dict[str, float] = {}
    for j, resource in enumerate(zone.resources):
        at = f"zones[{i}].resources[{j}]"
        if not resource.name:
            raise InvalidObject(KIND, name, f"{at}.name", "a resource needs a name")
        if resource.name in allocatable:
            raise InvalidObject(KIND, name, f"{at}.name", f"resource {shown(resource.name)} is listed twice")
        amounts = {
            part: _amount(name, f"{at}.{part}", resource.name, getattr(resource, part))
            for part in ("capacity", "allocatable", "available")
        }
        if amounts["available"] > amounts["allocatable"]:
            raise InvalidObject(
                KIND,
                name,
                f"{at}.available",
                f"{_shown(resource.name, amounts['available'])} available is more than the zone's allocatable "
                f"{_shown(resource.name, amounts['allocatable'])}",
            )
        limit = _node_allocatable(node, resource.name)
        if amounts["allocatable"] > limit:
            raise InvalidObject(
                KIND,
                name,
                f"{at}.allocatable",
                f"{_shown(resource.name, amounts['allocatable'])} {resource.name} in zone {shown(zone.name)} is more "
                f"than node {node.name}'s allocatable {_shown(resource.name, limit)}",
            )
        allocatable[resource.name] = amounts["allocatable"]
        available[resource.name] = amounts["available"]
    return NumaZone(name=zone.name, allocatable=allocatable, available=available)


def _amount(name: str, field: str, resource: str, raw: Quantity) -> float:
    try:
        amount = parse_quantity(raw)
    except QuantityError as exc:
        raise InvalidObject(KIND, name, field, str(exc)) from None
    if amount < 0:
        raise InvalidObject(KIND, name, field, f"{shown(raw)} is negative")
    return float(ceil_int(amount * 1000) if resource == keys.CPU else ceil_int(amount))


def _shown(resource: str, amount: float) -> str:
    """An amount in the model's units as a user writes it: CPUs, not millicores."""
    return f"{amount / 1000:g}" if resource == keys.CPU else f"{amount:g}"


def _node_allocatable(node: Node, resource: str) -> float:
    if resource == keys.CPU:
        return node.cpu_millis
    if resource == keys.MEMORY:
        return node.memory_bytes
    if resource in keys.GPU_RESOURCES:
        return float(node.gpus)
    return node.scalars.get(resource, 0.0)


def _policy_and_scope(nrt: NodeResourceTopology) -> tuple[TopologyPolicy, TopologyScope]:
    name = nrt.metadata.name
    policy_at = scope_at = None
    for i, attribute in enumerate(nrt.attributes):
        if attribute.name == POLICY_ATTRIBUTE:
            policy_at = i
        elif attribute.name == SCOPE_ATTRIBUTE:
            scope_at = i
    if policy_at is not None and nrt.attributes[policy_at].value:
        policy = cast(
            "TopologyPolicy",
            _choice(name, f"attributes[{policy_at}].value", nrt.attributes[policy_at].value, POLICIES),
        )
        scope: TopologyScope = "container"
        if scope_at is not None and nrt.attributes[scope_at].value:
            scope = cast(
                "TopologyScope",
                _choice(name, f"attributes[{scope_at}].value", nrt.attributes[scope_at].value, SCOPES),
            )
        return policy, scope
    if not nrt.topology_policies:
        return "none", "container"
    legacy = _LEGACY.get(nrt.topology_policies[0])
    if legacy is None:
        raise InvalidObject(
            KIND,
            name,
            "topologyPolicies[0]",
            f"{shown(nrt.topology_policies[0])} is not a Topology Manager policy (one of {', '.join(_LEGACY)})",
        )
    return legacy


def _choice(name: str, field: str, value: str, allowed: Iterable[str]) -> str:
    options = tuple(allowed)
    if value not in options:
        raise InvalidObject(
            KIND,
            name,
            field,
            f"{shown(value)} is not a Topology Manager setting (one of {', '.join(options)})",
        )
    return value


# --- pods ---------------------------------------------------------------------------------------------
def numa_request_of(pod: wire.Pod) -> NumaRequest | None:
    """What the kubelet would NUMA-align for `pod` (see the module docstring); None when nothing.
    Quantities are assumed valid (`shared.kube.translate` has checked them already)."""
    guaranteed = _guaranteed(pod)
    spec = pod.spec
    containers: list[dict[str, float]] = []
    init: list[dict[str, float]] = []
    peak: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    for c in spec.init_containers:
        amounts = _container(c, guaranteed)
        if c.restart_policy == "Always":
            containers.append(_floats(amounts))
            for r, v in amounts.items():
                sidecars[r] = sidecars.get(r, Fraction(0)) + v
        else:
            init.append(_floats(amounts))
            for r in amounts.keys() | sidecars.keys():
                peak[r] = max(
                    peak.get(r, Fraction(0)), sidecars.get(r, Fraction(0)) + amounts.get(r, Fraction(0))
                )
    running = dict(sidecars)
    for c in spec.containers:
        amounts = _container(c, guaranteed)
        containers.append(_floats(amounts))
        for r, v in amounts.items():
            running[r] = running.get(r, Fraction(0)) + v
    whole = {
        r: max(running.get(r, Fraction(0)), peak.get(r, Fraction(0))) for r in running.keys() | peak.keys()
    }
    for r, raw in spec.overhead.items():
        if r != keys.CPU and (guaranteed or not is_qos_gated(r)) and r in whole:
            whole[r] += _parsed(raw)
    request = NumaRequest(
        guaranteed=guaranteed, pod=_floats(whole), containers=tuple(containers), init=tuple(init)
    )
    if not any(request.pod.values()) and not any(v for unit in (*containers, *init) for v in unit.values()):
        return None
    return request


def _container(c: wire.Container, guaranteed: bool) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for r, raw in {**c.resources.limits, **c.resources.requests}.items():
        if is_qos_gated(r) and not guaranteed:
            continue
        amount = _parsed(raw)
        if r == keys.CPU and amount.denominator != 1:
            continue  # a fraction of a CPU stays in the shared pool: it pins no NUMA node
        if amount > 0:
            out[r] = amount
    return out


def _parsed(raw: Quantity) -> Fraction:
    try:
        amount = parse_quantity(raw)
    except QuantityError:
        return Fraction(0)
    return max(amount, Fraction(0))


def _floats(amounts: Mapping[str, Fraction]) -> dict[str, float]:
    return {
        r: float(ceil_int(v * 1000) if r == keys.CPU else ceil_int(v))
        for r, v in sorted(amounts.items())
        if v > 0
    }


def _guaranteed(pod: wire.Pod) -> bool:
    """Kubernetes' QoS class Guaranteed: every container (init ones too) has CPU and memory limits, and
    requests equal to them where given."""
    everyone = [*pod.spec.init_containers, *pod.spec.containers]
    if not everyone:
        return False
    for c in everyone:
        for r in (keys.CPU, keys.MEMORY):
            limit = c.resources.limits.get(r)
            if limit is None:
                return False
            request = c.resources.requests.get(r)
            if request is not None and _parsed(request) != _parsed(limit):
                return False
            if _parsed(limit) <= 0:
                return False
    return True
