"""SchedulingShard fields KAI added in v0.16-v0.17 (`scenarioSearchBudgets`, `goMemLimitRatio`,
`goMemLimit`): accepted (a shard carrying them is no longer refused as having unknown fields), checked as KAI
checks them, and reported as not applied with their field, since Kairos has no mechanism for them; a bad
value is reported naming its field and changes nothing else (the rest of the shard applies)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core.policy import Policy
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.scheduling_shard import NotApplied, ShardConfig, policy_of, shard_config
from tests.builders import shard_manifest

KAI_DEFAULT_BUDGETS = {
    "maxActionSearchDuration": {"default": "5m", "reclaim": "5m", "preempt": "5m", "consolidation": "5m"},
    "maxJobSearchDuration": "4m",
    "minJobSearchDuration": "0s",
    "maxGeneratorSearchDuration": {"default": "2m", "NodeLocalGreedy": "30s", "MultiNodeGang": "2m"},
}
"""KAI's design document's example: its defaults, written out."""


def config(spec: dict[str, Any]) -> ShardConfig:
    return shard_config(wire.decode_scheduling_shard(msgspec.json.encode(shard_manifest(**spec))))


def notes(spec: dict[str, Any]) -> dict[str, str]:
    return {note.field: note.reason for note in config(spec).not_applied}


# --- accepted and reported ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        pytest.param(
            {"scenarioSearchBudgets": KAI_DEFAULT_BUDGETS},
            "spec.scenarioSearchBudgets",
            "no wall-clock budget",
            id="KAI's default budgets",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {"maxJobSearchDuration": "0s", "minJobSearchDuration": "10m"}},
            "spec.scenarioSearchBudgets",
            "no wall-clock budget",
            id="a minimum under an unlimited maximum",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {}}, "spec.scenarioSearchBudgets", "clock", id="an empty block"
        ),
        pytest.param({"goMemLimitRatio": 0.8}, "spec.goMemLimitRatio", "Python", id="ratio"),
        pytest.param({"goMemLimitRatio": 1}, "spec.goMemLimitRatio", "Python", id="ratio of 1"),
        pytest.param({"goMemLimit": "2Gi"}, "spec.goMemLimit", "Python", id="limit"),
        pytest.param({"goMemLimit": 2147483648}, "spec.goMemLimit", "Python", id="limit as a number"),
    ],
)
def test_a_field_kairos_has_no_mechanism_for_is_accepted_and_reported_with_its_field(
    spec: dict[str, Any], field: str, words: str
) -> None:
    reported = notes(spec)
    assert list(reported) == [field]
    assert words in reported[field]


def test_the_rest_of_the_shard_applies_beside_them() -> None:
    spec = {
        "scenarioSearchBudgets": KAI_DEFAULT_BUDGETS,
        "goMemLimitRatio": 0.9,
        "goMemLimit": "4Gi",
        "placementStrategy": {"gpu": "spread"},
        "queueDepthPerAction": {"reclaim": 8},
    }
    shard = config(spec)
    assert [n.field for n in shard.not_applied] == [
        "spec.scenarioSearchBudgets",
        "spec.goMemLimitRatio",
        "spec.goMemLimit",
    ]
    policy = policy_of(shard)
    assert policy.gpu_placement == "spread"
    assert "consolidation" not in shard.actions
    assert policy.queue_depth_per_action == {"reclaim": 8}
    # Nothing of the three reaches the policy.
    assert msgspec.structs.replace(policy_of(config({"goMemLimit": "1Gi"})), plugins=None) == Policy()


# --- bad values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        pytest.param(
            {"scenarioSearchBudgets": {"maxActionSearchDuration": {"allocate": "1m"}}},
            "spec.scenarioSearchBudgets.maxActionSearchDuration.allocate",
            "not one of default, consolidation, reclaim, preempt",
            id="an action that searches no victims",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {"maxGeneratorSearchDuration": {"Greedy": "1m"}}},
            "spec.scenarioSearchBudgets.maxGeneratorSearchDuration.Greedy",
            "not one of default, NodeLocalGreedy, MultiNodeGang",
            id="an unknown generator",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {"maxActionSearchDuration": {"reclaim": "-1s"}}},
            "spec.scenarioSearchBudgets.maxActionSearchDuration.reclaim",
            "negative",
            id="a negative action budget",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {"maxJobSearchDuration": "soon"}},
            "spec.scenarioSearchBudgets.maxJobSearchDuration",
            "soon",
            id="not a duration",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {"minJobSearchDuration": "5m"}},
            "spec.scenarioSearchBudgets.minJobSearchDuration",
            "below maxJobSearchDuration (240s)",
            id="a minimum above KAI's default maximum",
        ),
        pytest.param(
            {"scenarioSearchBudgets": {"minJobSearchDuration": "1m", "maxJobSearchDuration": "1m"}},
            "spec.scenarioSearchBudgets.minJobSearchDuration",
            "below maxJobSearchDuration",
            id="a minimum equal to the maximum",
        ),
        pytest.param({"goMemLimitRatio": 0}, "spec.goMemLimitRatio", "(0, 1]", id="ratio 0"),
        pytest.param({"goMemLimitRatio": 1.5}, "spec.goMemLimitRatio", "(0, 1]", id="ratio above 1"),
        pytest.param({"goMemLimitRatio": -0.5}, "spec.goMemLimitRatio", "(0, 1]", id="negative ratio"),
        pytest.param({"goMemLimit": "lots"}, "spec.goMemLimit", "not a quantity", id="limit not a quantity"),
        pytest.param({"goMemLimit": "0"}, "spec.goMemLimit", "positive", id="limit of 0"),
        pytest.param({"goMemLimit": "-1Gi"}, "spec.goMemLimit", "positive", id="negative limit"),
    ],
)
def test_a_bad_value_is_reported_naming_its_field_and_the_shard_still_applies(
    spec: dict[str, Any], field: str, words: str
) -> None:
    shard = config({**spec, "placementStrategy": {"gpu": "spread"}})
    reported = notes({**spec, "placementStrategy": {"gpu": "spread"}})
    assert field in reported
    assert reported[field].startswith("invalid, ignored")
    assert words in reported[field]
    assert shard.gpu_placement == "spread"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"scenarioSearchBudgets": {"maxJobSearchDuration": 5}},
            "spec.scenarioSearchBudgets.maxJobSearchDuration",
        ),
        (
            {"scenarioSearchBudgets": {"maxActionSearchDuration": ["5m"]}},
            "spec.scenarioSearchBudgets.maxActionSearchDuration",
        ),
        ({"scenarioSearchBudgets": {"budget": "5m"}}, "spec.scenarioSearchBudgets.budget"),
        ({"goMemLimitRatio": "high"}, "spec.goMemLimitRatio"),
        ({"goMemLimit": True}, "spec.goMemLimit"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_when_the_shard_is_decoded_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    """As every other field of the spec: the shard's problem (InvalidSchedulingShard) names the path."""
    body = {"apiVersion": "kai.scheduler/v1", "kind": "SchedulingShard", "metadata": {"name": "default"}}
    with pytest.raises(InvalidObject) as refused:
        wire.convert(wire.SchedulingShard, {**body, "spec": spec})
    assert refused.value.field == field


def test_a_report_is_a_value_the_record_carries() -> None:
    shard = config({"goMemLimitRatio": 0.5})
    assert msgspec.json.decode(msgspec.json.encode(shard), type=ShardConfig).not_applied == (
        NotApplied(
            field="spec.goMemLimitRatio",
            reason="a Go runtime setting: Kairos's services are Python processes",
        ),
    )
