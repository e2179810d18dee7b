"""Kubernetes' selector semantics: label selectors, node selector terms, which pods an affinity term
selects, and which taints a toleration tolerates.

Pure functions over the model's selectors (`shared.model.LabelSelector`, `LabelSelectorTerm`,
`PodAffinityTerm`). Called by the node filters (`shared.core.predicates`), the inter-pod affinity
filter and score (`shared.core.pod_affinity`), the node-affinity score (`shared.core.scoring`), the
victim solver's node filter, and outside the core by the binder's volume wait (a provisioned volume's node
affinity against the chosen node): public, so Kubernetes' operators are read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.model import LabelSelector, LabelSelectorTerm, Pod, PodAffinityTerm
from shared.model.objects import Taint, Toleration


def requirement_matches(key: str, operator: str, values: tuple[str, ...], labels: Mapping[str, str]) -> bool:
    """One requirement of a label or node selector, as Kubernetes' `labels.Requirement.Matches` reads it:
    In, NotIn (also met when the label is absent), Exists, DoesNotExist, and for node selectors Gt and Lt
    (the label and the single value compared as integers; an absent or non-integer label does not match).
    An operator Kubernetes does not know matches nothing (translation refuses such pods first)."""
    value = labels.get(key)
    match operator:
        case "In":
            return value is not None and value in values
        case "NotIn":
            return value is None or value not in values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            if value is None or len(values) != 1:
                return False
            try:
                have, bound = int(value), int(values[0])
            except ValueError:
                return False
            return have > bound if operator == "Gt" else have < bound
    return False


def label_selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Every `match_labels` pair and every expression hold (the empty selector matches everything)."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    return all(requirement_matches(r.key, r.operator, r.values, labels) for r in selector.match_expressions)


def node_term_matches(term: LabelSelectorTerm, labels: Mapping[str, str]) -> bool:
    """A node selector term: every requirement holds. (A term without requirements is never built:
    Kubernetes' empty term matches no node, and translation drops it.)"""
    return all(requirement_matches(r.key, r.operator, r.values, labels) for r in term.requirements)


def node_affinity_matches(pod: Pod, labels: Mapping[str, str]) -> bool:
    """The pod's `nodeSelector` and required node affinity (terms ORed) both hold on a node's labels."""
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            return False
    terms = pod.node_affinity
    return not terms or any(node_term_matches(term, labels) for term in terms)


def preferred_node_weight(pod: Pod, labels: Mapping[str, str]) -> int:
    """The summed weights of the pod's preferred node-affinity terms a node's labels meet."""
    return sum(p.weight for p in pod.preferred_node_affinity if node_term_matches(p.term, labels))


_NO_LABELS: Mapping[str, str] = {}


def term_selects(term: PodAffinityTerm, pod: Pod, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether an affinity term (its namespaces already resolved against the pod declaring it) selects
    `pod`: the pod is in one of the term's namespaces (`namespaces`, every one with `all_namespaces`, or
    one whose labels in `namespace_labels` meet `namespace_selector`: Kubernetes' union of the two) and
    its labels meet the term's selector. A namespace missing from `namespace_labels` has no labels."""
    if not term.all_namespaces and pod.namespace not in term.namespaces:
        chosen = term.namespace_selector
        if chosen is None or not label_selector_matches(
            chosen, namespace_labels.get(pod.namespace, _NO_LABELS)
        ):
            return False
    return label_selector_matches(term.selector, pod.labels)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' `Toleration.ToleratesTaint`: an empty effect or key tolerates every effect or key;
    `Exists` any value, `Equal` (the default) the same value."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == taint.value
