"""Specs: a pod's affinity, anti-affinity and tolerations as the core reads them (`shared.kube.translate`).

Every operator and field kube-scheduler honours is kept; a term's namespaces are resolved against the pod
that declares it; what the API server would refuse is an error naming the pod and the field."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidObject
from shared.kube import translate
from shared.model import (
    LabelRequirement,
    LabelSelector,
    LabelSelectorTerm,
    NodeSelectorRequirement,
    PodAffinityTerm,
    PreferredNodeTerm,
)
from shared.model.objects import Toleration
from tests.unit.test_kube_translate import pod, pod_doc

HOST = "kubernetes.io/hostname"


def translated(affinity: dict[str, Any] | None = None, **spec: Any) -> Any:
    labels = spec.pop("labels", None)
    doc = pod_doc(labels=labels, **({"affinity": affinity} if affinity is not None else {}), **spec)
    return translate.pod_of(pod(doc))


def required(kind: str, *terms: dict[str, Any]) -> dict[str, Any]:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def preferred(kind: str, *weighted: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    return {
        kind: {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": w, "podAffinityTerm": term} for w, term in weighted
            ]
        }
    }


@pytest.mark.parametrize(
    ("expression", "kept"),
    [
        (
            {"key": "app", "operator": "In", "values": ["db", "cache"]},
            LabelRequirement("app", "In", ("db", "cache")),
        ),
        ({"key": "app", "operator": "NotIn", "values": ["db"]}, LabelRequirement("app", "NotIn", ("db",))),
        ({"key": "app", "operator": "Exists"}, LabelRequirement("app", "Exists")),
        ({"key": "app", "operator": "DoesNotExist"}, LabelRequirement("app", "DoesNotExist")),
    ],
)
def test_every_label_selector_operator_is_kept(expression: dict[str, Any], kept: LabelRequirement) -> None:
    term = {"labelSelector": {"matchExpressions": [expression]}, "topologyKey": HOST}
    p = translated(required("podAffinity", term))
    assert p.pod_affinity == (
        PodAffinityTerm(
            selector=LabelSelector(match_expressions=(kept,)), topology_key=HOST, namespaces=("team-a",)
        ),
    )


def test_a_term_naming_no_namespace_selects_in_the_pods_own_and_listed_ones_are_kept() -> None:
    own = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
    listed = {**own, "namespaces": ["team-b", "team-c"]}
    p = translated(required("podAntiAffinity", own, listed))
    assert [t.namespaces for t in p.pod_anti_affinity] == [("team-a",), ("team-b", "team-c")]
    assert not any(t.all_namespaces for t in p.pod_anti_affinity)


def test_an_empty_namespace_selector_selects_every_namespace() -> None:
    term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone", "namespaceSelector": {}}
    (kept,) = translated(required("podAffinity", term)).pod_affinity
    assert kept.all_namespaces
    assert kept.namespace_selector is None


def test_a_namespace_selector_is_kept_as_given_beside_the_listed_namespaces() -> None:
    # Kubernetes: the listed namespaces and those the selector matches; not the pod's own one as well.
    chosen = {
        "matchLabels": {"team": "a"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["dev"]}],
    }
    alone = {
        "labelSelector": {"matchLabels": {"app": "db"}},
        "topologyKey": "zone",
        "namespaceSelector": chosen,
    }
    listed = {**alone, "namespaces": ["team-c"]}
    p = translated({**required("podAntiAffinity", alone, listed), **preferred("podAffinity", (10, alone))})
    selector = LabelSelector(
        match_labels={"team": "a"}, match_expressions=(LabelRequirement("tier", "NotIn", ("dev",)),)
    )
    assert [(t.namespaces, t.namespace_selector, t.all_namespaces) for t in p.pod_anti_affinity] == [
        ((), selector, False),
        (("team-c",), selector, False),
    ]
    (weighted,) = p.preferred_pod_affinity
    assert (weighted.weight, weighted.namespaces, weighted.namespace_selector) == (10, (), selector)


def test_match_label_keys_and_mismatch_label_keys_are_merged_with_the_pods_own_values() -> None:
    term = {
        "labelSelector": {"matchLabels": {"app": "web"}},
        "topologyKey": HOST,
        "matchLabelKeys": ["rollout", "absent"],
        "mismatchLabelKeys": ["tenant"],
    }
    (kept,) = translated(
        required("podAntiAffinity", term), labels={"rollout": "r7", "tenant": "t1"}
    ).pod_anti_affinity
    assert kept.selector == LabelSelector(
        match_labels={"app": "web"},
        match_expressions=(
            LabelRequirement("rollout", "In", ("r7",)),
            LabelRequirement("tenant", "NotIn", ("t1",)),
        ),
    )


def test_preferred_pod_affinity_and_anti_affinity_keep_their_weights() -> None:
    near = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
    apart = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOST}
    p = translated({**preferred("podAffinity", (30, near)), **preferred("podAntiAffinity", (100, apart))})
    assert [(t.weight, t.topology_key) for t in p.preferred_pod_affinity] == [(30, "zone")]
    assert [(t.weight, t.topology_key) for t in p.preferred_pod_anti_affinity] == [(100, HOST)]
    assert p.pod_affinity == p.pod_anti_affinity == ()


def test_preferred_node_affinity_keeps_each_terms_weight_and_drops_empty_terms() -> None:
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 5,
                    "preference": {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["3"]}]},
                },
                {"weight": 7, "preference": {}},
            ]
        }
    }
    assert translated(affinity).preferred_node_affinity == (
        PreferredNodeTerm(5, LabelSelectorTerm((NodeSelectorRequirement("gpu", "Gt", ("3",)),))),
    )


def test_an_anti_affinity_term_without_a_selector_selects_nothing_and_is_dropped() -> None:
    assert translated(required("podAntiAffinity", {"topologyKey": "zone"})).pod_anti_affinity == ()


def test_tolerations_keep_operator_and_effect() -> None:
    tolerations = [
        {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"},
        {"operator": "Exists"},
    ]
    assert translated(tolerations=tolerations).tolerations == (
        Toleration("gpu", "Equal", "yes", "NoSchedule"),
        Toleration("spot", "Exists", "", "PreferNoSchedule"),
        Toleration("", "Exists", "", ""),
    )


PA = "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
NA = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        (
            {
                "affinity": required(
                    "podAffinity",
                    {
                        "labelSelector": {
                            "matchExpressions": [{"key": "a", "operator": "Like", "values": ["x"]}]
                        },
                        "topologyKey": "z",
                    },
                )
            },
            f"{PA}.labelSelector.matchExpressions[0].operator",
            "must be one of",
        ),
        (
            {
                "affinity": required(
                    "podAffinity",
                    {
                        "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
                        "topologyKey": "z",
                    },
                )
            },
            f"{PA}.labelSelector.matchExpressions[0].values",
            "must not be empty",
        ),
        (
            {
                "affinity": required(
                    "podAffinity",
                    {
                        "labelSelector": {
                            "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                        },
                        "topologyKey": "z",
                    },
                )
            },
            f"{PA}.labelSelector.matchExpressions[0].values",
            "must be empty",
        ),
        (
            {"affinity": required("podAffinity", {"labelSelector": {"matchLabels": {"a": "b"}}})},
            f"{PA}.topologyKey",
            "missing",
        ),
        (
            {
                "affinity": required(
                    "podAffinity",
                    {
                        "labelSelector": {},
                        "topologyKey": "z",
                        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Gt"}]},
                    },
                )
            },
            f"{PA}.namespaceSelector.matchExpressions[0].operator",
            "must be one of",
        ),
        (
            {
                "affinity": required(
                    "podAffinity",
                    {
                        "labelSelector": {},
                        "topologyKey": "z",
                        "matchLabelKeys": ["k"],
                        "mismatchLabelKeys": ["k"],
                    },
                )
            },
            f"{PA}.mismatchLabelKeys",
            "also in matchLabelKeys",
        ),
        (
            {"affinity": preferred("podAntiAffinity", (0, {"labelSelector": {}, "topologyKey": "z"}))},
            "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
            "within 1-100",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["many"]}]}
                            ]
                        }
                    }
                }
            },
            f"{NA}.matchExpressions[0].values",
            "one integer",
        ),
        (
            {"tolerations": [{"key": "a", "operator": "Maybe"}]},
            "spec.tolerations[0].operator",
            "Equal or Exists",
        ),
        (
            {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
            "spec.tolerations[0].value",
            "must be empty",
        ),
        (
            {"tolerations": [{"key": "a", "value": "x", "effect": "Sometimes"}]},
            "spec.tolerations[0].effect",
            "must be one of",
        ),
    ],
)
def test_what_the_api_server_would_refuse_is_an_error_naming_the_pod_and_field(
    spec: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InvalidObject) as info:
        translated(**spec)
    assert (info.value.kind, info.value.name, info.value.field) == ("Pod", "team-a/train-0", field)
    assert problem in str(info.value)
