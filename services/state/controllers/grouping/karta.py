"""KAI v0.17's Karta fallback grouper (``plugins/karta``): a workload kind no plugin knows, grouped as a Karta
describes it.

A Karta (``run.ai/v1alpha1``, cluster-scoped; run-ai/karta) describes a workload kind: its root component
(the kind itself, by group, version and kind), child components (each naming its owner component, where its
pod template is, jq paths to its replicas and minimum replicas, and a pod selector: a jq path on the pod and
the value it must have), and instructions for optimisers. Its ``instructions.gangScheduling`` tells KAI how
to gang the workload's pods. The Karta operator labels each Karta with its root kind
(``run.ai/karta-group``, ``-version``, ``-kind``).

When it applies (`karta_for`, called by `decision.group_pod`): the top owner's (group, version, kind) is
claimed by no module of this package, and exactly one of the Kartas the caller listed carries those labels,
has that exact root kind, is not being deleted, is not empty, has gang-scheduling instructions and is valid
(Kairos checks the structure and that every path is one it evaluates, `karta_paths`). Two or more such
Kartas: none applies (KAI logs it). None: the default plugin, as when the Karta CRD is not installed.

What it decides (`karta_metadata`), starting from the default plugin's metadata for the top owner:

- ``gangScheduling.podGroup`` (taken when both forms are given): PodGroup ``pg-<top owner uid>-<name>``;
  its topology (a topology name and a required or preferred level) is the PodGroup's; one sub-group per
  ``subGroups[]`` entry, named after its component, of the component subtree's scale, with its topology,
  holding the pod when the pod matches the component or one below it; with sub-groups the PodGroup has
  ``minSubGroup`` = their number (no min member), without them the min member is the root's subtree scale.
- ``gangScheduling.podGroups`` (alpha): the pod's component is the only leaf (a component with a pod
  template), else the first leaf whose selector matches the pod; the member that decides is the first
  naming the component itself, else one naming a component above it, whose filters the pod passes; the
  PodGroup is ``pg-<top owner uid>-<group keys joined by '-'>`` (the member's ``groupByKeyPaths`` on the
  pod, each one non-empty value) and its min member the member component's subtree scale (of the pod's
  instance, when the member is the pod's own component and it has instances).

A subtree's scale (Karta's ``CalculateSubtreeScale``): when any component has a scale definition, a
component's scale is its minimum replicas (else replicas; else 0) summed over its instances (or the one
instance asked for), times the sum of its children's (a side that is 0 gives the other); else the number
of leaf instances in the subtree.

A Karta that does not fit a pod or its owner (a component without scale, a group key without a value, a
pod no component selects) refuses the pod naming the object and the path, as KAI's grouper fails for it.
Pure: the Kartas are an argument of `group_pod`, listed by the pod-grouper loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.state.controllers.grouping import karta_paths
from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import owner_error, pod_as_owner
from services.state.controllers.grouping.karta_paths import PathError, Program
from services.state.controllers.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.errors import InvalidObject
from shared.kube import values, wire

KARTA_API_VERSION = "run.ai/v1alpha1"
LABEL_ROOT_GROUP = "run.ai/karta-group"
LABEL_ROOT_VERSION = "run.ai/karta-version"
LABEL_ROOT_KIND = "run.ai/karta-kind"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class _Unreadable(Exception):  # noqa: N818 - internal: the Karta is not one Kairos reads
    pass


@dataclass(frozen=True)
class Component:
    name: str
    owner: str | None
    has_pod_definition: bool
    has_pod_selector: bool = False
    replicas: Program | None = None
    min_replicas: Program | None = None
    instance_ids: Program | None = None
    type_selector: Program | None = None
    instance_selector: Program | None = None


@dataclass(frozen=True)
class Topology:
    name: str
    required: str
    preferred: str


@dataclass(frozen=True)
class SubGroupMapping:
    component: str
    topology: Topology | None


@dataclass(frozen=True)
class Member:
    component: str
    group_by: tuple[Program, ...]
    filters: tuple[Program, ...]


@dataclass(frozen=True)
class Karta:
    """A Karta as the grouper reads it: components in order (root first), and its gang instructions."""

    name: str
    root: str
    components: dict[str, Component]
    children: dict[str, list[str]]
    parents: dict[str, str]
    has_scale: bool
    pod_group: tuple[str, Topology | None, tuple[SubGroupMapping, ...]] | None
    pod_groups: tuple[tuple[str, tuple[Member, ...]], ...] = field(default=())

    @property
    def leaves(self) -> list[str]:
        return [c.name for c in self.components.values() if c.has_pod_definition]


# --- reading a Karta ---------------------------------------------------------------------------------------
def _map(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Unreadable
    return value


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Unreadable
    return value


def _text(value: Any, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise _Unreadable
    return value


def _program(value: Any) -> Program | None:
    if value is None:
        return None
    program = karta_paths.parse(value)
    if program is None:
        raise _Unreadable
    return program


def _component(raw: Any) -> Component:
    spec = _map(raw)
    definition = _map(spec.get("specDefinition"))
    scale = _map(spec.get("scaleDefinition"))
    selector = _map(spec.get("podSelector"))
    type_selector = _map(selector.get("componentTypeSelector"))
    instance_selector = _map(selector.get("componentInstanceSelector"))
    matcher: Program | None = None
    if type_selector:
        path = _text(type_selector.get("keyPath"), required=True)
        wanted = type_selector.get("value")
        # Karta's pod querier asks "<keyPath> == <value as JSON>", or, without a value, for a non-null result.
        source = path if wanted is None else f"{path} == {msgspec.json.encode(_text(wanted)).decode()}"
        matcher = _program(source)
    owner = spec.get("ownerRef")
    return Component(
        name=_text(spec.get("name"), required=True),
        owner=None if owner is None else _text(owner),
        has_pod_definition=any(
            definition.get(k) is not None
            for k in ("podTemplateSpecPath", "podSpecPath", "fragmentedPodSpecDefinition")
        ),
        has_pod_selector=spec.get("podSelector") is not None,
        replicas=_program(scale.get("replicasPath")),
        min_replicas=_program(scale.get("minReplicasPath")),
        instance_ids=_program(spec.get("instanceIdPath")),
        type_selector=matcher,
        instance_selector=_program(instance_selector.get("idPath")) if instance_selector else None,
    )


def _topology(raw: Any) -> Topology | None:
    if raw is None:
        return None
    spec = _map(raw)
    return Topology(
        _text(spec.get("topologyName")),
        _text(spec.get("requiredTopologyLevel")),
        _text(spec.get("preferredTopologyLevel")),
    )


def read_karta(raw: Mapping[str, Any]) -> Karta | None:
    """The Karta a listed object is, or None when it is not one Kairos reads (malformed, or a path outside
    `karta_paths`)."""
    try:
        return _read(raw)
    except _Unreadable:
        return None


def _read(raw: Mapping[str, Any]) -> Karta:
    spec = _map(raw.get("spec"))
    structure = _map(spec.get("structureDefinition"))
    root = _component(structure.get("rootComponent"))
    children = [_component(c) for c in _list(structure.get("childComponents"))]
    components: dict[str, Component] = {}
    for component in [root, *children]:
        if not component.name or component.name in components:
            raise _Unreadable
        components[component.name] = component
    tree: dict[str, list[str]] = {}
    parents: dict[str, str] = {}
    for component in children:
        if component.owner is not None:
            if component.owner not in components:
                raise _Unreadable
            parents[component.name] = component.owner
            tree.setdefault(component.owner, []).append(component.name)
    gang = _map(_map(spec.get("instructions")).get("gangScheduling"))
    pod_group = None
    if gang.get("podGroup") is not None:
        pg = _map(gang["podGroup"])
        mappings = tuple(
            SubGroupMapping(_text(_map(m).get("componentName")), _topology(_map(m).get("topology")))
            for m in _list(pg.get("subGroups"))
        )
        pod_group = (_text(pg.get("name")), _topology(pg.get("topology")), mappings)
    pod_groups = tuple(
        (
            _text(_map(group).get("name")),
            tuple(
                Member(
                    _text(_map(m).get("componentName"), required=True),
                    tuple(p for p in map(_program, _list(_map(m).get("groupByKeyPaths"))) if p),
                    tuple(p for p in map(_program, _list(_map(m).get("filters"))) if p),
                )
                for m in _list(_map(group).get("members"))
            ),
        )
        for group in _list(gang.get("podGroups"))
    )
    return Karta(
        name=_text(_map(raw.get("metadata")).get("name")),
        root=root.name,
        components=components,
        children=tree,
        parents=parents,
        has_scale=any(c.replicas or c.min_replicas for c in components.values()),
        pod_group=pod_group,
        pod_groups=pod_groups,
    )


def _root_gvk(raw: Mapping[str, Any]) -> GVK | None:
    spec = raw.get("spec")
    structure = spec.get("structureDefinition") if isinstance(spec, Mapping) else None
    root = structure.get("rootComponent") if isinstance(structure, Mapping) else None
    kind = root.get("kind") if isinstance(root, Mapping) else None
    if not isinstance(kind, Mapping):
        return None
    group, version, name = kind.get("group"), kind.get("version"), kind.get("kind")
    if isinstance(group, str) and isinstance(version, str) and isinstance(name, str):
        return group, version, name
    return None


def _gang_instructions(raw: Mapping[str, Any]) -> bool:
    spec = raw.get("spec")
    instructions = spec.get("instructions") if isinstance(spec, Mapping) else None
    gang = instructions.get("gangScheduling") if isinstance(instructions, Mapping) else None
    if not isinstance(gang, Mapping):
        return False
    return gang.get("podGroup") is not None or bool(gang.get("podGroups"))


def karta_for(kartas: Sequence[object], gvk: GVK) -> Karta | None:
    """KAI ``getKartaForGvk``: the one Karta with gang-scheduling instructions for exactly `gvk`; None when
    there is none, or more than one (KAI's hub then logs and uses the default plugin)."""
    group, version, kind = gvk
    wanted = {LABEL_ROOT_GROUP: group, LABEL_ROOT_VERSION: version, LABEL_ROOT_KIND: kind}
    found: list[Karta] = []
    for raw in kartas:
        if not isinstance(raw, Mapping):
            continue
        meta = raw.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("deletionTimestamp") is not None:
            continue
        labels = meta.get("labels")
        if not isinstance(labels, Mapping) or any(labels.get(k) != v for k, v in wanted.items()):
            continue
        if _root_gvk(raw) != gvk or not _gang_instructions(raw):
            continue
        karta = read_karta(raw)
        if karta is None:  # KAI: empty or invalid, skipped
            continue
        found.append(karta)
    return found[0] if len(found) == 1 else None


def karta_plugin(karta: Karta) -> Plugin:
    """The plugin that groups by `karta`."""

    def plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
        return karta_metadata(ctx, top, karta)

    return plugin


# --- deciding ------------------------------------------------------------------------------------------------
@dataclass
class _Eval:
    """Evaluates a Karta's paths on the top owner and the pod; errors name the object and the path."""

    karta: Karta
    top: wire.Owner
    pod: wire.Pod
    owner_doc: Any = None
    pod_doc: Any = None

    def __post_init__(self) -> None:
        self.owner_doc = msgspec.to_builtins(self.top)
        self.pod_doc = msgspec.to_builtins(self.pod)

    def error(self, on_pod: bool, where: str, problem: str) -> InvalidObject:
        obj = pod_as_owner(self.pod) if on_pod else self.top
        return owner_error(obj, where, f"Karta {self.karta.name!r}: {problem}")

    def run(self, program: Program, on_pod: bool, where: str) -> list[Any]:
        try:
            return karta_paths.evaluate(program, self.pod_doc if on_pod else self.owner_doc)
        except PathError as exc:
            raise self.error(on_pod, where, str(exc)) from None

    def single(self, program: Program, on_pod: bool, where: str) -> str:
        """Karta's ``validateSingleQueryResult``: exactly one output, neither null nor empty."""
        outputs = self.run(program, on_pod, where)
        if len(outputs) != 1 or outputs[0] is None or outputs[0] == "":
            raise self.error(on_pod, where, f"expected one value, got {values.shown(outputs)}")
        return karta_paths.text_of(outputs[0])

    def matches(self, component: Component) -> bool:
        if component.type_selector is None:
            return False
        outputs = self.run(component.type_selector, True, f"{component.name} pod selector")
        if component.type_selector.compare:
            return any(o is True for o in outputs)
        return any(o is not None for o in outputs)

    def matches_subtree(self, name: str) -> bool:
        if self.matches(self.karta.components[name]):
            return True
        return any(self.matches_subtree(child) for child in self.karta.children.get(name, []))

    def instance_ids(self, component: Component) -> list[str]:
        if component.instance_ids is None:
            return [""]
        outputs = self.run(component.instance_ids, False, f"{component.name} instance ids")
        return [karta_paths.text_of(o) for o in outputs]

    def scales(self, component: Component) -> dict[str, int]:
        """Each instance's effective minimum (min replicas if > 0, else replicas if > 0, else 0); {} when the
        component defines no scale."""
        if component.replicas is None and component.min_replicas is None:
            return {}
        ids = self.instance_ids(component)
        columns: list[list[int | None]] = []
        for program, label in ((component.min_replicas, "minReplicas"), (component.replicas, "replicas")):
            if program is None:
                columns.append([None] * len(ids))
                continue
            where = f"{component.name} {label}"
            outputs = self.run(program, False, where)
            if len(outputs) != len(ids):
                raise self.error(False, where, f"{len(outputs)} values for {len(ids)} instances")
            columns.append([self.count(o, where) for o in outputs])
        return {
            ids[i]: next((v for v in (columns[0][i], columns[1][i]) if v is not None and v > 0), 0)
            for i in range(len(ids))
        }

    def count(self, raw: Any, where: str) -> int | None:
        if raw is None:
            return None
        try:
            return values.whole_of(raw, low=-values.INT32_MAX - 1, high=values.INT32_MAX)
        except values.InvalidValueError as exc:
            raise self.error(False, where, str(exc)) from None

    def subtree_scale(self, name: str, instance: str | None) -> int:
        if instance == "":
            raise self.error(False, name, "instance id is empty")
        scale = (
            self._by_definition(name, name, instance)
            if self.karta.has_scale
            else self._by_leaves(name, name, instance)
        )
        if scale > values.INT32_MAX:
            raise self.error(False, name, f"scale {scale} beyond {values.INT32_MAX}")
        return scale

    def _by_definition(self, name: str, root: str, instance: str | None) -> int:
        component = self.karta.components[name]
        scales = self.scales(component)
        if len(scales) > 1 and name == root and instance is not None:
            if instance not in scales:
                raise self.error(False, name, f"instance id {instance!r} not found")
            own = scales[instance]
        else:
            own = sum(scales.values())
        children = self.karta.children.get(name, [])
        if not children:
            return own
        below = sum(self._by_definition(child, root, instance) for child in children)
        if below == 0:
            return own
        return below if own == 0 else own * below

    def _by_leaves(self, name: str, root: str, instance: str | None) -> int:
        component = self.karta.components[name]
        if component.has_pod_definition:
            if component.instance_ids is None:
                return 1
            ids = self.instance_ids(component)
            if name == root and instance is not None:
                if instance not in ids:
                    raise self.error(False, name, f"instance id {instance!r} not found")
                return 1
            return len(ids)
        return sum(self._by_leaves(child, root, instance) for child in self.karta.children.get(name, []))


def _constraint(karta: Karta, top: wire.Owner, topology: Topology, where: str) -> Constraint:
    if not topology.name:
        raise owner_error(top, where, f"Karta {karta.name!r}: topology constraint must name a topology")
    if not topology.required and not topology.preferred:
        raise owner_error(
            top, where, f"Karta {karta.name!r}: topology constraint needs a required or preferred level"
        )
    return Constraint(topology.name, topology.required, topology.preferred)


def karta_metadata(ctx: Ctx, top: wire.Owner, karta: Karta) -> Metadata:
    """KAI's ``KartaGrouper.GetPodGroupMetadata`` for `karta` (see the module's docstring)."""
    ev = _Eval(karta, top, ctx.pod)
    md = default_metadata(ctx, top, [top])
    if karta.pod_group is not None:
        return _by_pod_group(ev, md, karta.pod_group)
    return _by_members(ev, md)


def _by_pod_group(
    ev: _Eval, md: Metadata, pod_group: tuple[str, Topology | None, tuple[SubGroupMapping, ...]]
) -> Metadata:
    karta, top = ev.karta, ev.top
    name, topology, mappings = pod_group
    md.name = _name(top, [name])
    md.min_sub_group = None
    md.sub_groups = []
    if topology is not None:
        md.constraint = _constraint(karta, top, topology, "topology")
    for mapping in mappings:
        if not mapping.component or mapping.component not in karta.components:
            raise ev.error(False, "subGroups", f"no component {mapping.component!r}")
        if not _DNS_LABEL.fullmatch(mapping.component):
            raise ev.error(False, "subGroups", f"component {mapping.component!r} is not a sub-group name")
        minimum = ev.subtree_scale(mapping.component, None)
        if minimum == 0:
            raise ev.error(False, mapping.component, "component must expose a replica scale definition")
        sub = SubGroup(name=mapping.component, min_available=minimum)
        if mapping.topology is not None:
            sub.constraint = _constraint(karta, top, mapping.topology, f"{mapping.component} topology")
        if ev.matches_subtree(mapping.component):
            sub.pods = [ev.pod.metadata.name]
        md.sub_groups.append(sub)
    if md.sub_groups:
        md.min_sub_group = len(md.sub_groups)
        md.min_available = 0
    else:
        md.min_available = ev.subtree_scale(karta.root, None)
    return md


def _by_members(ev: _Eval, md: Metadata) -> Metadata:
    karta = ev.karta
    component = _pod_component(ev)
    found = _effective_member(ev, component)
    if found is None:
        raise ev.error(True, "", f"pod matches no pod group member (component {component!r})")
    member = found
    instance: str | None = None
    if member.component == component:
        instance = _pod_instance(ev, karta.components[component])
    keys = [ev.single(p, True, "groupByKeyPaths") for p in member.group_by]
    md.name = _name(ev.top, keys)
    if not _DNS_SUBDOMAIN.fullmatch(md.name):
        raise ev.error(True, "groupByKeyPaths", f"PodGroup name {md.name!r} is not a valid name")
    md.min_available = ev.subtree_scale(member.component, instance)
    return md


def _pod_component(ev: _Eval) -> str:
    """Karta ``InferPodComponent``: the only leaf, else the first leaf whose selector matches the pod."""
    leaves = ev.karta.leaves
    if len(leaves) == 1:
        return leaves[0]
    for name in leaves:
        if ev.matches(ev.karta.components[name]):
            return name
    raise ev.error(True, "", "no component of the Karta selects the pod")


def _effective_member(ev: _Eval, component: str) -> Member | None:
    """Karta ``GetPodGroupingEffectiveComponent``: members naming the component itself first, then those
    naming a component above it, each in the Karta's order; the first whose filters the pod passes."""
    direct: list[Member] = []
    above: list[Member] = []
    current: str | None = component
    while current is not None:
        for _, members in ev.karta.pod_groups:
            for member in members:
                if member.component == current:
                    (direct if current == component else above).append(member)
        current = ev.karta.parents.get(current)
    for member in [*direct, *above]:
        if all(_passes(ev, f) for f in member.filters):
            return member
    return None


def _passes(ev: _Eval, program: Program) -> bool:
    outputs = ev.run(program, True, "filters")
    if len(outputs) != 1 or outputs[0] is None or outputs[0] == "":
        raise ev.error(True, "filters", f"expected one value, got {values.shown(outputs)}")
    return outputs[0] is True


def _pod_instance(ev: _Eval, component: Component) -> str | None:
    """Karta ``InferPodComponentInstance``: the instance id the pod carries, when the component has
    instances and a pod selector; None otherwise."""
    ids = ev.instance_ids(component)
    if not ids or not ids[0] or not component.has_pod_selector:
        return None
    if component.instance_selector is None:
        raise ev.error(True, "", f"component {component.name!r} has instances but no instance selector")
    found = ev.single(component.instance_selector, True, "componentInstanceSelector")
    if found not in ids:
        raise ev.error(True, "componentInstanceSelector", f"instance {found!r} is not one of {ids}")
    return found


def _name(top: wire.Owner, keys: list[str]) -> str:
    """KAI ``calcPodGroupName``: ``pg-<top owner uid>``, then the keys joined by '-'."""
    base = f"pg-{top.metadata.uid}"
    return f"{base}-{'-'.join(keys)}" if keys else base
