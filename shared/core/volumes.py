"""The volume filters: kube-scheduler's VolumeRestrictions, NodeVolumeLimits, VolumeBinding and VolumeZone
over a pod's PersistentVolumeClaims (`Pod.claims`, resolved against `Snapshot.volumes`).

KAI runs kube-scheduler's VolumeBinding inside its predicates plugin; so does Kairos: `reason` is one of
the checks of `shared.core.predicates.check`, after host ports and before inter-pod affinity (kube-scheduler's
filter order). A pod without claims pays one tuple test. Per pod, whatever the node:

- a claim the snapshot does not have: 'persistentvolumeclaim "x" not found' ('waiting for ephemeral volume
  controller to create the persistentvolumeclaim "x"' for a generic ephemeral volume's); one being deleted
  likewise; a generic ephemeral volume's claim whose controller owner is not the pod: "PVC ns/x was not
  created for pod ns/p (pod is not owner)" (someone else's claim of that name is never the pod's);
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
  on it and the pod's own (a bound claim's volume by CSI driver and disk, an unbound one by claim and its
  class's provisioner, as kube-scheduler counts them): "node(s) exceed max volume count". With CSI
  migration, in-tree disks (awsElasticBlockStore, gcePersistentDisk, azureDisk, cinder: volumes of those
  kinds, the same named inline in a pod, claims of a class with the in-tree provisioner) count against the
  migrated driver's limit (ebs.csi.aws.com, pd.csi.storage.gke.io, disk.csi.azure.com,
  cinder.csi.openstack.org) on every node with a CSINode, and Portworx's (pxd.portworx.com) on a node whose
  CSINode's ``storage.kubernetes.io/migrated-plugins`` lists it (kube-scheduler's isCSIMigrationOn today);
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

What the session's placed pods hold is an index (`_Holdings`: volume -> its holders, claim -> what its
users got, and per class and hostname the free local volumes), brought up to date from the nodes whose
pods changed since it last looked (`ClusterState.versions`: every placement, eviction, rollback and
restore moves its node's version), never by a walk over every placed pod; the volumes the pods on a node
attach are kept per node the same way (`_Attached`). Per pod, what does not depend on the node is worked
out once per cluster generation (`_PodClaims`: kube-scheduler's VolumeBinding PreFilter: the claims
classified as bound, to bind, or failing the pod everywhere). `refused` is the node pre-filter
(`shared.core.plugins.points.NodePreFilter`, called by the predicates plugin): every node when the pod
fits none, the nodes a bound volume's node affinity excludes, those other than the node a provisioner was
given, and for a claim of a class whose static volumes are all local, the nodes with no free local volume
of the class outside the class's provisioning topology; so a pod tries the nodes that may take it rather
than every node bin-packing puts first (the nodes whose local volume is already taken).

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
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.core import selectors
from shared.core.plugins.points import Code, Refusal
from shared.core.result import VolumeBinding
from shared.core.session_memo import PerSession
from shared.model.objects import LabelSelectorTerm
from shared.model.status import ACTIVE_ALLOCATED, ACTIVE_USED
from shared.model.volumes import (
    AWS_EBS,
    AZURE_DISK,
    CINDER,
    GCE_PD,
    IMMEDIATE,
    MIGRATED_DRIVERS,
    READ_WRITE_ONCE_POD,
    Claim,
    InlineVolume,
    PersistentVolume,
    StorageCapacity,
    StorageClass,
    Volumes,
)

if TYPE_CHECKING:
    from shared.core.cluster import ClusterState, NodeState
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
    "refused",
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

Mask = npt.NDArray[np.bool_]


def not_found(claim: str) -> str:
    return f'persistentvolumeclaim "{claim}" not found'


def ephemeral_not_created(claim: str) -> str:
    """A generic ephemeral volume's claim not there yet (kube-scheduler's words: it is normal just after
    the pod is created)."""
    return f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{claim}"'


def not_created_for(namespace: str, claim: str, pod: str) -> str:
    """A claim named as the pod's generic ephemeral volume's whose controller owner is not the pod
    (Kubernetes' ``ephemeral.VolumeIsForPod``, which kube-scheduler and the kubelet ask)."""
    return f"PVC {namespace}/{claim} was not created for pod {namespace}/{pod} (pod is not owner)"


def class_not_found(claim: str, storage_class: str) -> str:
    return (
        f'persistentvolumeclaim "{claim}": spec.storageClassName: '
        f'storageclass.storage.k8s.io "{storage_class}" not found'
    )


_Holder = tuple[str, int]
"""(pod key, node index): one pod of the session placed on one node."""


@dataclass
class _Holdings:
    """What the pods placed this session hold, from their decisions on the node each is on now.

    Brought up to date by `_holdings` from the nodes whose version moved since it last looked (a pod
    placed, evicted, moved, a statement rolled back): the nodes of a rollback move too, so what a
    rolled-back pod took is free again at the next look, with nothing to undo here."""

    seen: npt.NDArray[np.int64]
    """Each node's `ClusterState.versions` when it was last indexed."""
    generation: int
    """`ClusterState.generation` at the last look (unmoved: nothing to look at)."""
    dirty: set[int] = field(default_factory=set)
    """Nodes to index again though their version did not move (a placed pod's decision there rewritten)."""
    on_node: dict[int, list[tuple[str, str, tuple[VolumeBinding, ...]]]] = field(default_factory=dict)
    """Node index -> (pod key, namespace, what it got there) of each holding pod on it."""
    taken: dict[str, set[_Holder]] = field(default_factory=dict)
    """Volume -> the placed pods that got it."""
    held: dict[str, dict[_Holder, tuple[str, VolumeBinding]]] = field(default_factory=dict)
    """Claim key -> placed pod -> (its node, what the claim got there)."""
    free: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    """Class -> per hostname code (`ClusterState.label_codes` of the hostname label) the local volumes of
    the class pinned to that hostname that are offered and held by nobody; made when the pre-filter first
    asks for the class."""
    vocabulary: Mapping[str, int] = field(default_factory=dict)
    """Hostname -> its code, once `free` holds a class."""


_Attach = tuple[str, str]
"""(CSI driver, in-tree plugin): what one volume counts against; the plugin is "" for a CSI volume, else the
in-tree plugin CSI migration moves to the driver (counted only on a node where it is migrated)."""


@dataclass(frozen=True, slots=True)
class _PodClaims:
    """A pod's claims classified once per pod and cluster generation, whatever the node (kube-scheduler's
    VolumeBinding PreFilter): why the pod fits no node, or its bound claims' volumes (None: the volume
    does not exist), its WaitForFirstConsumer claims (smallest request first, then by name) and the
    volumes it would attach (volume id -> CSI driver)."""

    key: str
    generation: int
    failure: str | None = None
    bound: tuple[PersistentVolume | None, ...] = ()
    waiting: tuple[Claim, ...] = ()
    attaches: Mapping[str, _Attach] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Attached:
    """The volumes the active pods on one node attach (volume id -> CSI driver) and their count per
    driver, at one version of the node."""

    version: int
    volumes: Mapping[str, str]
    per_driver: Mapping[str, int]


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
    hosts: dict[str, frozenset[str]]
    """Volume -> the hostnames it is pinned to (local volumes only)."""
    reserved: dict[str, list[PersistentVolume]]
    """Claim key -> the volumes whose ``claimRef`` names it, in `by_class` order."""
    classes: dict[str, StorageClass]
    limits: dict[str, dict[str, int]]
    migrated: dict[str, frozenset[str]]
    """Node -> the in-tree plugins its CSINode's migrated-plugins annotation lists."""
    capacities: dict[str, list[StorageCapacity]]
    users: dict[str, list[TaskState]]
    """Claim key -> the session's pods that use it."""
    named: frozenset[str]
    """The volumes some claim names in its ``volumeName`` (never offered to another claim)."""
    decided: dict[str, dict[str, tuple[VolumeBinding, ...]]] = field(default_factory=dict)
    """Pod key -> node -> what its WaitForFirstConsumer claims got there."""
    holdings: _Holdings | None = None
    """What placed pods hold (`_holdings`), made at the first look."""
    attached: dict[int, _Attached] = field(default_factory=dict)
    """Node index -> what its pods attach, at the version last looked at (`_attached`)."""
    pod: _PodClaims | None = None
    """The last pod's classified claims, reused while the pod and the cluster generation stay."""


_state: PerSession[_State] = PerSession(lambda ssn: _index(ssn.snapshot.volumes, ssn.tasks.values()))


def _index(volumes: Volumes, tasks: Iterable[TaskState]) -> _State:
    by_class: dict[str, list[PersistentVolume]] = defaultdict(list)
    for pv in volumes.volumes:
        by_class[pv.storage_class].append(pv)
    pinned: dict[tuple[str, str], list[PersistentVolume]] = defaultdict(list)
    unpinned: dict[str, list[PersistentVolume]] = defaultdict(list)
    hosts: dict[str, frozenset[str]] = {}
    reserved: dict[str, list[PersistentVolume]] = defaultdict(list)
    for pvs in by_class.values():
        pvs.sort(key=_fit_order)
        for pv in pvs:
            on = _pinned_hosts(pv)
            if on is None:
                unpinned[pv.storage_class].append(pv)
            else:
                hosts[pv.name] = on
            for host in on or ():
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
        hosts=hosts,
        reserved=dict(reserved),
        classes={c.name: c for c in volumes.classes},
        limits={n.name: n.limits for n in volumes.csi_nodes if n.limits},
        migrated={n.name: frozenset(n.migrated_plugins) for n in volumes.csi_nodes if n.migrated_plugins},
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
    if not task.pod.claims and not task.pod.inline_volumes:
        return None
    why = _reason(ssn, task, node)
    if why is None:
        return None
    return Refusal(why, Code.UNSCHEDULABLE if why in _RESOLVABLE else Code.UNRESOLVABLE)


def _reason(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    state = _state(ssn)
    pod = _pod_claims(ssn, state, task)
    if pod.failure is not None:
        return pod.failure
    limit = _volume_limits(state, task, pod.attaches, node)
    if limit is not None:
        return limit
    labels = node.labels
    for pv in pod.bound:
        if pv is None:
            return PV_NOT_EXIST
        if not _affinity_holds(pv, labels):
            return NODE_CONFLICT
    if pod.waiting:
        found = _bind_or_provision(ssn, state, task, node, pod.waiting)
        if isinstance(found, str):
            return found
        state.decided.setdefault(task.key, {})[node.name] = found
        if task.node == node.name and state.holdings is not None:
            # The pod is placed here already: what it holds changed without its node moving.
            state.holdings.dirty.add(node.idx)
    for pv in pod.bound:
        if pv is not None and not _zone_holds(pv, labels):
            return ZONE_CONFLICT
    return None


def refused(ssn: Session, task: TaskState) -> Mask | None:
    """The nodes `reason` refuses the pod that are known without trying them, as one mask over the
    session's nodes (None: none); kube-scheduler's VolumeBinding PreFilter. Every node when the pod fits
    none (a missing or broken claim, an unbound Immediate claim, a bound volume that does not exist); the
    nodes a bound volume's node affinity excludes; for a WaitForFirstConsumer claim not yet placed: the
    nodes other than the one a provisioner was given, and for a class whose static volumes are all local
    ones, the nodes with no free local volume of the class, unless the class's provisioner may create one
    there (its allowedTopologies). A node marked here is one `reason` refuses; one it refuses may go
    unmarked (selectors, sizes, access modes, attach limits and zones are checked per node)."""
    if not task.pod.claims:
        return None
    state = _state(ssn)
    pod = _pod_claims(ssn, state, task)
    c = ssn.cluster
    if pod.failure is not None or None in pod.bound:
        return np.ones(len(c.order), dtype=bool)
    out: Mask | None = None
    for pv in pod.bound:
        assert pv is not None
        allowed = _affinity_mask(c, pv.node_affinity)
        if allowed is not None:
            out = ~allowed if out is None else out | ~allowed
    if pod.waiting and task.node is None:
        h = _holdings(ssn, state)
        for claim in pod.waiting:
            allowed = _waiting_mask(ssn, state, h, task, claim)
            if allowed is not None:
                out = ~allowed if out is None else out | ~allowed
    return out if out is not None and out.any() else None


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
def _pod_claims(ssn: Session, state: _State, task: TaskState) -> _PodClaims:
    """The pod's claims classified, made once per pod and cluster generation (a placement anywhere may
    change a ReadWriteOncePod claim's users)."""
    generation = ssn.cluster.generation
    memo = state.pod
    if memo is not None and memo.key == task.key and memo.generation == generation:
        return memo
    resolved = _resolve(state, task)
    if isinstance(resolved, str):
        memo = _PodClaims(task.key, generation, failure=resolved)
    else:
        bound, waiting = resolved
        memo = _PodClaims(
            task.key,
            generation,
            bound=tuple(state.volumes.get(claim.volume_name) for claim in bound),
            waiting=tuple(sorted(waiting, key=lambda c: (c.request_bytes, c.name))),
            attaches=_attachments(state, task.pod.namespace, task.pod.claims, task.pod.inline_volumes),
        )
    state.pod = memo
    return memo


def _resolve(state: _State, task: TaskState) -> str | tuple[list[Claim], list[Claim]]:
    """The pod's bound and WaitForFirstConsumer claims, or why the pod fits no node."""
    namespace = task.pod.namespace
    bound: list[Claim] = []
    waiting: list[Claim] = []
    immediate = False
    for name in task.pod.claims:
        claim = state.claims.get(f"{namespace}/{name}")
        ephemeral = name in task.pod.ephemeral_claims
        if claim is None:
            return ephemeral_not_created(name) if ephemeral else not_found(name)
        if claim.problem:
            return claim.problem
        if claim.deleting:
            return f'persistentvolumeclaim "{name}" is being deleted'
        if ephemeral and (not task.pod.uid or claim.controller_uid != task.pod.uid):
            return not_created_for(namespace, name, task.pod.name)
        if READ_WRITE_ONCE_POD in claim.access_modes and _used_elsewhere(state, task, claim):
            return RWOP_CONFLICT
        if claim.bound:
            bound.append(claim)
            continue
        if claim.volume_name or not claim.storage_class:
            # kube-scheduler reads a claim of no class (spec.storageClassName unset or "") as one of
            # Immediate binding: the volume controller binds it, or gives it the default class first.
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


# --- what placed pods hold --------------------------------------------------------------------------------
def _holdings(ssn: Session, state: _State) -> _Holdings:
    """`_State.holdings`, brought up to date: each node whose version moved since the last look (and each
    marked dirty) is indexed again from the pods on it now."""
    c = ssn.cluster
    h = state.holdings
    if h is None:
        h = state.holdings = _Holdings(seen=c.versions.copy(), generation=c.generation)
        for key in state.decided:
            # Decisions made before the first look (none in the usual order: the first look comes first).
            other = ssn.tasks.get(key)
            if other is not None and other.node is not None and other.node in c.nodes:
                h.dirty.add(c.nodes[other.node].idx)
    if h.generation == c.generation and not h.dirty:
        return h
    changed = np.flatnonzero(c.versions != h.seen)
    for idx in {*changed.tolist(), *h.dirty}:
        _reindex(state, h, c.order[idx])
    h.seen[changed] = c.versions[changed]
    h.generation = c.generation
    h.dirty.clear()
    return h


def _reindex(state: _State, h: _Holdings, node: NodeState) -> None:
    idx = node.idx
    for key, namespace, decisions in h.on_node.pop(idx, ()):
        for decision in decisions:
            claim_key = f"{namespace}/{decision.claim}"
            users = h.held.get(claim_key)
            if users is not None:
                users.pop((key, idx), None)
                if not users:
                    del h.held[claim_key]
            if decision.volume:
                holders = h.taken.get(decision.volume)
                if holders is not None:
                    holders.discard((key, idx))
                    if not holders:
                        del h.taken[decision.volume]
                        _free_changed(state, h, decision.volume, 1)
    now: list[tuple[str, str, tuple[VolumeBinding, ...]]] = []
    for entry in node.tasks.values():
        other = entry.task
        if other.status not in ACTIVE_ALLOCATED:
            continue
        got = state.decided.get(other.key, {}).get(node.name)
        if not got:
            continue
        namespace = other.pod.namespace
        now.append((other.key, namespace, got))
        for decision in got:
            h.held.setdefault(f"{namespace}/{decision.claim}", {})[(other.key, idx)] = (node.name, decision)
            if decision.volume:
                holders = h.taken.setdefault(decision.volume, set())
                if not holders:
                    _free_changed(state, h, decision.volume, -1)
                holders.add((other.key, idx))
    if now:
        h.on_node[idx] = now


def _free_changed(state: _State, h: _Holdings, name: str, delta: int) -> None:
    """A local volume was taken (-1) or freed (+1): its hostnames' free counts follow."""
    pv = state.volumes.get(name)
    if pv is None:
        return
    counts = h.free.get(pv.storage_class)
    if counts is None or not _offered(state, pv):
        return
    for host in state.hosts.get(name, ()):
        code = h.vocabulary.get(host)
        if code is not None:
            counts[code] += delta


def _free_local(ssn: Session, state: _State, h: _Holdings, storage_class: str) -> npt.NDArray[np.int64]:
    """Per hostname code, the class's local volumes offered and held by nobody (made once per class)."""
    counts = h.free.get(storage_class)
    if counts is None:
        _, h.vocabulary = ssn.cluster.label_codes(HOSTNAME_LABEL)
        counts = np.zeros(len(h.vocabulary) + 1, dtype=np.int64)
        for pv in state.by_class.get(storage_class, ()):
            if pv.name in h.taken or not _offered(state, pv):
                continue
            for host in state.hosts.get(pv.name, ()):
                code = h.vocabulary.get(host)
                if code is not None:
                    counts[code] += 1
        h.free[storage_class] = counts
    return counts


class _TakenByOthers:
    """The volumes pods other than `key` hold, as a container of names."""

    __slots__ = ("_key", "_taken")

    def __init__(self, taken: Mapping[str, set[_Holder]], key: str) -> None:
        self._taken = taken
        self._key = key

    def __contains__(self, name: object) -> bool:
        holders = self._taken.get(name) if isinstance(name, str) else None
        return bool(holders) and any(key != self._key for key, _ in holders or ())


def _held_by_others(h: _Holdings, claim_key: str, task_key: str) -> tuple[str, VolumeBinding] | None:
    """(node, decision) of another placed pod that uses the claim, if any."""
    for (key, _), got in h.held.get(claim_key, {}).items():
        if key != task_key:
            return got
    return None


# --- the pre-filter's masks -------------------------------------------------------------------------------
def _affinity_mask(c: ClusterState, terms: tuple[LabelSelectorTerm, ...]) -> Mask | None:
    """The nodes a volume's node affinity holds on (None: every node, or terms with an operator not read
    here, Gt or Lt, left to the per-node check)."""
    if not terms:
        return None
    out = np.zeros(len(c.order), dtype=bool)
    for term in terms:
        holds = np.ones(len(c.order), dtype=bool)
        for r in term.requirements:
            match r.operator:
                case "In":
                    holds &= c.domain_mask(r.key, r.values)
                case "NotIn":
                    holds &= ~c.domain_mask(r.key, r.values)
                case "Exists":
                    holds &= c.label_codes(r.key)[0] != 0
                case "DoesNotExist":
                    holds &= c.label_codes(r.key)[0] == 0
                case _:
                    return None
        out |= holds
    return out


def _topology_mask(c: ClusterState, storage_class: StorageClass) -> Mask | None:
    """The nodes in a class's allowedTopologies (None: no limit)."""
    if not storage_class.allowed_topologies:
        return None
    out = np.zeros(len(c.order), dtype=bool)
    for term in storage_class.allowed_topologies:
        holds = np.ones(len(c.order), dtype=bool)
        for key, values in term.requirements.items():
            holds &= c.domain_mask(key, values)
        out |= holds
    return out


def _waiting_mask(ssn: Session, state: _State, h: _Holdings, task: TaskState, claim: Claim) -> Mask | None:
    """The nodes a WaitForFirstConsumer claim may get a volume on (None: any, as far as is known without
    trying the node)."""
    c = ssn.cluster
    if claim.selected_node:
        out = np.zeros(len(c.order), dtype=bool)
        chosen = c.nodes.get(claim.selected_node)
        if chosen is not None:
            out[chosen.idx] = True
        return out
    if _held_by_others(h, claim.key, task.key) is not None or state.reserved.get(claim.key):
        return None
    if state.unpinned.get(claim.storage_class):
        return None
    codes, _ = c.label_codes(HOSTNAME_LABEL)
    allowed: Mask = _free_local(ssn, state, h, claim.storage_class)[codes] > 0
    storage_class = state.classes[claim.storage_class]
    if storage_class.provisions:
        topology = _topology_mask(c, storage_class)
        if topology is None:
            return None
        allowed |= topology
    return allowed


# --- NodeVolumeLimits -------------------------------------------------------------------------------------
def _volume_limits(
    state: _State, task: TaskState, mine: Mapping[str, _Attach], node: NodeState
) -> str | None:
    limits = state.limits.get(node.name)
    if not limits:
        return None
    counted = _counted(state, node.name, mine)
    if not any(driver in limits for driver in counted.values()):
        return None
    # A pod on the node already (checked again) counts against what the others attach, without it.
    on_node = _attached_on(state, node, task) if task.key in node.tasks else _attached(state, node)
    new = [driver for vid, driver in counted.items() if vid not in on_node.volumes]
    for driver, limit in limits.items():
        adding = new.count(driver)
        if adding and on_node.per_driver.get(driver, 0) + adding > limit:
            return MAX_VOLUME_COUNT
    return None


_MIGRATED_WITH_CSI_NODE = frozenset({AWS_EBS, GCE_PD, AZURE_DISK, CINDER})
"""The in-tree plugins whose migration kube-scheduler takes as on wherever the node has a CSINode (their
migration is GA and locked on); any other in-tree plugin (Portworx, whose gate is on by default) counts only
on a node whose CSINode lists it in its migrated-plugins annotation (kube-scheduler's isCSIMigrationOn)."""


def _migrated_on(state: _State, node: str, plugin: str) -> bool:
    """Whether the plugin's volumes count against the migrated driver on the node; asked only for a node
    with limits, which come from its CSINode."""
    return plugin in _MIGRATED_WITH_CSI_NODE or plugin in state.migrated.get(node, ())


def _counted(state: _State, node: str, volumes: Mapping[str, _Attach]) -> dict[str, str]:
    """Volume id -> the CSI driver it counts against on the node: CSI volumes, and in-tree ones only where
    their plugin is migrated (elsewhere the in-tree plugin's own limit applies, which Kairos does not read)."""
    return {
        vid: driver
        for vid, (driver, plugin) in volumes.items()
        if not plugin or _migrated_on(state, node, plugin)
    }


def _attached(state: _State, node: NodeState) -> _Attached:
    """What the node's active pods attach, kept per node until its version moves."""
    version = int(node.cluster.versions[node.idx])
    cached = state.attached.get(node.idx)
    if cached is None or cached.version != version:
        cached = state.attached[node.idx] = _attached_on(state, node, None, version)
    return cached


def _attached_on(state: _State, node: NodeState, without: TaskState | None, version: int = -1) -> _Attached:
    volumes: dict[str, str] = {}
    for entry in node.tasks.values():
        other = entry.task
        pod = other.pod
        if other is without or other.status not in ACTIVE_USED or not (pod.claims or pod.inline_volumes):
            continue
        volumes.update(
            _counted(state, node.name, _attachments(state, pod.namespace, pod.claims, pod.inline_volumes))
        )
    per_driver: dict[str, int] = {}
    for driver in volumes.values():
        per_driver[driver] = per_driver.get(driver, 0) + 1
    return _Attached(version, volumes, per_driver)


def _attachments(
    state: _State, namespace: str, names: Sequence[str], inline: Sequence[InlineVolume] = ()
) -> dict[str, _Attach]:
    """Volume id -> what it counts against, for the claims' volumes (a bound claim's volume by its driver
    and disk; an unbound claim counted once under its class's provisioner) and the in-tree disks named
    inline; in-tree ones under the CSI driver migration moves them to. Volumes of neither a CSI driver nor a
    migrated plugin are left out."""
    out: dict[str, _Attach] = {}
    for name in names:
        claim = state.claims.get(f"{namespace}/{name}")
        if claim is None:
            continue
        if claim.bound:
            pv = state.volumes.get(claim.volume_name)
            if pv is None:
                continue
            if pv.csi_driver:
                out[_volume_id(pv.csi_driver, pv.volume_handle, pv.name)] = (pv.csi_driver, "")
            elif (driver := MIGRATED_DRIVERS.get(pv.in_tree_plugin)) is not None:
                out[_volume_id(driver, pv.volume_handle, pv.name)] = (driver, pv.in_tree_plugin)
            continue
        storage_class = state.classes.get(claim.storage_class)
        if storage_class is not None and storage_class.provisioner:
            provisioner = storage_class.provisioner
            driver = MIGRATED_DRIVERS.get(provisioner)
            at: _Attach = (provisioner, "") if driver is None else (driver, provisioner)
            out[f"claim/{claim.key}"] = at
    for volume in inline:
        driver = MIGRATED_DRIVERS.get(volume.plugin)
        if driver is not None:
            out[_volume_id(driver, volume.handle, "")] = (driver, volume.plugin)
    return out


def _volume_id(driver: str, handle: str, pv: str) -> str:
    """One disk's id whoever names it (kube-scheduler's driver/volumeHandle); a volume without a handle by
    its name."""
    return f"{driver}/{handle}" if handle else f"pv/{pv}"


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


def _offered(state: _State, pv: PersistentVolume) -> bool:
    """Whether a volume may go to a claim that does not name it: free, Available, not being deleted, and
    named by no claim's ``volumeName``."""
    return not pv.deleting and not pv.claim_ref and pv.phase == "Available" and pv.name not in state.named


def _bind_or_provision(
    ssn: Session, state: _State, task: TaskState, node: NodeState, waiting: Sequence[Claim]
) -> str | tuple[VolumeBinding, ...]:
    """`waiting` smallest request first, then by name."""
    if any(claim.selected_node and claim.selected_node != node.name for claim in waiting):
        return BIND_CONFLICT
    h = _holdings(ssn, state)
    taken = _TakenByOthers(h.taken, task.key)
    labels = node.labels
    chosen: set[str] = set()
    out: list[VolumeBinding] = []
    provision: list[Claim] = []
    for claim in waiting:
        earlier = _held_by_others(h, claim.key, task.key)
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
    taken: Container[str],
    chosen: set[str],
) -> PersistentVolume | None:
    """The volume reserved for the claim (its ``claimRef`` names it) if its node affinity holds, else the
    smallest volume of the claim's class the claim may take on a node with these labels. Only the volumes
    that may be on this node are looked at (those pinned to its hostname, and the unpinned ones), in
    `by_class` order, so a cluster of local volumes costs a few per node, not all of them. A volume of
    another ``volumeMode`` is never the claim's (kube-scheduler's and kube-controller-manager's
    FindMatchingVolume skip it first, a reserved one included)."""
    for pv in state.reserved.get(claim.key, ()):
        if pv.storage_class != claim.storage_class or pv.volume_mode != claim.volume_mode:
            continue
        if not pv.claim_uid or not claim.uid or pv.claim_uid == claim.uid:
            return pv if _affinity_holds(pv, labels) and not pv.deleting else None
    wanted = set(claim.access_modes)
    here = state.pinned.get((claim.storage_class, labels.get(HOSTNAME_LABEL, "")), ())
    anywhere = state.unpinned.get(claim.storage_class, ())
    candidates = heapq.merge(here, anywhere, key=_fit_order) if here and anywhere else here or anywhere
    for pv in candidates:
        if pv.name in taken or pv.name in chosen or not _offered(state, pv):
            continue
        if pv.capacity_bytes < claim.request_bytes or pv.volume_mode != claim.volume_mode:
            continue
        if not wanted <= set(pv.access_modes):
            continue
        if claim.selector is not None and not selectors.label_selector_matches(claim.selector, pv.labels):
            continue
        if not _affinity_holds(pv, labels):
            continue
        return pv
    return None


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
