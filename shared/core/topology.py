"""Topology-aware placement (KAI `topology` plugin): candidate node sets for a gang, preferred domains.

A topology is a list of node label keys, coarsest first; nodes that carry every key form a tree of domains
(root, then one domain per distinct label prefix at each level, named by the label values joined with
dots, e.g. `zone1.rack2`). For a sub-group set or pod set with a constraint, `subset_nodes`:

1. takes the lowest domain that holds every candidate node (not below the preferred level) and counts,
   inside it only, the idle-or-releasing resources of every domain and, when the pods are alike, how many
   of the pods each domain could take (per node: how many copies of the largest pod fit);
2. gives up with "not enough resources in the cluster / in <domain>" when that domain cannot take them;
3. sorts the tree, most packed first (largest share of the domain's free resources the pods would use),
   down to the preferred level (else the required level), and when there is a preferred level scores the
   nodes of each preferred-level domain by the domain's rank, `floor(10 * rank / count) * 100000`
   (KAI gives the *last* domain of the sorted order the highest score);
4. keeps the domains from the preferred level up to the required level (up to the root when only a
   preferred level is given) that can take the pods, restricted to the required-level domains that
   already hold running pods of these pod sets, and returns their nodes (bottom level first, each level
   in tree order); when none can, the job gets one error per domain at the top level and a summary.

Scores last for one `allocate_job` call (`pre_job_allocation` clears them) and are looked up from the
task's pod set up through its parent sub-group sets.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.core.tasks import CPU, DEFAULT_POD_SET, GPU, MEM, PODS
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import JobState, PodSetState, TaskState
    from shared.model import SubGroupSet, Topology, TopologyConstraint

POD_SCHEDULING_ERRORS = "PodSchedulingErrors"
UNSCHEDULABLE_WORKLOAD = "Not enough resources for the workload"
ROOT = "root"
TOPOLOGY_SCORE = 100000.0
PODS_RESOURCE = "pods"
NOT_IN_DOMAIN_RATIO = 1000.0
EPS = 1e-9


@dataclass
class _Res:
    """KAI `Resource`: millicores, bytes, GPUs (whole or fractional) and countable scalars (pods, MIG,
    extended resources, huge pages, ephemeral storage)."""

    cpu: float = 0.0
    mem: float = 0.0
    gpus: float = 0.0
    scalars: dict[str, float] = field(default_factory=dict)

    def add(self, other: _Res) -> None:
        self.cpu += other.cpu
        self.mem += other.mem
        self.gpus += other.gpus
        for k, v in other.scalars.items():
            self.scalars[k] = self.scalars.get(k, 0.0) + v


@dataclass(eq=False)
class _Domain:
    id: str
    level: str
    children: list[_Domain] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    node_set: set[int] = field(default_factory=set)
    allocatable: int = -1
    free: _Res = field(default_factory=_Res)

    def add_child(self, child: _Domain) -> None:
        if all(c.id != child.id for c in self.children):
            self.children.append(child)

    def add_node(self, idx: int) -> None:
        if idx not in self.node_set:
            self.node_set.add(idx)
            self.nodes.append(idx)


@dataclass(eq=False)
class _Tree:
    name: str
    levels: tuple[str, ...]
    root: _Domain
    by_level: dict[str, dict[str, _Domain]]
    member: npt.NDArray[np.bool_]


@dataclass
class _State:
    trees: dict[str, _Tree] = field(default_factory=dict)
    job_key: str | None = None
    scores: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)


_STATES: weakref.WeakKeyDictionary[Session, _State] = weakref.WeakKeyDictionary()


def _state(ssn: Session) -> _State:
    st = _STATES.get(ssn)
    if st is None:
        st = _State()
        _STATES[ssn] = st
    return st


# --- the tree (KAI initializeTopologyTree) ---------------------------------------------------------------
def _build_tree(ssn: Session, topo: Topology) -> _Tree:
    levels = tuple(topo.levels)
    root = _Domain(ROOT, ROOT)
    by_level: dict[str, dict[str, _Domain]] = {ROOT: {ROOT: root}}
    member = np.zeros(len(ssn.cluster.order), dtype=bool)
    for node in ssn.cluster.order:
        labels = node.labels
        if not levels or any(level not in labels for level in levels):
            continue
        member[node.idx] = True
        child: _Domain | None = None
        for li in range(len(levels) - 1, -1, -1):
            level = levels[li]
            did = ".".join(labels[lv] for lv in levels[: li + 1])
            domains = by_level.setdefault(level, {})
            dom = domains.get(did)
            if dom is None:
                dom = _Domain(did, level)
                domains[did] = dom
            dom.add_node(node.idx)
            if child is not None:
                dom.add_child(child)
            child = dom
        assert child is not None
        root.add_child(child)
        root.add_node(node.idx)
    return _Tree(topo.name, levels, root, by_level, member)


def _tree(ssn: Session, name: str) -> _Tree | None:
    st = _state(ssn)
    tree = st.trees.get(name)
    if tree is None:
        topo = ssn.topologies.get(name)
        if topo is None:
            return None
        tree = _build_tree(ssn, topo)
        st.trees[name] = tree
    return tree


# --- resources -----------------------------------------------------------------------------------------
def _task_res(task: TaskState) -> _Res:
    """A pod's request as KAI sums it (`AddResourceRequirements`): GPUs() plus MIG, the other scalars and
    one pod slot."""
    scalars: dict[str, float] = {PODS_RESOURCE: 1.0}
    for name, cnt in task.gpu.mig.items():
        scalars[name] = scalars.get(name, 0.0) + float(cnt)
    for name, amount in task.scalars.items():
        scalars[name] = scalars.get(name, 0.0) + amount
    return _Res(task.cpu, task.mem, task.requested_gpus, scalars)


def _node_free(ssn: Session, idx: int) -> _Res:
    c = ssn.cluster
    node = c.order[idx]
    scalars: dict[str, float] = {PODS_RESOURCE: float(c.idle[PODS][idx] + c.releasing[PODS][idx])}
    for name in set(node.idle_scalars) | set(node.releasing_scalars):
        scalars[name] = node.idle_scalars.get(name, 0.0) + node.releasing_scalars.get(name, 0.0)
    return _Res(
        float(c.idle[CPU][idx] + c.releasing[CPU][idx]),
        float(c.idle[MEM][idx] + c.releasing[MEM][idx]),
        float(c.idle[GPU][idx] + c.releasing[GPU][idx]),
        scalars,
    )


class _Free:
    """Every node's idle-or-releasing resources, read from the arrays once per placement: summing them per
    domain then costs a list lookup per node instead of a `_node_free` (the same values, added in the same
    order, so the sums are identical). Of the nodes' scalars only those the pods ask for are summed: no
    other is read, and most nodes report some (ephemeral storage, at least)."""

    def __init__(self, ssn: Session, tasks: list[TaskState]) -> None:
        c = ssn.cluster
        self.scalar_names: frozenset[str] = frozenset(n for t in tasks for n in (*t.gpu.mig, *t.scalars))
        self.cpu: list[float] = (c.idle[CPU] + c.releasing[CPU]).tolist()
        self.mem: list[float] = (c.idle[MEM] + c.releasing[MEM]).tolist()
        self.gpus: list[float] = (c.idle[GPU] + c.releasing[GPU]).tolist()
        self.pods: list[float] = (c.idle[PODS] + c.releasing[PODS]).tolist()


def _calc_free(ssn: Session, dom: _Domain, free: _Free) -> _Res:
    if not dom.children:
        total = dom.free
        order = ssn.cluster.order
        for idx in dom.nodes:
            total.cpu += free.cpu[idx]
            total.mem += free.mem[idx]
            total.gpus += free.gpus[idx]
            total.scalars[PODS_RESOURCE] = total.scalars.get(PODS_RESOURCE, 0.0) + free.pods[idx]
            node = order[idx]
            if free.scalar_names and (node.idle_scalars or node.releasing_scalars):
                for name in free.scalar_names:
                    if name not in node.idle_scalars and name not in node.releasing_scalars:
                        continue
                    v = node.idle_scalars.get(name, 0.0) + node.releasing_scalars.get(name, 0.0)
                    total.scalars[name] = total.scalars.get(name, 0.0) + v
        return total
    for child in dom.children:
        dom.free.add(_calc_free(ssn, child, free))
    return dom.free


def _alike(tasks: list[TaskState]) -> bool:
    """KAI `useRepresentorPodsAccounting`: all or none use GPUs, and every pod asks for the same scalars."""
    using_gpu = sum(1 for t in tasks if t.requested_gpus > 0)
    if using_gpu not in (0, len(tasks)):
        return False
    counts: dict[str, int] = {}
    for t in tasks:
        for name in (*t.gpu.mig, *t.scalars):
            counts[name] = counts.get(name, 0) + 1
    return all(n == len(tasks) for n in counts.values())


@dataclass
class _MaxPod:
    """The largest request among the pods (KAI's representor pod), per resource."""

    cpu: float
    mem: float
    whole: float
    shared_devices: int
    shared: bool
    scalars: dict[str, float]
    """MIG instances and the other scalars (`Pod.scalars`)."""


def _max_pod(tasks: list[TaskState]) -> _MaxPod:
    scalars: dict[str, float] = {}
    for t in tasks:
        for name, cnt in (*t.gpu.mig.items(), *t.scalars.items()):
            scalars[name] = max(scalars.get(name, 0.0), float(cnt))
    shared = [t for t in tasks if t.is_shared]
    return _MaxPod(
        cpu=max(t.cpu for t in tasks),
        mem=max(t.mem for t in tasks),
        whole=max(t.whole_gpus for t in tasks),
        shared_devices=max((t.gpu.devices for t in shared), default=0),
        shared=bool(shared),
        scalars=scalars,
    )


def _node_accommodation(ssn: Session, rep: _MaxPod, sample: TaskState | None, idx: int, n_tasks: int) -> int:
    """KAI `calcNodeAccommodation`: how many copies of the largest pod fit on idle-or-releasing resources."""
    if rep.cpu <= 0 and rep.mem <= 0 and rep.whole <= 0 and rep.shared_devices <= 0 and not rep.scalars:
        return n_tasks
    c = ssn.cluster
    node = c.order[idx]
    bounds: list[float] = [c.idle[PODS][idx] + c.releasing[PODS][idx]]
    for r, need in ((CPU, rep.cpu), (MEM, rep.mem), (GPU, rep.whole)):
        if need > 0:
            bounds.append((c.idle[r][idx] + c.releasing[r][idx] + EPS) / need)
    for name, cnt in rep.scalars.items():
        if cnt > 0:
            avail = node.idle_scalars.get(name, 0.0) + node.releasing_scalars.get(name, 0.0)
            bounds.append((avail + EPS) / cnt)
    if rep.shared and rep.shared_devices > 0 and sample is not None:
        whole = math.floor(c.idle[GPU][idx] + c.releasing[GPU][idx] + EPS)
        if not node.valid_portion(sample):
            return 0
        matching = sum(1 for g in node.groups if node.task_fits_group(sample, g))
        bounds.append((whole + matching) / rep.shared_devices)
    return max(0, math.floor(min(bounds)))


def _accommodations(ssn: Session, rep: _MaxPod, sample: TaskState | None, n_tasks: int) -> list[int]:
    """`_node_accommodation` of every node; one vector expression when only CPU, memory, whole GPUs and
    pod slots bound it (the same operations per node, so the same answers)."""
    c = ssn.cluster
    if rep.scalars or (rep.shared and rep.shared_devices > 0 and sample is not None):
        return [_node_accommodation(ssn, rep, sample, idx, n_tasks) for idx in range(len(c.order))]
    if rep.cpu <= 0 and rep.mem <= 0 and rep.whole <= 0 and rep.shared_devices <= 0:
        return [n_tasks] * len(c.order)
    bound = c.idle[PODS] + c.releasing[PODS]
    for r, need in ((CPU, rep.cpu), (MEM, rep.mem), (GPU, rep.whole)):
        if need > 0:
            bound = np.minimum(bound, (c.idle[r] + c.releasing[r] + EPS) / need)
    counts: list[int] = np.maximum(0, np.floor(bound)).astype(np.int64).tolist()
    return counts


def _calc_allocatable(dom: _Domain, accommodation: list[int]) -> int:
    dom.allocatable = 0
    if not dom.children:
        for idx in dom.nodes:
            dom.allocatable += accommodation[idx]
        return dom.allocatable
    for child in dom.children:
        dom.allocatable += _calc_allocatable(child, accommodation)
    return dom.allocatable


def _quantity_value(milli: float) -> int:
    """`resource.NewMilliQuantity(v).Value()`: whole units, rounded up."""
    return math.ceil(int(milli) / 1000)


def _ratio(req: _Res, dom: _Domain) -> float:
    """KAI `getJobRatioToFreeResources`: the largest share of the domain's free resources the pods take."""
    free = dom.free
    ratio = 0.0
    if req.gpus > 0:
        ratio = max(ratio, req.gpus / free.gpus if free.gpus > 0 else math.inf)
    pairs: list[tuple[int, int]] = [
        (_quantity_value(req.cpu), _quantity_value(free.cpu)),
        (int(req.mem), int(free.mem)),
    ]
    for name, q in req.scalars.items():
        if name == PODS_RESOURCE:
            continue
        pairs.append((_quantity_value(q), _quantity_value(free.scalars.get(name, 0.0))))
    for want, have in pairs:
        if want == 0:
            continue
        ratio = max(ratio, NOT_IN_DOMAIN_RATIO if have == 0 else want / have)
    return ratio


# --- fit errors ----------------------------------------------------------------------------------------
def _ftoa(value: float, digits: int = 3) -> str:
    """go-humanize `FtoaWithDigits`: fixed digits, trailing zeros and dot removed."""
    s = f"{value:.{digits}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def _insufficient_details(domain_id: str, req: _Res, avail: _Res) -> list[str]:
    """KAI `NewTopologyInsufficientResourcesError` detailed messages."""
    out: list[str] = []
    migs = {k: v for k, v in req.scalars.items() if k != PODS_RESOURCE and "mig-" in k}
    if migs:
        for name in sorted(migs):
            have = int(avail.scalars.get(name, 0.0))
            if have < int(migs[name]):
                out.append(
                    f"{domain_id} didn't have enough resource: {name}, requested: {int(migs[name])}, "
                    f"available: {have}"
                )
    elif req.gpus > avail.gpus:
        out.append(
            f"{domain_id} didn't have enough resource: GPUs, requested: {req.gpus:.3g}, "
            f"available: {avail.gpus:.3g}"
        )
    if int(req.cpu) > int(avail.cpu):
        out.append(
            f"{domain_id} didn't have enough resources: CPU cores, requested: {_ftoa(req.cpu / 1000)}, "
            f"available: {_ftoa(avail.cpu / 1000)}"
        )
    if req.mem > avail.mem:
        out.append(
            f"{domain_id} didn't have enough resources: memory, requested: {_ftoa(req.mem / 1e9)}, "
            f"available: {_ftoa(avail.mem / 1e9)}"
        )
    for name in sorted(req.scalars):
        have = int(avail.scalars.get(name, 0.0))
        if have < int(req.scalars[name]):
            out.append(
                f"{domain_id} didn't have enough resource: {name}, requested: {int(req.scalars[name])}, "
                f"available: {have}"
            )
    return out


def _domain_fit_error(name: str, dom: _Domain, req: _Res, count: int) -> str | None:
    """KAI `checkJobDomainFit`; the detailed message of the `TopologyFitError`, or None when it fits."""
    if dom.allocatable != -1:
        if dom.allocatable >= count:
            return None
        details = [f"node-group {dom.id} can allocate only {dom.allocatable} of {count} required pods"]
    else:
        if _ratio(req, dom) <= 1.0:
            return None
        details = _insufficient_details(dom.id, req, dom.free)
    text = ", ".join(details)
    if name and name != DEFAULT_POD_SET:
        text = f"subgroup {name}: {text}"
    return f"<{dom.id}>: {text}"


def _no_match(job: JobState, name: str, tree: _Tree, constraint: TopologyConstraint, suffix: str = "") -> str:
    who = f"job <{job.namespace}/{job.name}>"
    if name and name != DEFAULT_POD_SET:
        who += f", subgroup {name}"
    tail = f": {suffix}" if suffix else ""
    return (
        f"topology {tree.name}, requirement {constraint.required_level or ''} couldn't be satisfied for "
        f"{who}{tail}"
    )


# --- ordering -----------------------------------------------------------------------------------------
def _sort_tree(req: _Res, dom: _Domain, max_level: str) -> None:
    """KAI `sortTree`: children most packed first (ties by id), recursively down to `max_level`."""
    if not max_level:
        return
    ratios = {c.id: _ratio(req, c) for c in dom.children}
    dom.children.sort(key=lambda c: (-ratios[c.id], c.id))
    if dom.level == max_level:
        return
    for child in dom.children:
        _sort_tree(req, child, max_level)


def _level_domains(dom: _Domain, level: str) -> list[_Domain]:
    if dom.level == level:
        return [dom]
    out: list[_Domain] = []
    for child in dom.children:
        out.extend(_level_domains(child, level))
    return out


def _node_scores(ssn: Session, dom: _Domain, level: str) -> npt.NDArray[np.float64]:
    """KAI `calculateNodeScores`: the i-th of n preferred-level domains scores floor((i+1)/n*10) units."""
    scores = np.zeros(len(ssn.cluster.order))
    ranked = _level_domains(dom, level)
    n = len(ranked)
    for i, d in enumerate(ranked):
        value = math.floor(float(i + 1) / float(n) * 10) * TOPOLOGY_SCORE
        for idx in d.nodes:
            scores[idx] = value
    return scores


def _reverse_level_order(root: _Domain) -> list[_Domain]:
    levels: list[list[_Domain]] = []
    queue = [root]
    while queue:
        levels.append(queue)
        queue = [child for d in queue for child in d.children]
    return [d for level in reversed(levels) for d in level]


def _relevant_levels(tree: _Tree, constraint: TopologyConstraint) -> list[str] | None:
    """Levels from the preferred one up to the required one (or the root); None on a config error."""
    required = constraint.required_level or ""
    preferred = constraint.preferred_level or ""
    if not required and not preferred:
        return None
    bottom_up = [*reversed(tree.levels), ROOT]
    out: list[str] = []
    found_required = found_preferred = False
    for level in bottom_up:
        if level == preferred:
            found_preferred = True
        if level == required:
            found_required = True
        if found_preferred or found_required:
            out.append(level)
        if found_required:
            break
    if (required and not found_required) or (preferred and not found_preferred):
        return None
    return out


def _subtree(dom: _Domain, into: dict[str, dict[str, _Domain]]) -> None:
    into.setdefault(dom.level, {})
    for child in dom.children:
        _subtree(child, into)
    into[dom.level][dom.id] = dom


def _lowest_common(tree: _Tree, valid: list[int], ssn: Session, preferred: str) -> _Domain | None:
    """KAI `lowestCommonDomainID`: the deepest domain holding every valid node, not below `preferred`."""
    parts: list[str] = []
    order = ssn.cluster.order
    for level in tree.levels:
        value = ""
        all_match = True
        for idx in valid:
            new = order[idx].labels[level]
            if value == "":
                value = new
            if new != value:
                all_match = False
                break
        if not all_match or value == "":
            break
        parts.append(value)
        if preferred and preferred == level:
            break
    if not parts:
        return tree.root
    return tree.by_level.get(tree.levels[len(parts) - 1], {}).get(".".join(parts))


# --- level aliases (KAI v0.17; resolved when the session opens: `shared.model.topology_aliases`) ---------
def _unknown_level(
    tree: _Tree, topo: Topology | None, constraint: TopologyConstraint, name: str
) -> str | None:
    """KAI's topology constraint error for a required or preferred level the topology does not have (by
    node label or alias; the root is a level too), with the PodGroup field that names it and the levels
    it could name; None when both are known."""
    known = {*tree.levels, ROOT}
    root = name in ("", ROOT, DEFAULT_POD_SET)
    who = "workload" if root else f"sub-group {name}"
    base = "spec.topologyConstraint" if root else f"spec.subGroups[name={name}].topologyConstraint"
    aliases = {label: alias for alias, label in (topo.aliases if topo is not None else {}).items()}
    choices = ", ".join(f"{lv} (alias {aliases[lv]})" if lv in aliases else lv for lv in tree.levels)
    for kind, attribute, level in (
        ("required", "requiredTopologyLevel", constraint.required_level),
        ("preferred", "preferredTopologyLevel", constraint.preferred_level),
    ):
        if level and level not in known:
            return (
                f"topology constraint error: {who} specified '{level}' as the {kind} topology constraint "
                f"level, but the topology tree '{tree.name}' does not contain a level with this name "
                f"({base}.{attribute}; its levels: {choices or 'none'})"
            )
    return None


# --- the plugin hooks ---------------------------------------------------------------------------------
def pre_job_allocation(ssn: Session, job: JobState) -> None:
    """KAI `preJobAllocationFn`: a new job is being placed, forget the previous job's preferred scores."""
    st = _state(ssn)
    st.scores = {}
    st.job_key = job.key


def subset_nodes(
    ssn: Session,
    job: JobState,
    constraint: TopologyConstraint | None,
    tasks: list[TaskState],
    nodes: npt.NDArray[np.bool_],
    name: str,
    pod_sets: list[PodSetState] | None = None,
) -> list[npt.NDArray[np.bool_]]:
    """KAI `subSetNodesFn`: the node sets, best first, on which the sub-group `name` may be placed."""
    if constraint is None or not constraint.topology:
        return [nodes]
    tree = _tree(ssn, constraint.topology)
    if tree is None:
        job.add_fit_error(POD_SCHEDULING_ERRORS, [f"Requested topology {constraint.topology} does not exist"])
        return []
    if not tasks:
        return [nodes]
    unknown = _unknown_level(tree, ssn.topologies.get(constraint.topology), constraint, name)
    if unknown is not None:
        job.add_fit_error(POD_SCHEDULING_ERRORS, [unknown])
        return []

    valid_mask = nodes & tree.member
    valid = [int(i) for i in np.flatnonzero(valid_mask)]
    domain = _lowest_common(tree, valid, ssn, constraint.preferred_level or "")
    if domain is None:
        return []

    for level_domains in tree.by_level.values():
        for d in level_domains.values():
            d.allocatable = -1
            d.free = _Res()
    _calc_free(ssn, domain, _Free(ssn, tasks))
    if _alike(tasks):
        sample = next((t for t in tasks if t.is_shared), None)
        _calc_allocatable(domain, _accommodations(ssn, _max_pod(tasks), sample, len(tasks)))

    req = _Res()
    for t in tasks:
        req.add(_task_res(t))
    count = len(tasks)

    if _domain_fit_error(name, domain, req, count) is not None:
        where = "the cluster" if domain.id == ROOT else domain.id
        job.add_fit_error(
            POD_SCHEDULING_ERRORS,
            [_no_match(job, name, tree, constraint, f"not enough resources in {where} to allocate the job")],
        )
        return []

    preferred = constraint.preferred_level or ""
    required = constraint.required_level or ""
    _sort_tree(req, domain, preferred or required)
    st = _state(ssn)
    if preferred:
        if st.job_key != job.key:
            st.scores = {}
            st.job_key = job.key
        st.scores[name] = _node_scores(ssn, domain, preferred)

    levels = _relevant_levels(tree, constraint)
    if levels is None:
        return []

    sets = pod_sets if pod_sets is not None else []
    candidates: dict[str, dict[str, _Domain]]
    active = [t for ps in sets for t in ps.tasks if t.status in ACTIVE_ALLOCATED]
    if active and required:
        # Domains must agree with where the job's running pods already are (KAI
        # getRelevantDomainsWithAllocatedPods): only required-level domains holding one, and below them.
        occupied = {ssn.cluster.nodes[t.node].idx for t in active if t.node in ssn.cluster.nodes}
        candidates = {}
        for dom in tree.by_level.get(required, {}).values():
            if occupied & dom.node_set:
                _subtree(dom, candidates)
    else:
        candidates = tree.by_level

    fitting: list[_Domain] = []
    top_errors: list[str] = []
    for li, level in enumerate(levels):
        for dom in candidates.get(level, {}).values():
            err = _domain_fit_error(name, dom, req, count)
            if err is not None:
                if li == len(levels) - 1:
                    top_errors.append(err)
                continue
            fitting.append(dom)

    if not fitting:
        for err in top_errors:
            job.add_fit_error(UNSCHEDULABLE_WORKLOAD, [err])
        job.add_fit_error(POD_SCHEDULING_ERRORS, [_no_match(job, name, tree, constraint)])
        return []

    chosen = set(map(id, fitting))
    out: list[npt.NDArray[np.bool_]] = []
    for dom in _reverse_level_order(tree.root):
        if id(dom) not in chosen:
            continue
        mask = np.zeros(len(ssn.cluster.order), dtype=bool)
        if dom.nodes:
            mask[np.array(dom.nodes, dtype=np.intp)] = True
        out.append(mask & valid_mask)
    return out


def _ancestry(job: JobState, pod_set: str) -> list[str]:
    """Names from the task's pod set up to the root sub-group set (KAI's sub-group parent chain)."""

    def walk(group: SubGroupSet, path: list[str]) -> list[str] | None:
        here = [group.name, *path]
        if any(ps.name == pod_set for ps in group.pod_sets):
            return here
        for child in group.children:
            found = walk(child, here)
            if found is not None:
                return found
        return None

    chain = walk(job.root, [])
    if chain is None:
        chain = [job.root.name]
    return [pod_set, *chain]


def preferred_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """KAI `nodeOrderFn`: the preferred-level scores of the task's nearest sub-group that has them."""
    st = _STATES.get(ssn)
    if st is None or not st.scores or st.job_key != task.job.key:
        return None
    for group in _ancestry(task.job, task.pod.sub_group or DEFAULT_POD_SET):
        scores = st.scores.get(group)
        if scores is not None:
            return scores
    return None
