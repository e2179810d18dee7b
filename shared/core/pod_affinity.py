"""Inter-pod affinity and anti-affinity, as kube-scheduler's InterPodAffinity plugin decides them.

The filter (`reason`, asked by the predicates plugin's node filter, `shared.core.predicates.check`) and
the score (`scores`, the podaffinity plugin's node score, `shared.core.builtin_plugins`) both read the
pods already placed: the session's pods in an active status on a node (bound, running, allocated or
pipelined in this session, releasing ones not yet evicted by this session). "Existing pods" below means
those, the pod being placed excluded.

Filter, in kube-scheduler's order, the first failure giving the reason:

1. Required affinity: on a node that has every term's topology key, each term must find an existing pod
   it selects in the node's domain (same value of the key). A node missing a key fails. One exception
   keeps a group of pods with affinity to each other from waiting forever: when no existing pod anywhere
   is selected by any of the terms, and the pod itself meets all of them, it may go on any node that has
   the keys.
2. Required anti-affinity: no term may find an existing pod it selects in the node's domain (a node
   without the key has no domain and passes).
3. Existing pods' required anti-affinity: a node in the domain of an existing pod whose anti-affinity
   term selects the incoming pod fails.

The codes are kube-scheduler's (`shared.core.plugins.points.Code`): an unmet required affinity (a missing
key included) is UNRESOLVABLE, since evicting pods never brings a pod the term selects; the two
anti-affinity refusals are UNSCHEDULABLE, since evicting the pods they find may lift them.

Score (KAI's podaffinity plugin, which runs kube-scheduler's InterPodAffinity score and skips its
normalisation): for every existing pod, each preferred affinity term of the incoming pod that selects it
adds the term's weight to the existing pod's domain (a preferred anti-affinity term subtracts it), and
each preferred term of the existing pod that selects the incoming pod does the same; a node scores the
sum over the domains it is in. Required terms of existing pods add nothing: KAI runs the plugin with a
hard pod-affinity weight of 0.

A term selects a pod in its namespaces: those it lists, every one for an empty namespace selector, and
those whose labels its namespace selector matches (`shared.core.selectors.term_selects`, reading the
session's `namespace_labels`); an existing pod's term is matched against the incoming pod's namespace,
as kube-scheduler matches it against that namespace's labels.

The existing pods are kept in an index by kind (pods alike in namespace, labels and terms), counted per
domain of every topology key the session's terms use, and brought up to date from the nodes that changed
(`ClusterState.changed_nodes`); a pod's filter facts are computed once per cluster generation
(`ClusterState.generation` moves whenever a node takes or releases a pod) from the kinds, and the nodes
they refuse become one mask (`refused`, the predicates plugin's pre-filter), so placing a pod among
5,000 nodes and thousands of existing pods costs a pass over the kinds and a few vector operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from shared.core.plugins.points import Code, Refusal
from shared.core.selectors import term_selects
from shared.model import Pod, PodAffinityTerm
from shared.model.status import ACTIVE_USED, PodStatus

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState

POD_AFFINITY = "node(s) didn't match pod affinity rules"
POD_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"

_AFFINITY = Refusal(POD_AFFINITY, Code.UNRESOLVABLE)
_ANTI_AFFINITY = Refusal(POD_ANTI_AFFINITY)
_EXISTING_ANTI_AFFINITY = Refusal(EXISTING_ANTI_AFFINITY)

Pair = tuple[str, str]
"""A topology domain: (label key, value)."""


class _Kind:
    """Existing pods alike in everything affinity reads (namespace, labels, their own terms), counted per
    value of every topology key the session's terms use."""

    __slots__ = ("counts", "pod")

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        """One of them: what a term reads of each."""
        self.counts: dict[str, dict[str, int]] = {}
        """Topology key -> value -> how many of these pods run on a node with that value."""


class _Index:
    """The existing pods by kind, kept up to date from the nodes that changed since it last looked
    (`ClusterState.changed_nodes`), so a pod's facts cost a pass over the kinds, not over every pod."""

    def __init__(self, ssn: Session) -> None:
        self.cluster = ssn.cluster
        keys: set[str] = set()
        for t in ssn.tasks.values():
            pod = t.pod
            for terms in (
                pod.pod_affinity,
                pod.pod_anti_affinity,
                pod.preferred_pod_affinity,
                pod.preferred_pod_anti_affinity,
            ):
                keys.update(term.topology_key for term in terms)
        self.keys = tuple(sorted(keys))
        self.kinds: dict[bytes, _Kind] = {}
        self._kind_of: dict[str, bytes] = {}
        self._on_node: dict[int, list[bytes]] = {}
        self.cluster.changed_nodes = set(range(len(self.cluster.order)))
        self.sync()

    def kind_of(self, task: TaskState) -> bytes:
        signature = self._kind_of.get(task.key)
        if signature is None:
            pod = task.pod
            signature = msgspec.json.encode(
                (
                    pod.namespace,
                    pod.labels,
                    pod.pod_anti_affinity,
                    pod.preferred_pod_affinity,
                    pod.preferred_pod_anti_affinity,
                )
            )
            self._kind_of[task.key] = signature
            if signature not in self.kinds:
                self.kinds[signature] = _Kind(pod)
        return signature

    def sync(self) -> None:
        changed = self.cluster.changed_nodes
        if not changed:
            return
        order = self.cluster.order
        for idx in changed:
            node = order[idx]
            for signature in self._on_node.pop(idx, ()):
                self._count(signature, node, -1)
            counted = [self.kind_of(t) for t in placed_on(node)]
            for signature in counted:
                self._count(signature, node, 1)
            if counted:
                self._on_node[idx] = counted
        changed.clear()

    def _count(self, signature: bytes, node: NodeState, delta: int) -> None:
        counts = self.kinds[signature].counts
        for key in self.keys:
            value = node.labels.get(key)
            if value is None:
                continue
            per_value = counts.setdefault(key, {})
            left = per_value.get(value, 0) + delta
            if left:
                per_value[value] = left
            else:
                per_value.pop(value, None)

    def counts(self, signature: bytes, key: str, own: tuple[bytes, NodeState] | None) -> dict[str, int]:
        """Value -> pods of this kind in that domain of `key`, the pod asking left out (`own`: its kind
        and node when it is itself placed)."""
        counts = self.kinds[signature].counts.get(key, {})
        if own is None or own[0] != signature:
            return counts
        value = own[1].labels.get(key)
        if value is None or value not in counts:
            return counts
        less = dict(counts)
        if less[value] > 1:
            less[value] -= 1
        else:
            del less[value]
        return less


def placed_on(node: NodeState) -> list[TaskState]:
    """The node's existing pods: in an active status, not evicted by this session, and placed on this
    node now (a pod evicted and placed again elsewhere in one statement is still listed on its old node)."""
    return [
        t
        for entry in node.tasks.values()
        if (t := entry.task).status in ACTIVE_USED
        and t.node == node.name
        and not (t.status == PodStatus.RELEASING and t.is_virtual)
    ]


@dataclass(frozen=True)
class _Facts:
    """What the filter needs to know about one pod against the existing pods."""

    generation: int
    affinity_counts: tuple[frozenset[str], ...]
    """Per required affinity term: the values of its key whose domain holds a pod the term selects."""
    any_affinity_match: bool
    """Some existing pod anywhere (on a node with the term's key) is selected by some affinity term."""
    anti_values: tuple[frozenset[str], ...]
    """Per required anti-affinity term: the values of its key whose domain holds a pod it selects."""
    existing_anti: frozenset[Pair]
    """Domains of existing pods whose required anti-affinity selects this pod."""


def _index(ssn: Session) -> _Index:
    index = ssn.affinity_cache.get("index")
    if not isinstance(index, _Index):
        index = _Index(ssn)
        ssn.affinity_cache["index"] = index
    index.sync()
    return index


def _own(index: _Index, task: TaskState) -> tuple[bytes, NodeState] | None:
    """The task's own kind and node when it is itself one of the existing pods."""
    node = index.cluster.nodes.get(task.node) if task.node is not None else None
    if node is None or task.key not in node.tasks or task not in placed_on(node):
        return None
    return index.kind_of(task), node


def _facts(ssn: Session, task: TaskState) -> _Facts:
    generation = ssn.cluster.generation
    key = ("facts", task.key)
    cached = ssn.affinity_cache.get(key)
    if isinstance(cached, _Facts) and cached.generation == generation:
        return cached
    index = _index(ssn)
    own = _own(index, task)
    pod = task.pod
    ns_labels = ssn.namespace_labels
    affinity: list[set[str]] = [set() for _ in pod.pod_affinity]
    anti: list[set[str]] = [set() for _ in pod.pod_anti_affinity]
    existing_anti: set[Pair] = set()
    for signature, kind in index.kinds.items():
        for i, term in enumerate(pod.pod_affinity):
            if term_selects(term, kind.pod, ns_labels):
                affinity[i].update(index.counts(signature, term.topology_key, own))
        for i, term in enumerate(pod.pod_anti_affinity):
            if term_selects(term, kind.pod, ns_labels):
                anti[i].update(index.counts(signature, term.topology_key, own))
        for term in kind.pod.pod_anti_affinity:
            if term_selects(term, pod, ns_labels):
                existing_anti.update(
                    (term.topology_key, v) for v in index.counts(signature, term.topology_key, own)
                )
    facts = _Facts(
        generation,
        tuple(frozenset(values) for values in affinity),
        any(affinity),
        tuple(frozenset(values) for values in anti),
        frozenset(existing_anti),
    )
    ssn.affinity_cache[key] = facts
    return facts


def declared(ssn: Session, task: TaskState) -> bool:
    """Whether the filter has anything to check for this pod in this session."""
    pod = task.pod
    return bool(pod.pod_affinity or pod.pod_anti_affinity or ssn.any_anti_affinity)


def reason(ssn: Session, task: TaskState, node: NodeState) -> Refusal | None:
    """Why inter-pod affinity keeps the pod off `node` (kube-scheduler's words and code), or None."""
    if not declared(ssn, task):
        return None
    facts = _facts(ssn, task)
    pod = task.pod
    ns_labels = ssn.namespace_labels
    labels = node.labels
    if pod.pod_affinity:
        values = [labels.get(term.topology_key) for term in pod.pod_affinity]
        if any(value is None for value in values):
            missing = _missing_key(ssn, pod.pod_affinity)
            return _AFFINITY if missing is None else Refusal(missing, Code.UNRESOLVABLE)
        if not all(value in found for value, found in zip(values, facts.affinity_counts, strict=True)):
            first_of_its_kind = not facts.any_affinity_match and all(
                term_selects(term, pod, ns_labels) for term in pod.pod_affinity
            )
            if not first_of_its_kind:
                return _AFFINITY
    for term, found in zip(pod.pod_anti_affinity, facts.anti_values, strict=True):
        value = labels.get(term.topology_key)
        if value is not None and value in found:
            return _ANTI_AFFINITY
    for key, value in facts.existing_anti:
        if labels.get(key) == value:
            return _EXISTING_ANTI_AFFINITY
    return None


def _missing_key(ssn: Session, terms: tuple[PodAffinityTerm, ...]) -> str | None:
    """The reason naming the field, when a required term's topology key is on no node at all (a typo, or
    nodes not labelled yet): the pod waits, and its events and condition say which term."""
    for i, term in enumerate(terms):
        if not ssn.cluster.label_codes(term.topology_key)[1]:
            return (
                f"{POD_AFFINITY}: no node has the label {term.topology_key} "
                f"(spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[{i}].topologyKey)"
            )
    return None


def refused(ssn: Session, task: TaskState) -> npt.NDArray[np.bool_] | None:
    """The nodes `reason` refuses, as one mask over the session's nodes (None: it refuses none), so the
    allocation need not try them one by one (kube-scheduler's PreFilter does the same)."""
    if not declared(ssn, task):
        return None
    facts = _facts(ssn, task)
    c = ssn.cluster
    pod = task.pod
    ns_labels = ssn.namespace_labels
    out = np.zeros(len(c.order), dtype=bool)
    if pod.pod_affinity:
        first_of_its_kind = not facts.any_affinity_match and all(
            term_selects(t, pod, ns_labels) for t in pod.pod_affinity
        )
        for term, found in zip(pod.pod_affinity, facts.affinity_counts, strict=True):
            codes, _ = c.label_codes(term.topology_key)
            out |= codes == 0
            if not first_of_its_kind:
                out |= ~c.domain_mask(term.topology_key, found)
    for term, found in zip(pod.pod_anti_affinity, facts.anti_values, strict=True):
        if found:
            out |= c.domain_mask(term.topology_key, found)
    by_key: dict[str, list[str]] = {}
    for key, value in facts.existing_anti:
        by_key.setdefault(key, []).append(value)
    for key, values in by_key.items():
        out |= c.domain_mask(key, values)
    return out if out.any() else None


def scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """Every node's raw InterPodAffinity score for the pod (None when no preferred term is involved)."""
    if not ssn.any_preferred_affinity:
        return None
    index = _index(ssn)
    own = _own(index, task)
    pod = task.pod
    ns_labels = ssn.namespace_labels
    by_domain: dict[Pair, float] = {}

    def add(signature: bytes, key: str, weight: float) -> None:
        for value, count in index.counts(signature, key, own).items():
            by_domain[(key, value)] = by_domain.get((key, value), 0.0) + weight * count

    for signature, kind in index.kinds.items():
        for term in pod.preferred_pod_affinity:
            if term_selects(term, kind.pod, ns_labels):
                add(signature, term.topology_key, term.weight)
        for term in pod.preferred_pod_anti_affinity:
            if term_selects(term, kind.pod, ns_labels):
                add(signature, term.topology_key, -term.weight)
        for term in kind.pod.preferred_pod_affinity:
            if term_selects(term, pod, ns_labels):
                add(signature, term.topology_key, term.weight)
        for term in kind.pod.preferred_pod_anti_affinity:
            if term_selects(term, pod, ns_labels):
                add(signature, term.topology_key, -term.weight)
    if not any(by_domain.values()):
        return None
    out = np.zeros(len(ssn.cluster.order))
    for (key, value), weight in by_domain.items():
        if weight:
            out[ssn.cluster.domain_mask(key, (value,))] += weight
    return out
