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

Score (KAI's podaffinity plugin, which runs kube-scheduler's InterPodAffinity score and skips its
normalisation): for every existing pod, each preferred affinity term of the incoming pod that selects it
adds the term's weight to the existing pod's domain (a preferred anti-affinity term subtracts it), and
each preferred term of the existing pod that selects the incoming pod does the same; a node scores the
sum over the domains it is in. Required terms of existing pods add nothing: KAI runs the plugin with a
hard pod-affinity weight of 0.

Both are computed once per pod and cluster generation (`ClusterState.generation` moves whenever a node
takes or releases a pod) and kept in the session, so trying 5,000 nodes costs one pass over the
existing pods, not one per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.core.selectors import term_selects
from shared.model.status import ACTIVE_USED, PodStatus

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState

POD_AFFINITY = "node(s) didn't match pod affinity rules"
POD_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"

Pair = tuple[str, str]
"""A topology domain: (label key, value)."""


@dataclass
class _Existing:
    """The existing pods with anything affinity reads, gathered once per cluster generation."""

    generation: int
    pods: list[tuple[TaskState, NodeState]] = field(default_factory=list)
    """Every existing pod with its node."""
    with_anti: list[tuple[TaskState, NodeState]] = field(default_factory=list)
    """Existing pods that declare required anti-affinity."""
    with_preferred: list[tuple[TaskState, NodeState]] = field(default_factory=list)
    """Existing pods that declare preferred affinity or anti-affinity."""


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


def _existing(ssn: Session) -> _Existing:
    generation = ssn.cluster.generation
    cached = ssn.affinity_cache.get("existing")
    if isinstance(cached, _Existing) and cached.generation == generation:
        return cached
    found = _Existing(generation)
    for node in ssn.cluster.order:
        for entry in node.tasks.values():
            t = entry.task
            if t.status not in ACTIVE_USED or (t.status == PodStatus.RELEASING and t.is_virtual):
                continue
            found.pods.append((t, node))
            pod = t.pod
            if pod.pod_anti_affinity:
                found.with_anti.append((t, node))
            if pod.preferred_pod_affinity or pod.preferred_pod_anti_affinity:
                found.with_preferred.append((t, node))
    ssn.affinity_cache["existing"] = found
    return found


def _facts(ssn: Session, task: TaskState) -> _Facts:
    generation = ssn.cluster.generation
    key = ("facts", task.key)
    cached = ssn.affinity_cache.get(key)
    if isinstance(cached, _Facts) and cached.generation == generation:
        return cached
    existing = _existing(ssn)
    pod = task.pod
    affinity: list[set[str]] = [set() for _ in pod.pod_affinity]
    anti: list[set[str]] = [set() for _ in pod.pod_anti_affinity]
    if pod.pod_affinity or pod.pod_anti_affinity:
        for other, node in existing.pods:
            if other is task:
                continue
            for i, term in enumerate(pod.pod_affinity):
                value = node.labels.get(term.topology_key)
                if value is not None and term_selects(term, other.pod):
                    affinity[i].add(value)
            for i, term in enumerate(pod.pod_anti_affinity):
                value = node.labels.get(term.topology_key)
                if value is not None and term_selects(term, other.pod):
                    anti[i].add(value)
    existing_anti: set[Pair] = set()
    for other, node in existing.with_anti:
        if other is task:
            continue
        for term in other.pod.pod_anti_affinity:
            value = node.labels.get(term.topology_key)
            if value is not None and term_selects(term, pod):
                existing_anti.add((term.topology_key, value))
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


def reason(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    """Why inter-pod affinity keeps the pod off `node` (kube-scheduler's words), or None."""
    if not declared(ssn, task):
        return None
    facts = _facts(ssn, task)
    pod = task.pod
    labels = node.labels
    if pod.pod_affinity:
        values = [labels.get(term.topology_key) for term in pod.pod_affinity]
        if any(value is None for value in values):
            return POD_AFFINITY
        if not all(value in found for value, found in zip(values, facts.affinity_counts, strict=True)):
            first_of_its_kind = not facts.any_affinity_match and all(
                term_selects(term, pod) for term in pod.pod_affinity
            )
            if not first_of_its_kind:
                return POD_AFFINITY
    for term, found in zip(pod.pod_anti_affinity, facts.anti_values, strict=True):
        value = labels.get(term.topology_key)
        if value is not None and value in found:
            return POD_ANTI_AFFINITY
    for key, value in facts.existing_anti:
        if labels.get(key) == value:
            return EXISTING_ANTI_AFFINITY
    return None


def scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """Every node's raw InterPodAffinity score for the pod (None when no preferred term is involved)."""
    existing = _existing(ssn)
    pod = task.pod
    own = pod.preferred_pod_affinity or pod.preferred_pod_anti_affinity
    if not own and not existing.with_preferred:
        return None
    by_domain: dict[Pair, float] = {}

    def add(key: str, node: NodeState, weight: float) -> None:
        value = node.labels.get(key)
        if value is not None:
            by_domain[(key, value)] = by_domain.get((key, value), 0.0) + weight

    if own:
        for other, node in existing.pods:
            if other is task:
                continue
            for term in pod.preferred_pod_affinity:
                if term_selects(term, other.pod):
                    add(term.topology_key, node, term.weight)
            for term in pod.preferred_pod_anti_affinity:
                if term_selects(term, other.pod):
                    add(term.topology_key, node, -term.weight)
    for other, node in existing.with_preferred:
        if other is task:
            continue
        for term in other.pod.preferred_pod_affinity:
            if term_selects(term, pod):
                add(term.topology_key, node, term.weight)
        for term in other.pod.preferred_pod_anti_affinity:
            if term_selects(term, pod):
                add(term.topology_key, node, -term.weight)
    out = np.zeros(len(ssn.cluster.order))
    for (key, value), weight in by_domain.items():
        if weight:
            out += np.where(ssn.cluster.label_column(key) == value, weight, 0.0)
    return out
