"""Kubernetes' node selectors and label selectors, checked as the API server validates them, read into the
model's terms; pure.

Called wherever an API object carries one: a pod's node affinity and its pod (anti-)affinity selectors
(`shared.kube.translate.pod_constraints`), a PersistentVolume's node affinity, a claim's selector and a
CSIStorageCapacity's node topology (`shared.kube.volumes`), a ResourceSlice's and an allocated
ResourceClaim's node selector (`shared.kube.dra`). One module, so that every kind is held to the same rules
(which operators, how many values, what ``matchFields`` may say) and names the field the same way.

`where` is the object as `InvalidObject` names it, (kind, "namespace/name"); `translate.fields.Where` is
one. `at` is the path of the selector or term within the object.
"""

from __future__ import annotations

from shared.errors import InvalidObject
from shared.kube import keys, values, wire
from shared.model import LabelRequirement, LabelSelector, LabelSelectorTerm, NodeSelectorRequirement

__all__ = ["LABEL_OPERATORS", "NEVER", "NODE_OPERATORS", "label_selector", "node_selector", "node_term"]

NODE_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
NEVER = LabelSelectorTerm((NodeSelectorRequirement(keys.NODE_NAME_LABEL, "In", ()),))
"""A term no node meets (an empty In list)."""


def requirement_values(
    where: tuple[str, str], at: str, operator: str, given: list[str], operators: frozenset[str]
) -> tuple[str, ...]:
    """A selector requirement's values, checked as the API server validates them."""
    if operator not in operators:
        raise InvalidObject(
            *where, f"{at}.operator", f"must be one of {', '.join(sorted(operators))}, got {operator!r}"
        )
    if operator in ("In", "NotIn") and not given:
        raise InvalidObject(*where, f"{at}.values", f"must not be empty for {operator}")
    if operator in ("Exists", "DoesNotExist") and given:
        raise InvalidObject(*where, f"{at}.values", f"must be empty for {operator}")
    if operator in ("Gt", "Lt") and (len(given) != 1 or not _is_int64(given[0])):
        raise InvalidObject(
            *where, f"{at}.values", f"{operator} takes one integer, got {values.shown(given)}"
        )
    return tuple(given)


def _is_int64(text: str) -> bool:
    try:
        values.whole(text, low=-(2**63), high=2**63 - 1)
    except values.InvalidValueError:
        return False
    return True


def node_term(where: tuple[str, str], at: str, term: wire.NodeSelectorTerm) -> LabelSelectorTerm | None:
    """A node selector term (None for Kubernetes' empty term, which matches no node). ``matchFields`` may
    name only ``metadata.name``, with In or NotIn and one value, as the API server allows."""
    requirements = [
        NodeSelectorRequirement(
            r.key,
            r.operator,
            requirement_values(where, f"{at}.matchExpressions[{j}]", r.operator, r.values, NODE_OPERATORS),
        )
        for j, r in enumerate(term.match_expressions)
    ]
    for j, f in enumerate(term.match_fields):
        field_at = f"{at}.matchFields[{j}]"
        if f.key != "metadata.name":
            raise InvalidObject(*where, f"{field_at}.key", f"only metadata.name is supported, got {f.key!r}")
        if f.operator not in ("In", "NotIn") or len(f.values) != 1:
            raise InvalidObject(
                *where,
                field_at,
                f"metadata.name takes In or NotIn with one value, got {f.operator} {f.values}",
            )
        requirements.append(NodeSelectorRequirement(keys.NODE_NAME_LABEL, f.operator, tuple(f.values)))
    return LabelSelectorTerm(tuple(requirements)) if requirements else None


def node_selector(
    where: tuple[str, str], at: str, selector: wire.NodeSelector
) -> tuple[LabelSelectorTerm, ...]:
    """A required node selector (`at` names its ``nodeSelectorTerms``): terms ORed; Kubernetes' empty term
    matches no node, so it is dropped, and a selector of only empty terms becomes `NEVER`."""
    terms = [node_term(where, f"{at}[{i}]", term) for i, term in enumerate(selector.node_selector_terms)]
    kept = tuple(term for term in terms if term is not None)
    return kept or (NEVER,)


def label_selector(where: tuple[str, str], at: str, selector: wire.LabelSelector) -> LabelSelector:
    """A label selector: its labels and its expressions, each checked."""
    return LabelSelector(
        match_labels=dict(selector.match_labels),
        match_expressions=tuple(
            LabelRequirement(
                r.key,
                r.operator,
                requirement_values(
                    where, f"{at}.matchExpressions[{j}]", r.operator, r.values, LABEL_OPERATORS
                ),
            )
            for j, r in enumerate(selector.match_expressions)
        ),
    )
