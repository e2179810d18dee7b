"""kube-scheduler's PodTopologySpread: a pod's ``topologySpreadConstraints`` as a node filter and a node score.

KAI has no such plugin; Kairos offers it beyond KAI, with kube-scheduler's rules (``pkg/scheduler/framework/
plugins/podtopologyspread``, re-implemented here):

- Counting. For one constraint of the incoming pod, a pod counts when it is in the pod's namespace, its
  labels match the constraint's selector (no selector: none match) and it holds its node in a status of
  `COUNTED`, which includes pods placed tentatively in this session, so a gang's own pods spread. Only
  nodes that carry every topology key of the pod's constraints of that kind count, and of those only the
  ones the constraint's inclusion policies admit: the pod's node selector and required node affinity
  (``nodeAffinityPolicy: Honor``, the default) and its tolerations of NoSchedule/NoExecute taints
  (``nodeTaintsPolicy: Honor``; Ignore by default). The domains are the topology values of those nodes.
- Filter (``whenUnsatisfiable: DoNotSchedule``). A node without the topology key fails with
  `MISSING_LABEL`. Otherwise placing the pod there must keep ``count(domain) + self - global minimum <=
  maxSkew`` for each constraint, where ``self`` is 1 when the pod matches its own selector and the global
  minimum is the smallest count among the domains, or 0 while there are fewer domains than
  ``minDomains``; else `CONSTRAINTS_NOT_MATCH`. Constraints are checked in the pod's order and the
  first failure is the reason, as kube-scheduler does. Codes as kube-scheduler's
  (`shared.core.plugins.points.Code`): a missing key is UNRESOLVABLE, a skew UNSCHEDULABLE (evicting
  matching pods may lift it).
- Score (``whenUnsatisfiable: ScheduleAnyway``). Per node, the sum over the constraints of ``count(domain)
  * log(domains + 2) + maxSkew - 1`` (kube-scheduler's weighting: a constraint over few domains is not
  drowned by one over many), normalised over the candidate nodes that carry every key to
  ``(max + min - raw) / max`` (1 for all when max is 0; 0 for a node missing a key) and scaled by
  `shared.core.scoring.POD_TOPOLOGY_SPREAD`. kube-scheduler rounds to integers on a 0-100 scale; here the
  values stay floats.

Not carried over: kube-scheduler's cluster-level default constraints (applied to pods that declare none,
with selectors from Services and ReplicaSets, which Kairos does not read), and its shortcut of counting
by owner reference in the score.

Cost. A pod that declares no constraint costs one tuple test. For one that does, counting happens once per
pod and cluster state, not once per node: the per-node match counts of each selector are kept for the
session and recounted only on nodes whose version changed (`ClusterState.versions`), the nodes' domain
indices per topology key and the inclusion masks per node-affinity and toleration signature are built
once, and the per-domain sums are NumPy expressions over all nodes. The filter's answers for every node
are computed in one pass and reused until a node changes.

Private to the core. Called by the predicates filter (`shared.core.predicates.check`, last), which passes
its node-affinity and toleration tests so that this module sits below it (the core's modules form no import
circle), and by the ``podtopologyspread`` plugin's node score (`shared.core.builtin_plugins`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.core.plugins.points import Code, Refusal
from shared.core.scoring import POD_TOPOLOGY_SPREAD
from shared.core.selectors import label_selector_matches
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.core.cluster import ClusterState, NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState
    from shared.model import LabelSelector, TopologySpreadConstraint

CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"

COUNTED = ACTIVE_ALLOCATED
"""The statuses a matching pod counts in: those that hold a node and are not on their way out. kube-scheduler
skips terminating pods (kubernetes#87621); Kairos's Releasing pods are those, and this session's own
evictions."""

NodeTest = Callable[["TaskState", "NodeState"], bool]
"""A node filter's verdict on (pod, node): the predicates' node affinity and toleration tests."""

_OK, _MISSING, _SKEWED = 0, 1, 2
_REASONS = {
    _MISSING: Refusal(MISSING_LABEL, Code.UNRESOLVABLE),
    _SKEWED: Refusal(CONSTRAINTS_NOT_MATCH),
}

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether a pod with `labels` matches the constraint's selector (Kubernetes' label selector rules,
    `shared.core.selectors`; no selector matches nothing)."""
    return selector is not None and label_selector_matches(selector, labels)


# --- what the session keeps ------------------------------------------------------------------------------
SelectorKey = tuple[str, tuple[tuple[str, str], ...], tuple[object, ...]]


@dataclass
class _Matches:
    """One selector in one namespace: the pods it matches (labels do not change within a session) and how
    many of them each node holds, as of the node versions in `versions`."""

    keys: frozenset[str]
    tasks: tuple[TaskState, ...]
    counts: IntArray | None = None
    versions: IntArray | None = None


@dataclass
class _SpreadCache:
    """Per session: pods by namespace and by label, each selector's matches, each topology key's domain
    index per node, inclusion masks per pod signature, and the last pod's filter answers."""

    by_namespace: dict[str, list[TaskState]] | None = None
    by_label: dict[tuple[str, str, str], list[TaskState]] = field(default_factory=dict)
    matches: dict[SelectorKey, _Matches] = field(default_factory=dict)
    domains: dict[str, tuple[IntArray, int]] = field(default_factory=dict)
    masks: dict[tuple[object, ...], BoolArray] = field(default_factory=dict)
    tainted: list[int] | None = None
    last_filter: tuple[TaskState, int, npt.NDArray[np.int8]] | None = None


# Keyed weakly by the session: the cache lives exactly as long as the session that reads it.
_CACHES: weakref.WeakKeyDictionary[Session, _SpreadCache] = weakref.WeakKeyDictionary()


def _cache(ssn: Session) -> _SpreadCache:
    found = _CACHES.get(ssn)
    if found is None:
        found = _CACHES[ssn] = _SpreadCache()
    return found


def _stamp(cluster: ClusterState) -> int:
    """Changes whenever any node's pods change: node versions only ever go up."""
    return int(cluster.versions.sum())


def _matches(ssn: Session, cache: _SpreadCache, namespace: str, selector: LabelSelector) -> _Matches:
    key: SelectorKey = (namespace, tuple(sorted(selector.match_labels.items())), selector.match_expressions)
    found = cache.matches.get(key)
    if found is not None:
        return found
    if cache.by_namespace is None:
        cache.by_namespace = {}
        for task in ssn.tasks.values():
            ns = task.pod.namespace
            cache.by_namespace.setdefault(ns, []).append(task)
            for k, v in task.pod.labels.items():
                cache.by_label.setdefault((ns, k, v), []).append(task)
    # The shortest list of pods carrying one of the selector's labels, else the whole namespace.
    candidates = cache.by_namespace.get(namespace, [])
    for k, v in selector.match_labels.items():
        posting = cache.by_label.get((namespace, k, v), [])
        if len(posting) < len(candidates):
            candidates = posting
    tasks = tuple(t for t in candidates if selects(selector, t.pod.labels))
    found = cache.matches[key] = _Matches(frozenset(t.key for t in tasks), tasks)
    return found


def _node_counts(ssn: Session, matches: _Matches) -> IntArray:
    """How many matching pods each node holds in a counted status, now."""
    c = ssn.cluster
    if matches.counts is None or matches.versions is None:
        counts = np.zeros(len(c.order), dtype=np.int64)
        for task in matches.tasks:
            node = c.nodes.get(task.node) if task.node is not None else None
            if node is not None and task.status in COUNTED and task.key in node.tasks:
                counts[node.idx] += 1
        matches.counts, matches.versions = counts, c.versions.copy()
        return counts
    counts, versions = matches.counts, matches.versions
    for i in np.flatnonzero(versions != c.versions).tolist():
        counts[i] = _count_on(c.order[i], matches.keys)
        versions[i] = c.versions[i]
    return counts


def _count_on(node: NodeState, keys: frozenset[str]) -> int:
    # A pod evicted here and pipelined elsewhere stays in this node's table under its old entry: it counts
    # where it is now (`task.node`).
    return sum(
        1
        for entry in node.tasks.values()
        if entry.task.key in keys and entry.task.status in COUNTED and entry.task.node == node.name
    )


def _domains(cache: _SpreadCache, cluster: ClusterState, key: str) -> tuple[IntArray, int]:
    """Each node's domain index for topology `key` (-1: the node lacks the key) and how many values exist."""
    found = cache.domains.get(key)
    if found is None:
        values: dict[str, int] = {}
        index = np.array(
            [
                -1 if (v := node.labels.get(key)) is None else values.setdefault(v, len(values))
                for node in cluster.order
            ],
            dtype=np.int64,
        )
        found = cache.domains[key] = (index, len(values))
    return found


def _inclusion(
    ssn: Session,
    cache: _SpreadCache,
    task: TaskState,
    constraint: TopologySpreadConstraint,
    affinity: NodeTest,
    tolerates: NodeTest,
) -> BoolArray | None:
    """The nodes the constraint's inclusion policies admit for this pod; None for all of them."""
    pod = task.pod
    c = ssn.cluster
    mask: BoolArray | None = None
    if constraint.node_affinity_policy == "Honor" and (pod.node_selector or pod.node_affinity):
        signature: tuple[object, ...] = (
            "affinity",
            tuple(sorted(pod.node_selector.items())),
            pod.node_affinity,
        )
        found = cache.masks.get(signature)
        if found is None:
            found = cache.masks[signature] = np.array([affinity(task, node) for node in c.order], dtype=bool)
        mask = found
    if constraint.node_taints_policy == "Honor":
        if cache.tainted is None:
            cache.tainted = [node.idx for node in c.order if node.node.taints]
        if cache.tainted:
            signature = ("taints", pod.tolerations)
            found = cache.masks.get(signature)
            if found is None:
                found = np.ones(len(c.order), dtype=bool)
                for i in cache.tainted:
                    found[i] = tolerates(task, c.order[i])
                cache.masks[signature] = found
            mask = found if mask is None else mask & found
    return mask


@dataclass(frozen=True)
class _Spread:
    """One constraint over the current cluster: each node's domain, each domain's count of matching pods
    (among eligible nodes) and which domains exist."""

    domain: IntArray
    per_domain: FloatArray
    present: BoolArray

    def domains_among(self, nodes: BoolArray) -> int:
        """How many distinct domains the `nodes` (all carrying the key) span."""
        return int(np.count_nonzero(np.bincount(self.domain[nodes], minlength=len(self.per_domain))))

    def node_counts(self) -> FloatArray:
        """Each node's domain count; 0 for a node without the key."""
        if not len(self.per_domain):
            return np.zeros(len(self.domain))
        return np.where(self.domain >= 0, self.per_domain[np.maximum(self.domain, 0)], 0.0)


def _spread(
    ssn: Session,
    cache: _SpreadCache,
    task: TaskState,
    constraint: TopologySpreadConstraint,
    has_keys: BoolArray,
    affinity: NodeTest,
    tolerates: NodeTest,
) -> _Spread:
    domain, n_values = _domains(cache, ssn.cluster, constraint.topology_key)
    eligible = has_keys
    included = _inclusion(ssn, cache, task, constraint, affinity, tolerates)
    if included is not None:
        eligible = eligible & included
    where = domain[eligible]
    present = np.bincount(where, minlength=n_values) > 0
    if constraint.selector is None:
        per_domain = np.zeros(n_values)
    else:
        counts = _node_counts(ssn, _matches(ssn, cache, task.pod.namespace, constraint.selector))
        per_domain = np.bincount(where, weights=counts[eligible], minlength=n_values).astype(np.float64)
    return _Spread(domain, per_domain, present)


def _has_keys(
    cache: _SpreadCache, cluster: ClusterState, constraints: Sequence[TopologySpreadConstraint]
) -> BoolArray:
    mask = np.ones(len(cluster.order), dtype=bool)
    for constraint in constraints:
        mask &= _domains(cache, cluster, constraint.topology_key)[0] >= 0
    return mask


# --- filter ------------------------------------------------------------------------------------------------
def filter_reason(
    ssn: Session, task: TaskState, node: NodeState, *, affinity: NodeTest, tolerates: NodeTest
) -> Refusal | None:
    """Why the pod's DoNotSchedule constraints refuse this node (`MISSING_LABEL`,
    `CONSTRAINTS_NOT_MATCH`), or None. `affinity` and `tolerates` are the predicates' own tests, read for
    the inclusion policies."""
    constraints = task.pod.topology_spread
    if not constraints:
        return None
    for i, constraint in enumerate(constraints):
        if (
            constraint.when_unsatisfiable == "DoNotSchedule"
            and not ssn.cluster.label_codes(constraint.topology_key)[1]
        ):
            # A key on no node at all (a typo, or nodes not labelled yet): say which constraint.
            return Refusal(
                f"{MISSING_LABEL}: no node has the label {constraint.topology_key} "
                f"(spec.topologySpreadConstraints[{i}].topologyKey)",
                Code.UNRESOLVABLE,
            )
    cache = _cache(ssn)
    stamp = _stamp(ssn.cluster)
    last = cache.last_filter
    if last is not None and last[0] is task and last[1] == stamp:
        codes = last[2]
    else:
        codes = _filter_codes(ssn, cache, task, affinity, tolerates)
        cache.last_filter = (task, stamp, codes)
    return _REASONS.get(int(codes[node.idx]))


def _filter_codes(
    ssn: Session, cache: _SpreadCache, task: TaskState, affinity: NodeTest, tolerates: NodeTest
) -> npt.NDArray[np.int8]:
    """Every node's verdict for the pod, in one pass: `_OK`, `_MISSING` or `_SKEWED`."""
    c = ssn.cluster
    codes = np.zeros(len(c.order), dtype=np.int8)
    hard = [x for x in task.pod.topology_spread if x.when_unsatisfiable == "DoNotSchedule"]
    if not hard:
        return codes
    has_keys = _has_keys(cache, c, hard)
    for constraint in hard:
        spread = _spread(ssn, cache, task, constraint, has_keys, affinity, tolerates)
        domains = int(spread.present.sum())
        floor = 0.0
        if domains >= constraint.min_domains:
            floor = float(spread.per_domain[spread.present].min())
        own = 1.0 if selects(constraint.selector, task.pod.labels) else 0.0
        missing = spread.domain < 0
        skewed = ~missing & (spread.node_counts() + own - floor > constraint.max_skew)
        verdict = np.where(missing, _MISSING, np.where(skewed, _SKEWED, _OK)).astype(np.int8)
        # The first failing constraint, in the pod's order, gives the reason.
        codes = np.where(codes == _OK, verdict, codes).astype(np.int8)
    return codes


# --- score -------------------------------------------------------------------------------------------------
def preference_scores(
    ssn: Session, task: TaskState, node_set: BoolArray, *, affinity: NodeTest, tolerates: NodeTest
) -> FloatArray | None:
    """The ScheduleAnyway score of every node, 0..`POD_TOPOLOGY_SPREAD`; None when the pod has no such
    constraint or no candidate node carries every key."""
    soft = [x for x in task.pod.topology_spread if x.when_unsatisfiable == "ScheduleAnyway"]
    if not soft:
        return None
    cache = _cache(ssn)
    c = ssn.cluster
    has_keys = _has_keys(cache, c, soft)
    scored = node_set & has_keys
    if not scored.any():
        return None
    raw = np.zeros(len(c.order))
    for constraint in soft:
        spread = _spread(ssn, cache, task, constraint, has_keys, affinity, tolerates)
        # kube-scheduler weighs a constraint by the number of its domains among the candidate nodes.
        size = spread.domains_among(scored)
        raw += spread.node_counts() * math.log(size + 2) + (constraint.max_skew - 1)
    high = float(raw[scored].max())
    low = float(raw[scored].min())
    # All candidates equally empty: none is preferred (kube-scheduler gives them all the top score).
    normalised = np.ones(len(c.order)) if high == 0 else (high + low - raw) / high
    return np.where(scored, normalised * POD_TOPOLOGY_SPREAD, 0.0)
