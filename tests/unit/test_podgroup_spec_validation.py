"""A PodGroup whose spec could never be scheduled as written is refused by name and field, as KAI v0.17's
PodGroup webhook refuses it: a preemption delay that is not a non-negative duration, a ``minSubGroup``
below 1 or above the direct child sub-groups, a sub-group name that is not a DNS label.
The mirror then holds back that PodGroup alone, with a Warning naming the field (`test_hostile_input`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import translate, wire


def podgroup(**spec: Any) -> wire.PodGroup:
    return wire.convert(
        wire.PodGroup,
        {"metadata": {"name": "train", "namespace": "team"}, "spec": {"queue": "q", **spec}},
    )


def refusal(**spec: Any) -> str:
    with pytest.raises(InvalidObject) as caught:
        translate.podgroup_of(podgroup(**spec), priority_classes={})
    return str(caught.value)


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        pytest.param(
            {"preemptionDelay": "soon"}, "spec.preemptionDelay", "not a duration", id="not a duration"
        ),
        pytest.param(
            {"preemptionDelay": "-5m"}, "spec.preemptionDelay", "must not be negative", id="negative"
        ),
        pytest.param({"minSubGroup": -1}, "spec.minSubGroup", "greater than 0", id="negative minSubGroup"),
        pytest.param({"minSubGroup": 0}, "spec.minSubGroup", "greater than 0", id="minSubGroup of 0"),
        pytest.param(
            {"minSubGroup": 2, "subGroups": [{"name": "a", "minMember": 1}]},
            "spec.minSubGroup",
            "exceeds the number of direct child SubGroups (1)",
            id="minSubGroup above the children",
        ),
        pytest.param(
            {"subGroups": [{"name": "has space", "minMember": 1}]},
            "spec.subGroups[0].name",
            "must be a DNS label",
            id="a name with a space",
        ),
        pytest.param(
            {"subGroups": [{"name": "a/b", "minMember": 1}]},
            "spec.subGroups[0].name",
            "must be a DNS label",
            id="a name with a slash",
        ),
        pytest.param(
            {"subGroups": [{"name": "x" * 64, "minMember": 1}]},
            "spec.subGroups[0].name",
            "at most 63",
            id="a 64-character name",
        ),
        pytest.param(
            {"subGroups": [{"name": "-lead", "minMember": 1}]},
            "spec.subGroups[0].name",
            "starting and ending with a letter or digit",
            id="a name starting with a dash",
        ),
        pytest.param(
            {"subGroups": [{"name": "Master", "minMember": 1}]},
            "spec.subGroups[0].name",
            "lower-case",
            id="upper case (parents are matched in lower case)",
        ),
        pytest.param(
            {"subGroups": [{"name": "worker_0", "minMember": 1}]},
            "spec.subGroups[0].name",
            "must be a DNS label",
            id="an underscore",
        ),
        pytest.param(
            {"subGroups": [{"name": "p", "minSubGroup": -2}, {"name": "c", "parent": "p", "minMember": 1}]},
            "spec.subGroups[0].minSubGroup",
            "greater than 0",
            id="a negative minSubGroup on a sub-group",
        ),
    ],
)
def test_a_spec_that_could_never_be_scheduled_is_refused_naming_the_field(
    spec: dict[str, Any], field: str, says: str
) -> None:
    message = refusal(**spec)
    assert "team/train" in message
    assert field in message
    assert says in message


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"preemptionDelay": "0s"}, id="no delay"),
        pytest.param({"preemptionDelay": "1h30m"}, id="a delay"),
        pytest.param({"subGroups": [{"name": "worker-0", "minMember": 0}]}, id="an elastic sub-group"),
        pytest.param(
            {"minSubGroup": 1, "subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "minMember": 1}]},
            id="one of two sub-groups",
        ),
    ],
)
def test_a_well_formed_spec_is_read(spec: dict[str, Any]) -> None:
    assert translate.podgroup_of(podgroup(**spec), priority_classes={}).name == "train"


@given(name=st.text(max_size=80), delay=st.text(max_size=20))
def test_any_sub_group_name_or_delay_is_read_or_refused_by_field(name: str, delay: str) -> None:
    spec = {"preemptionDelay": delay, "subGroups": [{"name": name, "minMember": 1}]}
    problem = ""
    try:
        translate.podgroup_of(podgroup(**spec), priority_classes={})
    except InvalidObject as exc:
        problem = str(exc)
    assert not problem or "spec.preemptionDelay" in problem or "spec.subGroups[0].name" in problem
