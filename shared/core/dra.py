"""The DRA filter: kube-scheduler's DynamicResources plugin and its structured allocator over a pod's
ResourceClaims (`Pod.resource_claims`, resolved against `Snapshot.dra`).

KAI runs kube-scheduler's DynamicResources as its ``dynamicresources`` plugin; so does Kairos: `reason` is
that plugin's node filter (`shared.core.builtin.dynamicresources.DynamicResources`), so a shard that disables the
plugin turns it off. A pod without claims pays one tuple test. Per pod, whatever the node:

- a claim the snapshot does not have: 'resourceclaim "x" not found'; one being deleted likewise; a
  template's claim the resourceclaim controller has not made yet: 'resourceclaim of pod claim "x": not
  created yet', and a missing template is named ('resourceclaimtemplate "t" not found');
- a claim, template or DeviceClass that did not translate (a selector that does not compile, no requests):
  its problem, naming the object and the field; a request naming a class the snapshot does not have: the
  claim, the field and 'deviceclass.resource.k8s.io "c" not found';
- an allocated claim that already lists `RESERVED_FOR_MAX` other users: "resourceclaim in use";
- a GPU claim the pod names (not one from a template) without the ``kai.scheduler/queue`` label of the
  pod's queue: KAI's words (`shared_gpu_claim_queue`);
- an unallocated claim with an ``adminAccess`` request in a namespace not labelled `ADMIN_ACCESS_LABEL`
  ``"true"``: kube-apiserver's Forbidden, naming the request's field (`admin_access_refused`; Kubernetes
  refuses such a claim at creation, a cluster that let one through gets the same words here).

Per node:

- an allocated claim (in the snapshot, held in the binders' ledger, or by another pod placed this
  session: a shared claim) fits only the node its allocation is for: "resourceclaim not available on the
  node";
- the unallocated claims are allocated together from the devices of the node's slices and of the slices
  every node, or this one through its node selector, reaches (a pool's slices of an older generation than
  its newest are not read: `current_slices`), leaving out devices other claims hold (an
  allocation in the snapshot, devices the binders' ledger holds, or one decided for a pod placed this
  session): per request, in order, its DeviceClass's selectors and its own (CEL, `shared.core.dra_cel`)
  must hold; ExactCount takes `count` devices, All every matching device (none of which may be taken, and
  at least one); ``firstAvailable`` tries its subrequests in order; ``matchAttribute`` constraints hold
  across the requests they name. An admin-access request takes devices in use or not and leaves them
  free: its results (``adminAccess``) are never taken for another claim, here or in the binders' ledger.
  The search backtracks over devices as the structured allocator does, within `SEARCH_BUDGET` steps.
  Failing: "cannot allocate all claims"; a selector whose evaluation fails: its CEL runtime error, naming
  the class or claim, the request and the selector's index.

The binders' ledger: a binder reserves a pod's claims' devices on its node in the same compare-and-set as
the rest of the pod (`Reservation.devices`), before it writes the claims' status, and the replica hands
the reservations of claims whose status does not show an allocation yet to the core as `Dra.held`: their
devices are taken, and such a claim is read as allocated with them (a pod sharing it goes where it went),
until its status shows an allocation, which is then the truth. So a cycle (or a placement replica) that
runs before the first binder's status write comes back never gives those devices to another claim, as KAI
reads a pod in Binding state's claim allocations from its BindRequest. A device of a cluster-wide slice
is marked so in its result (`DeviceResult.cluster_wide`): the binder holds it in its pool's ledger entry as
well, since no one node's entry covers it (`services.binder.pool_ledger`).

What a pod's claims got on a node is remembered for the session (`decided`), per pod and node; devices
count as taken while the pod that got them is placed on that node, so a rollback (a gang that does not
fit whole) frees them with nothing to undo here, two claims never get one device, and a gang's claims are
all allocated or none. `shared.core.cycle` puts the decision of the pod's node on `Binding.claims`.

How DRA GPUs count in quota and fair share, and KEP-5004's extended resources, is
`shared.core.dra_accounting`'s.

Private to the core. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shared.core import dra_cel, selectors
from shared.core.dra_accounting import current_slices, is_gpu_class, plugin_serves
from shared.core.result import ClaimAllocation
from shared.core.session_memo import PerSession, placed_decisions
from shared.model.dra import (
    ADMIN_ACCESS_LABEL,
    ALL,
    RESERVED_FOR_MAX,
    ClaimConstraint,
    ClaimHold,
    Device,
    DeviceClass,
    DeviceRequest,
    DeviceResult,
    Dra,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    extended_claim_name,
)
from shared.model.objects import Namespace
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = [
    "CANNOT_ALLOCATE",
    "CLAIM_IN_USE",
    "NOT_AVAILABLE",
    "SEARCH_BUDGET",
    "decided",
    "reason",
]

CANNOT_ALLOCATE = "cannot allocate all claims"
NOT_AVAILABLE = "resourceclaim not available on the node"
"""kube-scheduler's words for an allocated claim whose node selector excludes the node."""
CLAIM_IN_USE = "resourceclaim in use"
SEARCH_BUDGET = 20_000
"""Device choices one pod's allocation on one node may try before giving up (the structured allocator
searches until its context's deadline; a budget keeps one pod's hostile claims from stalling a cycle)."""

DeviceId = tuple[str, str, str]


def not_found(claim: str) -> str:
    return f'resourceclaim "{claim}" not found'


def template_not_found(template: str) -> str:
    return f'resourceclaimtemplate "{template}" not found'


def not_created(entry: str, template: str) -> str:
    return f'resourceclaim of pod claim "{entry}" (resourceclaimtemplate "{template}"): not created yet'


def shared_gpu_claim_queue(claim: ResourceClaim, queue: str) -> str | None:
    """KAI's check of a GPU claim a pod names (not one made from a template, which is the pod's alone):
    shared by the pods naming it, it must carry the queue label of the pod's queue; None when it does or
    the claim asks for no GPU (KAI v0.17 ``dynamicresources``, its words; the label key is KAI's default,
    ``kai.scheduler/queue``, whatever the state service's queue_label_key)."""
    if not any(not r.first_available and is_gpu_class(r.device_class) for r in claim.requests):
        return None
    if not claim.queue:
        return f"DRA claim {claim.name} is a shared GPU claim but does not have a queue label (kai.scheduler/queue)"
    if claim.queue != queue:
        return (
            f"DRA claim {claim.name} is a shared GPU claim with wrong queue label (expected queue: {queue}, "
            f"claim queue label: {claim.queue})"
        )
    return None


def admin_access_refused(claim: str, index: int) -> str:
    """kube-apiserver's words (Forbidden) for a claim asking admin access outside an admin namespace."""
    return (
        f'resourceclaim "{claim}": spec.devices.requests[{index}].exactly.adminAccess: admin access to devices '
        f"requires the `{ADMIN_ACCESS_LABEL}: true` label on the containing namespace"
    )


def class_not_found(claim: str, at: str, device_class: str) -> str:
    return f'resourceclaim "{claim}": {at}: deviceclass.resource.k8s.io "{device_class}" not found'


# --- the session's DRA state ------------------------------------------------------------------------------
@dataclass
class _Candidate:
    """A device a node reaches."""

    id: DeviceId
    driver: str
    pool: str
    device: Device
    local: bool
    """On the node itself (a node-local slice), not a cluster-wide or node-selector one."""


@dataclass
class _State:
    classes: dict[str, DeviceClass]
    claims: dict[str, ResourceClaim]
    templates: dict[str, ResourceClaimTemplate]
    local: dict[str, list[ResourceSlice]]
    """Node -> its own slices, in name order."""
    shared: list[ResourceSlice]
    """Slices of all nodes or of a node selector, in name order."""
    allocated: frozenset[DeviceId]
    """Devices the snapshot's claims hold, and those the binders' ledger holds (`Dra.held`)."""
    users: dict[str, list[TaskState]]
    """Claim key -> the session's pods that use it."""
    devices: dict[str, list[_Candidate]] = field(default_factory=dict)
    """Node -> the devices it reaches (built when first asked)."""
    activations: dict[DeviceId, dict[str, Any]] = field(default_factory=dict)
    matched: dict[tuple[str, DeviceId], bool | str] = field(default_factory=dict)
    """(selector, device) -> whether it holds, or the CEL error."""
    decided: dict[str, dict[str, tuple[ClaimAllocation, ...]]] = field(default_factory=dict)
    """Pod key -> node -> what its claims got there."""
    taken: tuple[str, int, frozenset[DeviceId], dict[str, ClaimAllocation]] = ("", -1, frozenset(), {})
    """(pod key, cluster generation, devices others hold, claims others allocated): the last `_taken`."""
    admin_namespaces: frozenset[str] = frozenset()
    """Namespaces labelled `ADMIN_ACCESS_LABEL` "true": the only ones whose claims may ask admin access."""
    selector_steps: dict[str, list[int]] = field(default_factory=dict)
    """Namespace -> [steps, evaluations] its claims' selectors have cost this session (`_within_budget`)."""


_state: PerSession[_State] = PerSession(
    lambda ssn: _index(ssn.snapshot.dra, ssn.tasks.values(), ssn.snapshot.namespaces)
)


def _index(dra: Dra, tasks: Iterable[TaskState], namespaces: Iterable[Namespace] = ()) -> _State:
    local: dict[str, list[ResourceSlice]] = {}
    shared: list[ResourceSlice] = []
    for s in current_slices(dra.slices):
        if s.node:
            local.setdefault(s.node, []).append(s)
        elif s.all_nodes or s.node_selector:
            shared.append(s)
    users: dict[str, list[TaskState]] = {}
    for task in tasks:
        for entry in task.pod.resource_claims:
            name = entry.claim or (extended_claim_name(task.pod.name) if entry.device_class else "")
            if name:
                users.setdefault(f"{task.pod.namespace}/{name}", []).append(task)
    claims = {c.key: c for c in dra.claims}
    held = _held(dra.held, claims)
    return _State(
        classes={c.name: c for c in dra.classes},
        claims=claims,
        templates={t.key: t for t in dra.templates},
        local=local,
        shared=shared,
        allocated=frozenset(r.id for c in dra.claims if c.allocated for r in c.devices if not r.admin_access)
        | held,
        users=users,
        admin_namespaces=frozenset(n.name for n in namespaces if n.labels.get(ADMIN_ACCESS_LABEL) == "true"),
    )


def _held(holds: Iterable[ClaimHold], claims: dict[str, ResourceClaim]) -> frozenset[DeviceId]:
    """The devices the binders' ledger holds for claims whose status shows no allocation yet; a claim of
    the snapshot among them is read as allocated with what it holds (in `claims`, in place), so a pod
    sharing it goes where it went. A hold on a claim whose status shows an allocation is ignored: the
    status is the truth (it may differ when two binders raced for the claim and the other won)."""
    shown = {key for key, claim in claims.items() if claim.allocated}
    devices: set[DeviceId] = set()
    for hold in holds:
        if hold.claim in shown:
            continue
        devices.update(r.id for r in hold.devices if not r.admin_access)
        claim = claims.get(hold.claim)
        if claim is not None and not claim.allocated and hold.devices:
            claims[hold.claim] = msgspec.structs.replace(
                claim, allocated=True, devices=hold.devices, node=hold.node, node_selector=()
            )
    return frozenset(devices)


# --- the filter -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Wanted:
    """A claim to allocate: its name and what it asks (an existing claim's, or a KEP-5004 one's)."""

    name: str
    key: str
    requests: tuple[DeviceRequest, ...]
    constraints: tuple[ClaimConstraint, ...]
    extended: bool = False
    resource: str = ""
    """A KEP-5004 claim's extended resource (a node whose allocatable lists it serves it without DRA)."""


def reason(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    """Why the pod's claims keep it off the node (None when they do not). On success, what they got
    there is remembered for `decided`."""
    if not task.pod.resource_claims:
        return None
    state = _state(ssn)
    resolved = _resolve(state, task)
    if isinstance(resolved, str):
        return resolved
    fixed, wanted = resolved
    taken, by_others = _taken(ssn, state, task, node)
    labels = node.labels
    out: list[ClaimAllocation] = []
    for claim in fixed:
        other = by_others.get(claim.key)
        if other is not None:
            if other.node and other.node != node.name:
                return NOT_AVAILABLE
            out.append(ClaimAllocation(claim=claim.name, devices=other.devices, node=other.node))
            continue
        if claim.node and claim.node != node.name:
            return NOT_AVAILABLE
        if claim.node_selector and not any(
            selectors.node_term_matches(t, labels) for t in claim.node_selector
        ):
            return NOT_AVAILABLE
        if _full(claim, task):
            return CLAIM_IN_USE
        out.append(ClaimAllocation(claim=claim.name, node=claim.node))
    pending = [
        w
        for w in wanted
        if w.key not in by_others and not (w.resource and plugin_serves(node.alloc_scalars, w.resource))
    ]
    for w in wanted:
        other = by_others.get(w.key)
        if other is not None:
            if other.node and other.node != node.name:
                return NOT_AVAILABLE
            out.append(msgspec.structs.replace(other, extended=()))
    if pending:
        devices = _devices(state, node.name, labels)
        found = _Search(state, devices, state.allocated | taken).run(pending)
        if isinstance(found, str):
            return found
        for w, results in zip(pending, found, strict=True):
            local = any(c.local for c in devices if c.id in {r.id for r in results})
            out.append(
                ClaimAllocation(
                    claim=w.name,
                    devices=tuple(results),
                    node=node.name if local or not results else _shared_node(state, results, node.name),
                    extended=w.requests if w.extended else (),
                )
            )
    state.decided.setdefault(task.key, {})[node.name] = tuple(sorted(out, key=lambda a: a.claim))
    return None


def decided(ssn: Session, task: TaskState, node: str) -> tuple[ClaimAllocation, ...]:
    """What the pod's claims got on `node` (empty for a pod without any)."""
    if not task.pod.resource_claims:
        return ()
    state = _state.get(ssn)
    if state is None:
        return ()
    return state.decided.get(task.key, {}).get(node, ())


def _shared_node(state: _State, results: Sequence[DeviceResult], node: str) -> str:
    """The node an allocation of cluster-wide devices is for: any node ("") when every device is in an
    all-nodes slice; else this one (a node-selector slice's selector is not carried: Kairos pins it)."""
    pools = {(s.driver, s.pool) for s in state.shared if s.all_nodes}
    return "" if all((r.driver, r.pool) in pools for r in results) else node


def _full(claim: ResourceClaim, task: TaskState) -> bool:
    mine = {task.pod.uid, task.pod.name} - {""}
    return len(claim.reserved_for) >= RESERVED_FOR_MAX and not mine & set(claim.reserved_for)


def _resolve(state: _State, task: TaskState) -> str | tuple[list[ResourceClaim], list[_Wanted]]:
    """The pod's allocated claims and those to allocate, or why the pod fits no node."""
    namespace = task.pod.namespace
    fixed: list[ResourceClaim] = []
    wanted: list[_Wanted] = []
    for entry in task.pod.resource_claims:
        if entry.device_class:
            name = extended_claim_name(task.pod.name)
            existing = state.claims.get(f"{namespace}/{name}")
            if existing is not None and existing.allocated:
                fixed.append(existing)
                continue
            request = DeviceRequest(
                name=_request_name(entry.name), device_class=entry.device_class, count=entry.count
            )
            problem = _class_problem(state, name, "spec.devices.requests[0].exactly.deviceClassName", request)
            if problem:
                return problem
            wanted.append(
                _Wanted(name, f"{namespace}/{name}", (request,), (), extended=True, resource=entry.name)
            )
            continue
        if not entry.claim:
            template = state.templates.get(f"{namespace}/{entry.template}")
            if template is None:
                return template_not_found(entry.template)
            if template.problem:
                return template.problem
            return not_created(entry.name, entry.template)
        claim = state.claims.get(f"{namespace}/{entry.claim}")
        if claim is None:
            return not_found(entry.claim)
        if claim.problem:
            return claim.problem
        if claim.deleting:
            return f'resourceclaim "{entry.claim}" is being deleted'
        if not entry.template:
            wrong = shared_gpu_claim_queue(claim, task.job.queue)
            if wrong:
                return wrong
        if claim.allocated:
            fixed.append(claim)
            continue
        for i, request in enumerate(claim.requests):
            if request.admin_access and namespace not in state.admin_namespaces:
                return admin_access_refused(claim.name, i)
            if request.first_available:
                for j, sub in enumerate(request.first_available):
                    at = f"spec.devices.requests[{i}].firstAvailable[{j}].deviceClassName"
                    problem = _class_problem(state, claim.name, at, sub)
                    if problem:
                        return problem
            else:
                at = f"spec.devices.requests[{i}].exactly.deviceClassName"
                problem = _class_problem(state, claim.name, at, request)
                if problem:
                    return problem
        wanted.append(_Wanted(claim.name, claim.key, claim.requests, claim.constraints))
    return fixed, wanted


def _request_name(resource: str) -> str:
    """A DNS label for a KEP-5004 claim's request, from the extended resource's name."""
    text = "".join(ch if ch.isalnum() else "-" for ch in resource.lower()).strip("-")
    return text[:63].strip("-") or "request"


def _class_problem(state: _State, claim: str, at: str, request: DeviceRequest) -> str | None:
    device_class = state.classes.get(request.device_class)
    if device_class is None:
        return class_not_found(claim, at, request.device_class)
    return device_class.problem or None


def _taken(
    ssn: Session, state: _State, task: TaskState, node: NodeState
) -> tuple[frozenset[DeviceId], dict[str, ClaimAllocation]]:
    """The devices other pods of the session got on the node they are placed on now that `node` may
    reach, and the claims they allocated there (a claim shared with this pod is then allocated for it too).

    Without cluster-wide slices a node reaches only its own devices, which only pods placed on it can
    hold: the pods on `node` are walked, and the other users of this pod's claims (`_State.users`), not
    every pod placed so far (a walk once per pod over all of them, quadratic in a session's pods)."""
    if state.shared:
        return _taken_anywhere(ssn, state, task)
    taken: set[DeviceId] = set()
    for entry in node.tasks.values():
        other = entry.task
        if other is task or other.status not in ACTIVE_ALLOCATED:
            continue
        for allocation in state.decided.get(other.key, {}).get(node.name, ()):
            taken.update(r.id for r in allocation.devices if not r.admin_access)
    return frozenset(taken), _shared_claims(state, task)


def _shared_claims(state: _State, task: TaskState) -> dict[str, ClaimAllocation]:
    """The pod's claims another pod of the session allocated on the node it is placed on now."""
    namespace = task.pod.namespace
    out: dict[str, ClaimAllocation] = {}
    for entry in task.pod.resource_claims:
        if not entry.claim:
            continue
        key = f"{namespace}/{entry.claim}"
        for other in state.users.get(key, ()):
            if other is task or other.node is None or other.status not in ACTIVE_ALLOCATED:
                continue
            for allocation in state.decided.get(other.key, {}).get(other.node, ()):
                if allocation.claim == entry.claim and allocation.devices:
                    out[key] = allocation
    return out


def _taken_anywhere(
    ssn: Session, state: _State, task: TaskState
) -> tuple[frozenset[DeviceId], dict[str, ClaimAllocation]]:
    """`_taken` with cluster-wide slices: the devices every other placed pod of the session got on its
    node, and the claims they allocated there."""
    generation = ssn.cluster.generation
    key, seen, cached, claims = state.taken
    if key == task.key and seen == generation:
        return cached, claims
    taken: set[DeviceId] = set()
    allocated: dict[str, ClaimAllocation] = {}
    namespace = task.pod.namespace
    mine = {e.claim for e in task.pod.resource_claims if e.claim}
    for other, _, allocations in placed_decisions(ssn, task, state.decided):
        for allocation in allocations:
            taken.update(r.id for r in allocation.devices if not r.admin_access)
            if other.pod.namespace == namespace and allocation.claim in mine and allocation.devices:
                allocated[f"{namespace}/{allocation.claim}"] = allocation
    result = frozenset(taken)
    state.taken = (task.key, generation, result, allocated)
    return result, allocated


def _devices(state: _State, node: str, labels: Mapping[str, str]) -> list[_Candidate]:
    cached = state.devices.get(node)
    if cached is not None:
        return cached
    out: list[_Candidate] = []
    for s in state.local.get(node, ()):
        out += [_Candidate((s.driver, s.pool, d.name), s.driver, s.pool, d, True) for d in s.devices]
    for s in state.shared:
        if s.all_nodes or any(selectors.node_term_matches(t, labels) for t in s.node_selector):
            out += [_Candidate((s.driver, s.pool, d.name), s.driver, s.pool, d, False) for d in s.devices]
    state.devices[node] = out
    return out


# --- the allocator ----------------------------------------------------------------------------------------
class _ExhaustedError(Exception):
    pass


class _CelFailureError(Exception):
    pass


class _Search:
    """One allocation of a pod's unallocated claims from one node's devices: a depth-first search over
    the claims' requests in order, each device choice undone when what follows cannot be allocated."""

    def __init__(self, state: _State, devices: list[_Candidate], busy: frozenset[DeviceId]) -> None:
        self.state = state
        self.devices = devices
        self.busy = busy
        self.used: set[DeviceId] = set()
        self.steps = 0
        self.slots: list[tuple[int, DeviceRequest]] = []
        self.claims: list[_Wanted] = []
        self.results: list[list[DeviceResult]] = []
        self.values: list[dict[int, tuple[object, int]]] = []
        """Per claim: constraint index -> (the value its devices share, how many devices fixed it)."""

    def run(self, claims: Sequence[_Wanted]) -> list[list[DeviceResult]] | str:
        self.claims = list(claims)
        self.results = [[] for _ in claims]
        self.values = [{} for _ in claims]
        self.slots = [(ci, r) for ci, w in enumerate(claims) for r in w.requests]
        try:
            if self._solve(0):
                return self.results
        except _ExhaustedError:
            return CANNOT_ALLOCATE
        except _CelFailureError as exc:
            return str(exc)
        return CANNOT_ALLOCATE

    def _solve(self, pos: int) -> bool:
        if pos == len(self.slots):
            return True
        ci, request = self.slots[pos]
        if request.first_available:
            alternatives = [(f"{request.name}/{sub.name}", sub) for sub in request.first_available]
        else:
            alternatives = [(request.name, request)]
        for name, alt in alternatives:
            candidates = [c for c in self.devices if self._fits(ci, name, alt, c)]
            admin = alt.admin_access
            if alt.mode == ALL:
                if not candidates or (
                    not admin and any(c.id in self.busy or c.id in self.used for c in candidates)
                ):
                    continue
                taken: list[_Candidate] = []
                for c in candidates:
                    if not self._take(ci, name, c, admin):
                        break
                    taken.append(c)
                else:
                    if self._solve(pos + 1):
                        return True
                for c in reversed(taken):
                    self._untake(ci, c)
                continue
            # Admin access: devices in use or not, and left free for every other request (upstream).
            free = candidates if admin else [c for c in candidates if c.id not in self.busy]
            if len(free) >= alt.count and self._pick(pos, ci, name, free, 0, alt.count, admin):
                return True
        return False

    def _pick(
        self, pos: int, ci: int, name: str, free: list[_Candidate], start: int, left: int, admin: bool
    ) -> bool:
        for i in range(start, len(free) - left + 1):
            c = free[i]
            if (not admin and c.id in self.used) or not self._take(ci, name, c, admin):
                continue
            done = (
                self._solve(pos + 1) if left == 1 else self._pick(pos, ci, name, free, i + 1, left - 1, admin)
            )
            if done:
                return True
            self._untake(ci, c)
        return False

    def _take(self, ci: int, request: str, c: _Candidate, admin: bool = False) -> bool:
        self.steps += 1
        if self.steps > SEARCH_BUDGET:
            raise _ExhaustedError
        values = self.values[ci]
        fixed: list[int] = []
        for k, constraint in enumerate(self.claims[ci].constraints):
            if not _applies(constraint, request):
                continue
            attribute = c.device.attributes.get(_attribute_name(constraint.match_attribute, c.driver))
            value = None if attribute is None else attribute.value
            if value is None:
                break
            held = values.get(k)
            if held is not None and held[0] != value:
                break
            fixed.append(k)
        else:
            for k in fixed:
                attribute = c.device.attributes[
                    _attribute_name(self.claims[ci].constraints[k].match_attribute, c.driver)
                ]
                value, n = values.get(k, (attribute.value, 0))
                values[k] = (value, n + 1)
            if not admin:
                self.used.add(c.id)
            self.results[ci].append(
                DeviceResult(
                    request=request,
                    driver=c.driver,
                    pool=c.pool,
                    device=c.device.name,
                    admin_access=admin,
                    cluster_wide=not c.local,
                )
            )
            return True
        return False

    def _untake(self, ci: int, c: _Candidate) -> None:
        result = self.results[ci].pop()
        if not result.admin_access:
            self.used.discard(c.id)
        values = self.values[ci]
        for k, constraint in enumerate(self.claims[ci].constraints):
            if k in values and _applies(constraint, result.request):
                value, n = values[k]
                if n <= 1:
                    del values[k]
                else:
                    values[k] = (value, n - 1)

    def _fits(self, ci: int, request: str, alt: DeviceRequest, c: _Candidate) -> bool:
        device_class = self.state.classes[alt.device_class]
        for i, expression in enumerate(device_class.selectors):
            if not self._holds(expression, c, f"class {device_class.name}: selector #{i}"):
                return False
        if not alt.selectors:
            return True
        namespace = self.claims[ci].key.split("/", 1)[0]
        for i, expression in enumerate(alt.selectors):
            where = f"claim {self.claims[ci].key}, request {request}: selector #{i}"
            if not self._holds(expression, c, where, namespace):
                return False
        return True

    def _holds(self, expression: str, c: _Candidate, where: str, tenant: str | None = None) -> bool:
        """Whether the selector holds for the device; a tenant's (a claim's namespace; None for a
        DeviceClass, which only the cluster's administrators write) evaluations count against its budget."""
        key = (expression, c.id)
        known = self.state.matched.get(key)
        if known is None:
            if tenant is not None and not _within_budget(self.state.selector_steps.get(tenant)):
                # Not remembered per (selector, device): another namespace's claim with the same
                # selector still gets its own evaluation.
                raise _CelFailureError(f"{where}: CEL runtime error: {dra_cel.COST_EXCEEDED} ({OVER_BUDGET})")
            activation = self.state.activations.get(c.id)
            if activation is None:
                activation = dra_cel.activation(c.driver, c.device)
                self.state.activations[c.id] = activation
            verdict, steps = dra_cel.counted_match(expression, activation)
            known = str(verdict) if isinstance(verdict, dra_cel.CelError) else verdict
            self.state.matched[key] = known
            if tenant is not None:
                spent = self.state.selector_steps.setdefault(tenant, [0, 0])
                spent[0] += steps
                spent[1] += 1
        if isinstance(known, str):
            raise _CelFailureError(f"{where}: {known}")
        return known


TENANT_FREE_STEPS = 20 * dra_cel.MAX_COST
"""Selector steps a namespace's claims may spend in one session beyond `TENANT_STEPS_PER_EVALUATION` per
evaluation: about a second of CPU, whatever its selectors."""
TENANT_STEPS_PER_EVALUATION = 200
"""Steps per evaluation a namespace's selectors may average without limit: a real driver's selector takes
20 to 60, one comprehension over a device's attributes about 110 (`tests/unit/test_dra_cel_limits.py`)."""
OVER_BUDGET = "the namespace's selectors spent their budget for this scheduling cycle"


def _within_budget(spent: list[int] | None) -> bool:
    """Whether a namespace that has spent `spent` ([steps, evaluations]) may evaluate once more.

    Each evaluation stops at `dra_cel.MAX_COST` steps, but a cycle may evaluate a selector on every device
    of the cluster (40,000 GPUs at 5,000 nodes): selectors kept just under that bound would then stop
    scheduling for everyone for minutes. A namespace's claims get `TENANT_STEPS_PER_EVALUATION` per
    evaluation on average plus `TENANT_FREE_STEPS`; past that, its selectors fail with the cost error for
    the rest of the session, which holds only its pods, and the next cycle starts afresh."""
    if spent is None:
        return True
    steps, evaluations = spent
    return steps <= TENANT_FREE_STEPS + TENANT_STEPS_PER_EVALUATION * evaluations


def _applies(constraint: ClaimConstraint, request: str) -> bool:
    return (
        not constraint.requests
        or request in constraint.requests
        or request.split("/", maxsplit=1)[0] in constraint.requests
    )


def _attribute_name(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"
