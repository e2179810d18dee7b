"""A pod's ``topologySpreadConstraints`` translated as kube-scheduler reads them (`translate.pod_of`), and
the input the API server's validation refuses named by its field. The pod documents are those of
test_kube_translate."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidObject
from shared.kube import translate
from shared.model import LabelRequirement, LabelSelector, TopologySpreadConstraint
from tests.unit.test_kube_translate import pod, pod_doc

ZONE = "topology.kubernetes.io/zone"
WEB = {"matchLabels": {"app": "web"}}


def constraint(**fields: Any) -> dict[str, Any]:
    """A valid constraint over zones counting app=web pods, with `fields` changed (None: left out)."""
    out = {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": WEB}
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}


def spread_of(*constraints: dict[str, Any], labels: dict[str, str] | None = None) -> Any:
    return translate.pod_of(
        pod(pod_doc(labels=labels, topologySpreadConstraints=list(constraints)))
    ).topology_spread


def test_unset_optional_fields_take_kube_scheduler_s_defaults() -> None:
    assert spread_of(constraint()) == (
        TopologySpreadConstraint(
            max_skew=1,
            topology_key=ZONE,
            when_unsatisfiable="DoNotSchedule",
            selector=LabelSelector(match_labels={"app": "web"}),
            min_domains=1,
            node_affinity_policy="Honor",
            node_taints_policy="Ignore",
        ),
    )


def test_every_field_is_carried_over() -> None:
    selector = {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    (got,) = spread_of(
        constraint(
            maxSkew=2,
            labelSelector=selector,
            minDomains=3,
            nodeAffinityPolicy="Ignore",
            nodeTaintsPolicy="Honor",
        )
    )
    assert got == TopologySpreadConstraint(
        max_skew=2,
        topology_key=ZONE,
        selector=LabelSelector(
            match_labels={"app": "web"}, match_expressions=(LabelRequirement("tier", "Exists"),)
        ),
        min_domains=3,
        node_affinity_policy="Ignore",
        node_taints_policy="Honor",
    )


def test_a_pod_without_constraints_has_none() -> None:
    assert translate.pod_of(pod(pod_doc())).topology_spread == ()


def test_no_label_selector_selects_no_pod() -> None:
    (got,) = spread_of(constraint(labelSelector=None, whenUnsatisfiable="ScheduleAnyway"))
    assert (got.selector, got.when_unsatisfiable) == (None, "ScheduleAnyway")


def test_match_label_keys_narrow_the_selector_to_the_pod_s_own_values() -> None:
    labels = {"app": "web", "pod-template-hash": "7f9c"}
    (got,) = spread_of(constraint(matchLabelKeys=["pod-template-hash", "not-on-the-pod"]), labels=labels)
    assert got.selector == LabelSelector(match_labels={"app": "web", "pod-template-hash": "7f9c"})


def test_a_match_label_key_the_selector_already_names_is_not_merged_twice() -> None:
    # Newer API servers merge matchLabelKeys into the stored labelSelector themselves.
    merged = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "h", "operator": "In", "values": ["1"]}],
    }
    (got,) = spread_of(
        constraint(labelSelector=merged, matchLabelKeys=["h"]), labels={"app": "web", "h": "1"}
    )
    assert got.selector == LabelSelector(
        match_labels={"app": "web"}, match_expressions=(LabelRequirement("h", "In", ("1",)),)
    )


AT = "spec.topologySpreadConstraints"
BAD = [
    (constraint(maxSkew=0), f"{AT}[0].maxSkew", "must be >= 1, got 0"),
    (constraint(maxSkew=None), f"{AT}[0].maxSkew", "missing"),
    (constraint(topologyKey=None), f"{AT}[0].topologyKey", "missing"),
    (constraint(whenUnsatisfiable="Sometimes"), f"{AT}[0].whenUnsatisfiable", "'Sometimes', expected one of"),
    (constraint(whenUnsatisfiable=None), f"{AT}[0].whenUnsatisfiable", "missing"),
    (constraint(minDomains=0), f"{AT}[0].minDomains", "must be >= 1"),
    (constraint(minDomains=2, whenUnsatisfiable="ScheduleAnyway"), f"{AT}[0].minDomains", "DoNotSchedule"),
    (constraint(nodeAffinityPolicy="Always"), f"{AT}[0].nodeAffinityPolicy", "expected one of Honor, Ignore"),
    (constraint(nodeTaintsPolicy="honor"), f"{AT}[0].nodeTaintsPolicy", "expected one of Honor, Ignore"),
    (
        constraint(labelSelector={"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}),
        f"{AT}[0].labelSelector.matchExpressions[0].operator",
        "must be one of DoesNotExist, Exists, In, NotIn, got 'Gt'",
    ),
    (
        constraint(labelSelector={"matchExpressions": [{"key": "app", "operator": "In"}]}),
        f"{AT}[0].labelSelector.matchExpressions[0].values",
        "must not be empty",
    ),
    (
        constraint(
            labelSelector={"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}
        ),
        f"{AT}[0].labelSelector.matchExpressions[0].values",
        "must be empty",
    ),
    (
        constraint(labelSelector=None, matchLabelKeys=["app"]),
        f"{AT}[0].matchLabelKeys",
        "without a labelSelector",
    ),
]


@pytest.mark.parametrize(
    ("bad", "field", "problem"), BAD, ids=[b[1].rsplit(".", 1)[1] + ":" + b[2] for b in BAD]
)
def test_invalid_constraints_name_the_pod_and_the_field(
    bad: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InvalidObject) as info:
        spread_of(bad)
    assert (info.value.kind, info.value.name, info.value.field) == ("Pod", "team-a/train-0", field)
    assert problem in info.value.problem


def test_the_field_path_counts_the_constraints() -> None:
    with pytest.raises(InvalidObject) as info:
        spread_of(constraint(), constraint(topologyKey="kubernetes.io/hostname", maxSkew=-1))
    assert info.value.field == f"{AT}[1].maxSkew"


def test_two_constraints_of_one_kind_on_one_key_are_refused_as_the_api_server_does() -> None:
    with pytest.raises(InvalidObject) as info:
        spread_of(constraint(), constraint(maxSkew=2))
    assert info.value.field == f"{AT}[1].topologyKey"
    assert "duplicate" in info.value.problem
