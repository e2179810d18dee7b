"""KAI's Grove plugin (``grove``): a PodCliqueSet's (or PodGangSet's) pods are grouped as the PodGang Grove
made for them says.

Claims (`KINDS`, merged by `registry`) ``grove.io/v1alpha1`` PodCliqueSets and PodGangSets (the older
name); NVIDIA Dynamo's DynamoGraphDeployment is skipped for the PodCliqueSet below it (`skip`). Called by
`decision.group_pod`. Grove (``ai-dynamo/grove``) labels each pod with its PodGang
(``grove.io/podgang``); the plugin reads that ``scheduler.grove.io/v1alpha1`` PodGang through `Ctx.get`:

- the PodGroup is the default plugin's for the PodGang (``pg-<podgang>-<uid>``, owned by the PodGang, its
  labels, annotations, queue and priority), the PodGang's ``spec.priorityClassName`` when it has one, and
  the top owner's labels and annotations where the PodGang has none; a ``priorityClassName`` label there
  names the class as it is (KAI does not check that it exists), a ``kai.scheduler/preemptibility`` label
  must be valid, the ``kai.scheduler/topology*`` annotations fill what the PodGang leaves empty, and so
  does a ``kai.scheduler/preemption-delay`` annotation;
- its topology is the PodGang's ``grove.io/topology-name`` annotation (else ``kai.scheduler/topology``),
  with the levels of ``spec.topologyConstraint.packConstraint`` (``required``, ``preferred``);
- a sub-group per ``spec.podgroups[]`` (a clique: ``minReplicas`` at least 1, the pods its
  ``podReferences`` name, which must be in the PodGang's namespace, its own pack constraint), min member
  the sum of their ``minReplicas``; and a parent sub-group per ``spec.topologyConstraintGroupConfigs[]``
  naming cliques (``podGroupNames``; ``minSubGroup`` their number, its pack constraint), which those
  cliques hang from.

A pod without the label, a PodGang that does not exist (yet: Grove gates its pods until it has made their
PodGang, and the gate's removal changes the pod, which is then grouped again) or a malformed PodGang
refuses the pod naming the object and the field, as KAI's plugin fails for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.state.controllers.grouping.default import default_metadata, duration_annotation
from services.state.controllers.grouping.fields import owner_error, pod_as_owner
from services.state.controllers.grouping.kind_defaults import PREEMPTIBILITIES
from services.state.controllers.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.errors import InvalidObject
from shared.kube import keys, values, wire

PODGANG_LABEL = "grove.io/podgang"
PODGANG_API_VERSION = "scheduler.grove.io/v1alpha1"
PODGANG_KIND = "PodGang"
TOPOLOGY_NAME_ANNOTATION = "grove.io/topology-name"


class _Reader:
    """The PodGang's spec, read with errors naming the PodGang and the field."""

    def __init__(self, gang: wire.Owner) -> None:
        self.gang = gang

    def error(self, where: str, problem: str) -> InvalidObject:
        return owner_error(self.gang, where, problem)

    def text(self, doc: Mapping[str, Any], key: str, where: str) -> str | None:
        value = doc.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(f"{where}.{key}", f"must be text, got {values.shown(value)}")
        return value

    def items(self, doc: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
        value = doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"{where}.{key}", f"must be a list, got {values.shown(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise self.error(f"{where}.{key}[{i}]", f"must be an object, got {values.shown(item)}")
        return value

    def pack(self, doc: Mapping[str, Any], where: str, topology: str) -> Constraint | None:
        """KAI ``parseTopologyConstraint``: ``topologyConstraint.packConstraint``'s levels, or None."""
        constraint = doc.get("topologyConstraint")
        pack = constraint.get("packConstraint") if isinstance(constraint, Mapping) else None
        if pack is None:
            return None
        if not isinstance(pack, Mapping):
            raise self.error(f"{where}.topologyConstraint.packConstraint", "must be an object")
        at = f"{where}.topologyConstraint.packConstraint"
        preferred = self.text(pack, "preferred", at)
        required = self.text(pack, "required", at)
        if preferred is None and required is None:
            return None
        if not topology:
            raise self.error(at, "topology name cannot be empty when topology constraints are defined")
        return Constraint(topology, required or "", preferred or "")


def _podgang(ctx: Ctx) -> wire.Owner:
    pod = ctx.pod
    name = pod.metadata.labels.get(PODGANG_LABEL)
    if name is None:
        raise owner_error(
            pod_as_owner(pod), f"metadata.labels[{PODGANG_LABEL}]", "missing: the pod's PodGang"
        )
    found = ctx.get(PODGANG_API_VERSION, PODGANG_KIND, name)
    if found is None:
        raise owner_error(
            pod_as_owner(pod), f"metadata.labels[{PODGANG_LABEL}]", f"PodGang {name!r} not found"
        )
    return wire.convert(wire.Owner, found)


def _from_top_owner(md: Metadata, gang: wire.Owner, top: wire.Owner, ctx: Ctx) -> None:
    """KAI ``parseMetadataFromTopOwner``, on the labels and annotations merged from the top owner."""
    if keys.PRIORITY_CLASS_LABEL in md.labels:
        md.priority_class = md.labels[keys.PRIORITY_CLASS_LABEL]
    if keys.PREEMPTIBILITY_LABEL in md.labels:
        value = md.labels[keys.PREEMPTIBILITY_LABEL]
        if value not in PREEMPTIBILITIES and value != "":
            raise owner_error(
                gang,
                f"metadata.labels[{keys.PREEMPTIBILITY_LABEL}]",
                f"invalid preemptibility {values.shown(value)}",
            )
        md.preemptibility = value
    key = keys.PREEMPTION_DELAY_ANNOTATION
    if key not in gang.metadata.annotations and key in top.metadata.annotations:
        delay = duration_annotation(ctx, [top], key)
        if delay is not None:
            md.extra_spec["preemptionDelay"] = delay
    c = md.constraint
    c.topology = c.topology or md.annotations.get(keys.TOPOLOGY_ANNOTATION, "")
    c.required = c.required or md.annotations.get(keys.TOPOLOGY_REQUIRED_ANNOTATION, "")
    c.preferred = c.preferred or md.annotations.get(keys.TOPOLOGY_PREFERRED_ANNOTATION, "")


def grove_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``GroveGrouper`` (see the module's docstring)."""
    gang = _podgang(ctx)
    read = _Reader(gang)
    spec = gang.spec
    md = default_metadata(ctx, gang, [gang])
    annotations = gang.metadata.annotations
    topology = annotations.get(TOPOLOGY_NAME_ANNOTATION, annotations.get(keys.TOPOLOGY_ANNOTATION, ""))
    gang_constraint = read.pack(spec, "spec", topology)
    if gang_constraint is not None:
        md.constraint = gang_constraint
    priority = read.text(spec, "priorityClassName", "spec")
    if priority is not None:
        md.priority_class = priority
    for key, value in top.metadata.labels.items():
        md.labels.setdefault(key, value)
    for key, value in top.metadata.annotations.items():
        md.annotations.setdefault(key, value)
    _from_top_owner(md, gang, top, ctx)

    parents: list[SubGroup] = []
    parent_of: dict[str, str] = {}
    for i, config in enumerate(read.items(spec, "topologyConstraintGroupConfigs", "spec")):
        where = f"spec.topologyConstraintGroupConfigs[{i}]"
        name = read.text(config, "name", where)
        if name is None:
            raise read.error(f"{where}.name", "missing")
        cliques = config.get("podGroupNames")
        if cliques is not None and not (
            isinstance(cliques, list) and all(isinstance(c, str) for c in cliques)
        ):
            raise read.error(
                f"{where}.podGroupNames", f"must be a list of names, got {values.shown(cliques)}"
            )
        if not cliques:
            continue
        for clique in cliques:
            parent_of[clique] = name
        parents.append(
            SubGroup(
                name=name,
                min_available=0,
                min_sub_group=len(cliques),
                constraint=read.pack(config, where, topology),
            )
        )

    children: list[SubGroup] = []
    total = 0
    for i, clique in enumerate(read.items(spec, "podgroups", "spec")):
        where = f"spec.podgroups[{i}]"
        name = read.text(clique, "name", where)
        if name is None:
            raise read.error(f"{where}.name", "missing")
        if "minReplicas" not in clique:
            raise read.error(f"{where}.minReplicas", "missing")
        try:
            minimum = values.whole_of(clique["minReplicas"], low=1, high=values.INT32_MAX)
        except values.InvalidValueError as exc:
            raise read.error(f"{where}.minReplicas", str(exc)) from None
        if "podReferences" not in clique:
            raise read.error(f"{where}.podReferences", "missing")
        pods: list[str] = []
        for j, ref in enumerate(read.items(clique, "podReferences", where)):
            at = f"{where}.podReferences[{j}]"
            namespace, pod_name = read.text(ref, "namespace", at), read.text(ref, "name", at)
            if namespace is None or pod_name is None:
                raise read.error(at, "needs a namespace and a name")
            if namespace != gang.metadata.namespace:
                raise read.error(at, f"pod {namespace}/{pod_name} is not in the PodGang's namespace")
            pods.append(pod_name)
        total += minimum
        if total > values.INT32_MAX:
            raise read.error(f"{where}.minReplicas", f"the cliques' minimum exceeds {values.INT32_MAX}")
        children.append(
            SubGroup(
                name=name,
                min_available=minimum,
                parent=parent_of.get(name),
                constraint=read.pack(clique, where, topology),
                pods=pods,
            )
        )
    md.sub_groups = [*parents, *children]
    md.min_available = total
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("grove.io", "v1alpha1", "PodGangSet"): ("grove", grove_plugin),
    ("grove.io", "v1alpha1", "PodCliqueSet"): ("grove", grove_plugin),
}
