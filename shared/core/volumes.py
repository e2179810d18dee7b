"""The volume filters: kube-scheduler's VolumeRestrictions, NodeVolumeLimits, VolumeBinding and VolumeZone
over a pod's PersistentVolumeClaims (`Pod.claims`, resolved against `Snapshot.volumes`).

KAI runs kube-scheduler's VolumeBinding inside its predicates plugin; so does Kairos: `reason` is one of
the checks of `shared.core.predicates.check`, after host ports and before inter-pod affinity (kube-scheduler's
filter order). A pod without claims pays one tuple test. Per pod, whatever the node:

- a claim the snapshot does not have: 'persistentvolumeclaim "x" not found'; one being deleted likewise;
- a claim (or its class) that did not translate: its problem, naming the object and the field;
- a ReadWriteOncePod claim another pod on a node already uses (in the snapshot or placed this cycle):
  VolumeRestrictions' "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod
  access mode";
- an unbound claim whose class is Immediate (or that names no class, or names a volume not yet bound to
  it): "pod has unbound immediate PersistentVolumeClaims" (the volume controller binds it, not the
  scheduler); an unbound claim of a class the snapshot does not have: the claim and its
  spec.storageClassName, 'storageclass.storage.k8s.io "x" not found'.

Per node:

- NodeVolumeLimits: the node's CSINode limits per driver, counting the distinct volumes of the active pods
  on it and the pod's own (a bound claim's volume by name and CSI driver, an unbound one by claim and its
  class's provisioner, as kube-scheduler counts them): "node(s) exceed max volume count";
- VolumeBinding: a bound claim's volume must exist ("node(s) unavailable due to one or more pvc(s) bound to
  non-existent pv(s)") and its node affinity hold ("node(s) had volume node affinity conflict"); each
  WaitForFirstConsumer claim, smallest request first, takes the smallest available volume of its class
  that has room, the access modes, the claim's selector and node affinity for the node and that no other
  pod of the cycle took, else is provisioned if its class has a provisioner, the node is in its
  allowedTopologies and, when the class has CSIStorageCapacity objects, one of them that selects the node
  has room; otherwise "node(s) didn't find available persistent volumes to bind" (or "node(s) did not have
  enough free storage"); a claim already given to a provisioner (selected-node) fits only that node;
- VolumeZone: a bound volume's zone and region labels (values joined by ``__``) must include the node's
  ("node(s) had no available volume zone"); a node without such labels passes.

What a WaitForFirstConsumer claim got on a node is remembered for the session (`decided`), per pod and
node; a volume counts as taken while the pod that got it is placed on that node, so a rollback or an
undone placement frees it with nothing to undo here, and two pods (a gang's included) never get one
volume. `shared.core.cycle` puts the decision of the pod's node on its `Binding.volumes`, for the binder.

Each refusal carries kube-scheduler's code (`shared.core.plugins.points.Code`): every reason here is
UNRESOLVABLE (evicting pods from the node cannot change it: VolumeBinding and VolumeZone answer
UnschedulableAndUnresolvable, and so do a missing or broken claim or class), except NodeVolumeLimits' and
VolumeRestrictions' ReadWriteOncePod conflict, which are UNSCHEDULABLE (evicting the pod that holds the
volume or the attachments may help). `holds_read_write_once_pod` tells the victim solver when the pod's
fit can hang on a pod elsewhere (a ReadWriteOncePod claim in use on another node).

Private to the core. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.core import selectors
from shared.core.plugins.points import Code, Refusal
from shared.core.result import VolumeBinding
from shared.core.session_memo import PerSession, placed_decisions
from shared.model.status import ACTIVE_USED
from shared.model.volumes import (
    IMMEDIATE,
    READ_WRITE_ONCE_POD,
    Claim,
    PersistentVolume,
    StorageCapacity,
    StorageClass,
    Volumes,
)

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = [
    "BIND_CONFLICT",
    "MAX_VOLUME_COUNT",
    "NODE_CONFLICT",
    "NOT_ENOUGH_SPACE",
    "PV_NOT_EXIST",
    "RWOP_CONFLICT",
    "UNBOUND_IMMEDIATE",
    "ZONE_CONFLICT",
    "decided",
    "holds_read_write_once_pod",
    "reason",
]

NODE_CONFLICT = "node(s) had volume node affinity conflict"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
RWOP_CONFLICT = "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
MAX_VOLUME_COUNT = "node(s) exceed max volume count"
ZONE_CONFLICT = "node(s) had no available volume zone"
ZONE_LABELS = (
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
)
"""The labels VolumeZone compares between a volume and a node."""
HOSTNAME_LABEL = "kubernetes.io/hostname"


def not_found(claim: str) -> str:
    return f'persistentvolumeclaim "{claim}" not found'


def class_not_found(claim: str, storage_class: str) -> str:
    return (
        f'persistentvolumeclaim "{claim}": spec.storageClassName: '
        f'storageclass.storage.k8s.io "{storage_class}" not found'
    )


_Held = tuple[frozenset[str], dict[str, tuple[str, VolumeBinding]]]
"""The volumes other pods of the session hold, and what each of their claims got (claim key -> (node,
decision))."""


@dataclass
class _State:
    """The session's storage objects, indexed, and what pods got of them."""

    claims: dict[str, Claim]
    volumes: dict[str, PersistentVolume]
    by_class: dict[str, list[PersistentVolume]]
    """Class -> its volumes, smallest first, then by name (the first match is the best fit)."""
    pinned: dict[tuple[str, str], list[PersistentVolume]]
    """(class, hostname) -> the class's volumes whose node affinity names that hostname in every term
    (local volumes), in `by_class` order: on a node of another hostname their affinity cannot hold."""
    unpinned: dict[str, list[PersistentVolume]]
    """Class -> its other volumes, in `by_class` order."""
    reserved: dict[str, list[PersistentVolume]]
    """Claim key -> the volumes whose ``claimRef`` names it, in `by_class` order."""
    classes: dict[str, StorageClass]
    limits: dict[str, dict[str, int]]
    capacities: dict[str, list[StorageCapacity]]
    users: dict[str, list[TaskState]]
    """Claim key -> the session's pods that use it."""
    named: frozenset[str]
    """The volumes some claim names in its ``volumeName`` (never offered to another claim)."""
    decided: dict[str, dict[str, tuple[VolumeBinding, ...]]] = field(default_factory=dict)
    """Pod key -> node -> what its WaitForFirstConsumer claims got there."""
    taken: tuple[str, int, _Held] = ("", -1, (frozenset(), {}))
    """(pod key, cluster generation, what others hold): the last `_taken`, reused while nothing moved."""


_state: PerSession[_State] = PerSession(lambda ssn: _index(ssn.snapshot.volumes, ssn.tasks.values()))


def _index(volumes: Volumes, tasks: Iterable[TaskState]) -> _State:
    by_class: dict[str, list[PersistentVolume]] = defaultdict(list)
    for pv in volumes.volumes:
        by_class[pv.storage_class].append(pv)
    pinned: dict[tuple[str, str], list[PersistentVolume]] = defaultdict(list)
    unpinned: dict[str, list[PersistentVolume]] = defaultdict(list)
    reserved: dict[str, list[PersistentVolume]] = defaultdict(list)
    for pvs in by_class.values():
        pvs.sort(key=_fit_order)
        for pv in pvs:
            hosts = _pinned_hosts(pv)
            if hosts is None:
                unpinned[pv.storage_class].append(pv)
            for host in hosts or ():
                pinned[(pv.storage_class, host)].append(pv)
            if pv.claim_ref:
                reserved[pv.claim_ref].append(pv)
    capacities: dict[str, list[StorageCapacity]] = defaultdict(list)
    for capacity in volumes.capacities:
        capacities[capacity.storage_class].append(capacity)
    users: dict[str, list[TaskState]] = defaultdict(list)
    for task in tasks:
        for name in task.pod.claims:
            users[f"{task.pod.namespace}/{name}"].append(task)
    return _State(
        claims={c.key: c for c in volumes.claims},
        volumes={pv.name: pv for pv in volumes.volumes},
        by_class=dict(by_class),
        pinned=dict(pinned),
        unpinned=dict(unpinned),
        reserved=dict(reserved),
        classes={c.name: c for c in volumes.classes},
        limits={n.name: n.limits for n in volumes.csi_nodes if n.limits},
        capacities=dict(capacities),
        users=dict(users),
        named=frozenset(c.volume_name for c in volumes.claims if c.volume_name),
    )


_RESOLVABLE = frozenset({RWOP_CONFLICT, MAX_VOLUME_COUNT})
"""The reasons evicting pods may lift (kube-scheduler's Unschedulable); every other is UNRESOLVABLE."""


def reason(ssn: Session, task: TaskState, node: NodeState) -> Refusal | None:
    """Why the pod's claims keep it off the node (the first reason, in kube-scheduler's filter order, with
    its code); None when they do not. On success, what its WaitForFirstConsumer claims got there is
    remembered."""
    if not task.pod.claims:
        return None
    why = _reason(ssn, task, node)
    if why is None:
        return None
    return Refusal(why, Code.UNSCHEDULABLE if why in _RESOLVABLE else Code.UNRESOLVABLE)


def _reason(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    state = _state(ssn)
    claims = _resolve(state, task)
    if isinstance(claims, str):
        return claims
    bound, waiting = claims
    limit = _volume_limits(state, task, node)
    if limit is not None:
        return limit
    labels = node.labels
    for claim in bound:
        pv = state.volumes.get(claim.volume_name)
        if pv is None:
            return PV_NOT_EXIST
        if not _affinity_holds(pv, labels):
            return NODE_CONFLICT
    if waiting:
        found = _bind_or_provision(ssn, state, task, node, waiting)
        if isinstance(found, str):
            return found
        state.decided.setdefault(task.key, {})[node.name] = found
    for claim in bound:
        if not _zone_holds(state.volumes[claim.volume_name], labels):
            return ZONE_CONFLICT
    return None


def holds_read_write_once_pod(ssn: Session, task: TaskState) -> bool:
    """Whether one of the pod's claims has the ReadWriteOncePod access mode (its fit then depends on the
    pods that use the claim, wherever they are)."""
    if not task.pod.claims:
        return False
    state = _state(ssn)
    for name in task.pod.claims:
        claim = state.claims.get(f"{task.pod.namespace}/{name}")
        if claim is not None and READ_WRITE_ONCE_POD in claim.access_modes:
            return True
    return False


def decided(ssn: Session, task: TaskState, node: str) -> tuple[VolumeBinding, ...]:
    """What the pod's WaitForFirstConsumer claims got on `node` (empty for a pod without any)."""
    if not task.pod.claims:
        return ()
    state = _state.get(ssn)
    if state is None:
        return ()
    return state.decided.get(task.key, {}).get(node, ())


# --- per pod ----------------------------------------------------------------------------------------------
def _resolve(state: _State, task: TaskState) -> str | tuple[list[Claim], list[Claim]]:
    """The pod's bound and WaitForFirstConsumer claims, or why the pod fits no node."""
    namespace = task.pod.namespace
    bound: list[Claim] = []
    waiting: list[Claim] = []
    immediate = False
    for name in task.pod.claims:
        claim = state.claims.get(f"{namespace}/{name}")
        if claim is None:
            return not_found(name)
        if claim.problem:
            return claim.problem
        if claim.deleting:
            return f'persistentvolumeclaim "{name}" is being deleted'
        if READ_WRITE_ONCE_POD in claim.access_modes and _used_elsewhere(state, task, claim):
            return RWOP_CONFLICT
        if claim.bound:
            bound.append(claim)
            continue
        if claim.volume_name or not claim.storage_class:
            immediate = True
            continue
        storage_class = state.classes.get(claim.storage_class)
        if storage_class is None:
            return class_not_found(name, claim.storage_class)
        if storage_class.problem:
            return storage_class.problem
        if storage_class.binding_mode == IMMEDIATE:
            immediate = True
        else:
            waiting.append(claim)
    if immediate:
        return UNBOUND_IMMEDIATE
    return bound, waiting


def _used_elsewhere(state: _State, task: TaskState, claim: Claim) -> bool:
    """Another pod on a node (in the snapshot, or placed this cycle) uses the claim."""
    return any(
        other is not task and other.node is not None and other.status in ACTIVE_USED
        for other in state.users.get(claim.key, ())
    )


# --- NodeVolumeLimits -------------------------------------------------------------------------------------
def _volume_limits(state: _State, task: TaskState, node: NodeState) -> str | None:
    limits = state.limits.get(node.name)
    if not limits:
        return None
    mine = _attachments(state, task.pod.namespace, task.pod.claims)
    if not any(driver in limits for driver in mine.values()):
        return None
    attached: dict[str, str] = {}
    for entry in node.tasks.values():
        other = entry.task
        if other is task or other.status not in ACTIVE_USED or not other.pod.claims:
            continue
        attached.update(_attachments(state, other.pod.namespace, other.pod.claims))
    new = {vid: driver for vid, driver in mine.items() if vid not in attached}
    if not new:
        return None
    for driver, limit in limits.items():
        have = sum(1 for d in attached.values() if d == driver)
        adding = sum(1 for d in new.values() if d == driver)
        if adding and have + adding > limit:
            return MAX_VOLUME_COUNT
    return None


def _attachments(state: _State, namespace: str, names: Sequence[str]) -> dict[str, str]:
    """Volume id -> CSI driver of the claims' volumes (a bound claim's volume; an unbound claim counted
    once under its class's provisioner); claims without a CSI volume are left out."""
    out: dict[str, str] = {}
    for name in names:
        claim = state.claims.get(f"{namespace}/{name}")
        if claim is None:
            continue
        if claim.bound:
            pv = state.volumes.get(claim.volume_name)
            if pv is not None and pv.csi_driver:
                out[f"pv/{pv.name}"] = pv.csi_driver
            continue
        storage_class = state.classes.get(claim.storage_class)
        if storage_class is not None and storage_class.provisioner:
            out[f"claim/{claim.key}"] = storage_class.provisioner
    return out


# --- VolumeBinding ----------------------------------------------------------------------------------------
def _fit_order(pv: PersistentVolume) -> tuple[int, str]:
    """Smallest first, then by name: the first volume a claim may take is the best fit."""
    return (pv.capacity_bytes, pv.name)


def _pinned_hosts(pv: PersistentVolume) -> frozenset[str] | None:
    """The hostnames a volume's node affinity is limited to, when every term requires the hostname label
    In some values (a local volume's); None when a node of any hostname may meet it."""
    hosts: set[str] = set()
    for term in pv.node_affinity:
        named = [r.values for r in term.requirements if r.key == HOSTNAME_LABEL and r.operator == "In"]
        if not named:
            return None
        # The term holds only on a node whose hostname is in every such requirement's values.
        hosts.update(frozenset(named[0]).intersection(*named[1:]))
    return frozenset(hosts) if pv.node_affinity else None


def _affinity_holds(pv: PersistentVolume, labels: Mapping[str, str]) -> bool:
    terms = pv.node_affinity
    return not terms or any(selectors.node_term_matches(term, labels) for term in terms)


def _bind_or_provision(
    ssn: Session, state: _State, task: TaskState, node: NodeState, waiting: Sequence[Claim]
) -> str | tuple[VolumeBinding, ...]:
    if any(claim.selected_node and claim.selected_node != node.name for claim in waiting):
        return BIND_CONFLICT
    taken, held = _taken(ssn, state, task)
    labels = node.labels
    chosen: set[str] = set()
    out: list[VolumeBinding] = []
    provision: list[Claim] = []
    for claim in sorted(waiting, key=lambda c: (c.request_bytes, c.name)):
        earlier = held.get(claim.key)
        if earlier is not None:
            # Another pod of the cycle shares the claim: it goes with what that pod's decision gave it.
            where, decision = earlier
            pv = state.volumes.get(decision.volume) if decision.volume else None
            if (pv is None and where != node.name) or (pv is not None and not _affinity_holds(pv, labels)):
                return BIND_CONFLICT
            out.append(decision)
            continue
        if claim.selected_node:
            provision.append(claim)
            continue
        pv = _match(state, claim, labels, taken, chosen)
        if pv is None:
            provision.append(claim)
            continue
        chosen.add(pv.name)
        out.append(VolumeBinding(claim=claim.name, volume=pv.name))
    for claim in provision:
        storage_class = state.classes[claim.storage_class]
        if not storage_class.provisions or not _topology_allows(storage_class, labels):
            return BIND_CONFLICT
        if not _has_capacity(state, storage_class, claim, labels):
            return NOT_ENOUGH_SPACE
        out.append(VolumeBinding(claim=claim.name))
    return tuple(sorted(out, key=lambda b: b.claim))


def _match(
    state: _State,
    claim: Claim,
    labels: Mapping[str, str],
    taken: frozenset[str],
    chosen: set[str],
) -> PersistentVolume | None:
    """The volume reserved for the claim (its ``claimRef`` names it) if its node affinity holds, else the
    smallest volume of the claim's class the claim may take on a node with these labels. Only the volumes
    that may be on this node are looked at (those pinned to its hostname, and the unpinned ones), in
    `by_class` order, so a cluster of local volumes costs a few per node, not all of them."""
    for pv in state.reserved.get(claim.key, ()):
        if pv.storage_class != claim.storage_class:
            continue
        if not pv.claim_uid or not claim.uid or pv.claim_uid == claim.uid:
            return pv if _affinity_holds(pv, labels) and not pv.deleting else None
    wanted = set(claim.access_modes)
    here = state.pinned.get((claim.storage_class, labels.get(HOSTNAME_LABEL, "")), ())
    anywhere = state.unpinned.get(claim.storage_class, ())
    candidates = heapq.merge(here, anywhere, key=_fit_order) if here and anywhere else here or anywhere
    for pv in candidates:
        if pv.deleting or pv.name in taken or pv.name in chosen or pv.name in state.named:
            continue
        if pv.claim_ref or pv.phase != "Available":
            continue
        if pv.capacity_bytes < claim.request_bytes or not wanted <= set(pv.access_modes):
            continue
        if claim.selector is not None and not selectors.label_selector_matches(claim.selector, pv.labels):
            continue
        if not _affinity_holds(pv, labels):
            continue
        return pv
    return None


def _taken(ssn: Session, state: _State, task: TaskState) -> _Held:
    """The volumes other pods of the session got on the node they are placed on now, and what each of
    their claims got there (claim key -> (node, decision))."""
    generation = ssn.cluster.generation
    key, seen, cached = state.taken
    if key == task.key and seen == generation:
        return cached
    taken: set[str] = set()
    held: dict[str, tuple[str, VolumeBinding]] = {}
    for other, node, decisions in placed_decisions(ssn, task, state.decided):
        for decision in decisions:
            held[f"{other.pod.namespace}/{decision.claim}"] = (node, decision)
            if decision.volume:
                taken.add(decision.volume)
    result = (frozenset(taken), held)
    state.taken = (task.key, generation, result)
    return result


def _topology_allows(storage_class: StorageClass, labels: Mapping[str, str]) -> bool:
    terms = storage_class.allowed_topologies
    return not terms or any(
        all(labels.get(key) in values for key, values in term.requirements.items()) for term in terms
    )


def _has_capacity(
    state: _State, storage_class: StorageClass, claim: Claim, labels: Mapping[str, str]
) -> bool:
    """Storage capacity tracking: a class without CSIStorageCapacity objects is not checked (kube-scheduler
    checks a driver whose CSIDriver opts in; Kairos reads no CSIDriver, and takes a driver that publishes
    capacity for the class as opted in)."""
    capacities = state.capacities.get(storage_class.name)
    if not capacities or claim.request_bytes == 0:
        return True
    for capacity in capacities:
        room = capacity.maximum_volume_size
        if room is None:
            room = capacity.capacity_bytes
        if room is None or room < claim.request_bytes or capacity.node_topology is None:
            continue
        if selectors.label_selector_matches(capacity.node_topology, labels):
            return True
    return False


# --- VolumeZone -------------------------------------------------------------------------------------------
def _zone_holds(pv: PersistentVolume, labels: Mapping[str, str]) -> bool:
    if not any(key in labels for key in ZONE_LABELS):
        return True
    for key in ZONE_LABELS:
        value = pv.labels.get(key)
        if value is None:
            continue
        if labels.get(key, "") not in value.split("__"):
            return False
    return True
