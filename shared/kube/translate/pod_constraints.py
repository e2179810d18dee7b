"""A pod's placement constraints as kube-scheduler reads them: required and preferred node affinity, pod
(anti-)affinity, tolerations and topology spread constraints, each checked as the API server validates it.

Called by `pods.pod_of` only (`node_affinity`, `preferred_node_affinity`, `pod_affinity`, `tolerations`,
`topology_spread`); kept apart from `pods` because these rules are kube-scheduler's, not KAI's, and are
half of what a pod carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import msgspec

from shared.kube import selectors, wire
from shared.kube.translate.fields import Where
from shared.model import (
    LabelRequirement,
    LabelSelector,
    LabelSelectorTerm,
    PodAffinityTerm,
    PreferredNodeTerm,
    TopologySpreadConstraint,
)
from shared.model.objects import NodeInclusionPolicy, Toleration, WhenUnsatisfiable

_TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})


def node_affinity(where: Where, affinity: wire.Affinity | None) -> tuple[LabelSelectorTerm, ...]:
    """Required node affinity. Terms are ORed; Kubernetes' empty term matches no node, so it is dropped,
    and a selector of only empty terms becomes a term no node meets."""
    if affinity is None or affinity.node_affinity is None:
        return ()
    selector = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if selector is None:
        return ()
    at = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    return selectors.node_selector(where, at, selector)


def preferred_node_affinity(where: Where, affinity: wire.Affinity | None) -> tuple[PreferredNodeTerm, ...]:
    """Preferred node affinity: weighted terms (an empty term matches no node and is dropped)."""
    if affinity is None or affinity.node_affinity is None:
        return ()
    at = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    out: list[PreferredNodeTerm] = []
    for i, preferred in enumerate(
        affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    ):
        _weight(where, f"{at}[{i}].weight", preferred.weight)
        term = selectors.node_term(where, f"{at}[{i}].preference", preferred.preference)
        if term is not None:
            out.append(PreferredNodeTerm(preferred.weight, term))
    return tuple(out)


def _weight(where: Where, at: str, weight: int) -> None:
    if not 1 <= weight <= 100:
        raise where.error(at, f"must be within 1-100, got {weight}")


def _affinity_term(
    where: Where, at: str, pod: wire.Pod, term: wire.PodAffinityTerm, weight: int
) -> PodAffinityTerm | None:
    """One pod (anti-)affinity term, its namespaces resolved and its label keys merged (None: a term
    without a label selector, which selects no pod)."""
    if not term.topology_key:
        raise where.error(f"{at}.topologyKey", "missing")
    if term.label_selector is None:
        return None
    selector = selectors.label_selector(where, f"{at}.labelSelector", term.label_selector)
    labels = pod.metadata.labels
    # kube-scheduler merges these keys into the selector with the pod's own values; a key the pod does not
    # carry is left out.
    merged = [LabelRequirement(key, "In", (labels[key],)) for key in term.match_label_keys if key in labels]
    merged += [
        LabelRequirement(key, "NotIn", (labels[key],)) for key in term.mismatch_label_keys if key in labels
    ]
    overlap = set(term.match_label_keys) & set(term.mismatch_label_keys)
    if overlap:
        raise where.error(f"{at}.mismatchLabelKeys", f"keys also in matchLabelKeys: {sorted(overlap)}")
    if merged:
        selector = msgspec.structs.replace(
            selector, match_expressions=selector.match_expressions + tuple(merged)
        )
    # Kubernetes: the listed namespaces and those the namespace selector matches (the empty selector: all);
    # neither given, the pod's own namespace. The selector is matched in the session, against the labels the
    # namespaces have then.
    namespaces = tuple(term.namespaces)
    all_namespaces = False
    namespace_selector: LabelSelector | None = None
    if term.namespace_selector is not None:
        given = term.namespace_selector
        if given.match_labels or given.match_expressions:
            namespace_selector = selectors.label_selector(where, f"{at}.namespaceSelector", given)
        else:
            all_namespaces = True
    elif not namespaces:
        namespaces = (pod.metadata.namespace,)
    return PodAffinityTerm(
        selector=selector,
        topology_key=term.topology_key,
        namespaces=namespaces,
        all_namespaces=all_namespaces,
        namespace_selector=namespace_selector,
        weight=weight,
    )


def pod_affinity(where: Where, pod: wire.Pod, *, anti: bool, preferred: bool) -> tuple[PodAffinityTerm, ...]:
    """Pod (anti-)affinity terms, required or preferred, with every operator kube-scheduler knows."""
    affinity = pod.spec.affinity
    if affinity is None:
        return ()
    spec = affinity.pod_anti_affinity if anti else affinity.pod_affinity
    if spec is None:
        return ()
    name = "podAntiAffinity" if anti else "podAffinity"
    out: list[PodAffinityTerm] = []
    if preferred:
        at = f"spec.affinity.{name}.preferredDuringSchedulingIgnoredDuringExecution"
        for i, weighted in enumerate(spec.preferred_during_scheduling_ignored_during_execution):
            _weight(where, f"{at}[{i}].weight", weighted.weight)
            term = _affinity_term(
                where, f"{at}[{i}].podAffinityTerm", pod, weighted.pod_affinity_term, weighted.weight
            )
            if term is not None:
                out.append(term)
        return tuple(out)
    at = f"spec.affinity.{name}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, raw in enumerate(spec.required_during_scheduling_ignored_during_execution):
        term = _affinity_term(where, f"{at}[{i}]", pod, raw, 0)
        if term is None:
            if anti:
                continue
            raise where.error(f"{at}[{i}].labelSelector", "missing: a pod affinity term must select pods")
        out.append(term)
    return tuple(out)


def tolerations(where: Where, tolerations: list[wire.Toleration]) -> tuple[Toleration, ...]:
    out: list[Toleration] = []
    for i, t in enumerate(tolerations):
        at = f"spec.tolerations[{i}]"
        operator = t.operator or "Equal"
        if operator not in ("Equal", "Exists"):
            raise where.error(f"{at}.operator", f"must be Equal or Exists, got {t.operator!r}")
        if operator == "Exists" and t.value:
            raise where.error(f"{at}.value", "must be empty when the operator is Exists")
        if not t.key and operator != "Exists":
            raise where.error(f"{at}.operator", "must be Exists when the key is empty")
        if t.effect and t.effect not in _TAINT_EFFECTS:
            raise where.error(
                f"{at}.effect", f"must be one of {', '.join(sorted(_TAINT_EFFECTS))}, got {t.effect!r}"
            )
        out.append(Toleration(t.key, operator, t.value, t.effect))
    return tuple(out)


_WHEN_UNSATISFIABLE: tuple[WhenUnsatisfiable, ...] = ("DoNotSchedule", "ScheduleAnyway")
_INCLUSION_POLICIES: tuple[NodeInclusionPolicy, ...] = ("Honor", "Ignore")


def topology_spread(
    where: Where, constraints: Sequence[wire.TopologySpreadConstraint], labels: Mapping[str, str]
) -> tuple[TopologySpreadConstraint, ...]:
    """``spec.topologySpreadConstraints`` as kube-scheduler reads them: unset optional fields take its
    defaults (minDomains 1, nodeAffinityPolicy Honor, nodeTaintsPolicy Ignore) and ``matchLabelKeys``
    are merged into the selector with the pod's own values (a key the pod lacks is skipped, as there).
    Input the API server's validation refuses is an error naming the field."""
    out: list[TopologySpreadConstraint] = []
    seen: set[tuple[str, str]] = set()
    for i, c in enumerate(constraints):
        at = f"spec.topologySpreadConstraints[{i}]"
        if c.max_skew is None:
            raise where.error(f"{at}.maxSkew", "missing")
        if c.max_skew < 1:
            raise where.error(f"{at}.maxSkew", f"must be >= 1, got {c.max_skew}")
        if not c.topology_key:
            raise where.error(f"{at}.topologyKey", "missing")
        when = _one_of(where, f"{at}.whenUnsatisfiable", c.when_unsatisfiable, _WHEN_UNSATISFIABLE)
        if (c.topology_key, when) in seen:
            raise where.error(
                f"{at}.topologyKey", f"a second {when} constraint on {c.topology_key!r} (duplicate)"
            )
        seen.add((c.topology_key, when))
        min_domains = 1
        if c.min_domains is not None:
            if c.min_domains < 1:
                raise where.error(f"{at}.minDomains", f"must be >= 1, got {c.min_domains}")
            if when != "DoNotSchedule":
                raise where.error(f"{at}.minDomains", "only allowed with whenUnsatisfiable DoNotSchedule")
            min_domains = c.min_domains
        affinity_policy: NodeInclusionPolicy = "Honor"
        if c.node_affinity_policy is not None:
            affinity_policy = _one_of(
                where, f"{at}.nodeAffinityPolicy", c.node_affinity_policy, _INCLUSION_POLICIES
            )
        taints_policy: NodeInclusionPolicy = "Ignore"
        if c.node_taints_policy is not None:
            taints_policy = _one_of(
                where, f"{at}.nodeTaintsPolicy", c.node_taints_policy, _INCLUSION_POLICIES
            )
        selector = _spread_selector(where, f"{at}.labelSelector", c.label_selector)
        if c.match_label_keys:
            if selector is None:
                raise where.error(f"{at}.matchLabelKeys", "must not be set without a labelSelector")
            selector = _with_label_keys(selector, c.match_label_keys, labels)
        out.append(
            TopologySpreadConstraint(
                max_skew=c.max_skew,
                topology_key=c.topology_key,
                when_unsatisfiable=when,
                selector=selector,
                min_domains=min_domains,
                node_affinity_policy=affinity_policy,
                node_taints_policy=taints_policy,
            )
        )
    return tuple(out)


_Choice = TypeVar("_Choice", bound=str)


def _one_of(where: Where, field: str, value: str, allowed: tuple[_Choice, ...]) -> _Choice:
    for choice in allowed:
        if value == choice:
            return choice
    if not value:
        raise where.error(field, f"missing: expected one of {', '.join(allowed)}")
    raise where.error(field, f"{value!r}, expected one of {', '.join(allowed)}")


def _spread_selector(where: Where, at: str, selector: wire.LabelSelector | None) -> LabelSelector | None:
    return None if selector is None else selectors.label_selector(where, at, selector)


def _with_label_keys(
    selector: LabelSelector, label_keys: Sequence[str], labels: Mapping[str, str]
) -> LabelSelector:
    """kube-scheduler's ``matchLabelKeys``: each key the pod carries narrows the selector to the pod's
    value. A key the selector already names is left alone: newer API servers merge the keys into the
    stored ``labelSelector`` themselves, so merging again would only repeat it."""
    named = set(selector.match_labels) | {e.key for e in selector.match_expressions}
    extra = {k: labels[k] for k in label_keys if k in labels and k not in named}
    if not extra:
        return selector
    return msgspec.structs.replace(selector, match_labels={**selector.match_labels, **extra})
