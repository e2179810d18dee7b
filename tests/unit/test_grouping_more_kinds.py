"""KAI v0.17's remaining kinds: AmlJob, SPOTRequest, RunaiJob, Grove's PodCliqueSet and PodGangSet (through
their PodGang, and NVIDIA Dynamo's DynamoGraphDeployment above them), and the skipped top owners.

Read from KAI's ``plugins/aml``, ``plugins/spotrequest``, ``plugins/runaijob``, ``plugins/grove`` and the
hub's table (``hub/hub.go``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import GrouperConfig
from services.state.controllers.grouping.skip import is_skipped
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import (
    NAMESPACE,
    group,
    group_or_none,
    make_owner,
    make_pod,
    owned_by,
    spec_of,
    sub_groups_of,
)
from tests.hostile import HOSTILE_JSON


def refusal(pod: wire.Pod, *owners: wire.Owner, **kwargs: Any) -> InvalidObject:
    with pytest.raises(InvalidObject) as info:
        group(pod, *owners, **kwargs)
    return info.value


# --- AmlJob ------------------------------------------------------------------------------------------------------
def aml_job(count: Any = None) -> wire.Owner:
    envs = {} if count is None else {"AZUREML_NODE_COUNT": count}
    return make_owner(
        "amlarc.azureml.com/v1alpha1", "AmlJob", "aml", spec={"job": {"options": {"envs": envs}}}
    )


def test_an_aml_job_is_one_gang_of_its_node_count() -> None:
    owner = aml_job(4)
    g = group(make_pod(owned_by(owner)), owner)
    assert (g.name, g.grouper, spec_of(g)["minMember"]) == ("pg-aml-uid-aml", "aml", 4)
    assert spec_of(g)["priorityClassName"] == "train"


@pytest.mark.parametrize("count", [None, "4", 4.5, -1, True, 2**31])
def test_an_aml_job_without_a_whole_node_count_is_refused_naming_the_field(count: Any) -> None:
    owner = aml_job(count)
    error = refusal(make_pod(owned_by(owner)), owner)
    assert (error.kind, error.name, error.field) == (
        "AmlJob",
        "ml/aml",
        "spec.job.options.envs.AZUREML_NODE_COUNT",
    )


# --- SPOTRequest ---------------------------------------------------------------------------------------------------
def test_a_spot_request_is_grouped_by_default_with_the_inference_class() -> None:
    owner = make_owner("egx.nvidia.io/v1", "SPOTRequest", "spot")
    g = group(make_pod(owned_by(owner)), owner)
    assert (g.name, g.grouper, spec_of(g)["minMember"]) == ("pg-spot-uid-spot", "spot-request", 1)
    assert spec_of(g)["priorityClassName"] == "inference"
    labelled = make_owner(
        "egx.nvidia.io/v1", "SPOTRequest", "spot", labels={keys.PRIORITY_CLASS_LABEL: "low"}
    )
    assert spec_of(group(make_pod(owned_by(labelled)), labelled))["priorityClassName"] == "low"


# --- RunaiJob -------------------------------------------------------------------------------------------------------
def runai_job(**spec: Any) -> wire.Owner:
    return make_owner("run.ai/v1", "RunaiJob", "hpo", spec=spec)


def legacy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
    }


@pytest.mark.parametrize(
    ("pod", "podgroup"),
    [
        ("hpo-0-0", "pg-hpo-0-uid-hpo"),
        ("hpo-1-0", "pg-hpo-1-uid-hpo"),
        ("hpo-1-3", "pg-hpo-1-uid-hpo"),
        ("single", "pg-single-uid-hpo"),
    ],
)
def test_a_runai_jobs_pods_share_a_podgroup_per_name_stem(pod: str, podgroup: str) -> None:
    owner = runai_job(parallelism=2)
    g = group(make_pod(owned_by(owner), name=pod), owner)
    assert (g.name, g.grouper) == (podgroup, "runai-job")


@pytest.mark.parametrize(
    ("spec", "existing", "podgroup"),
    [
        pytest.param(
            {}, "pg-hpo-uid-hpo", "pg-hpo-uid-hpo", id="a-single-job-keeps-the-jobs-legacy-podgroup"
        ),
        pytest.param(
            {"parallelism": 3}, "pg-hpo-0-0-uid-hpo", "pg-hpo-0-0-uid-hpo", id="a-parallel-job-keeps-the-pods"
        ),
        pytest.param(
            {"parallelism": 3}, "pg-hpo-uid-hpo", "pg-hpo-0-uid-hpo", id="a-parallel-job-ignores-the-jobs"
        ),
        pytest.param(
            {"parallelism": "3"}, "pg-hpo-uid-hpo", "pg-hpo-uid-hpo", id="a-parallelism-not-a-number-is-one"
        ),
        pytest.param({}, None, "pg-hpo-0-uid-hpo", id="no-legacy-podgroup"),
    ],
)
def test_a_runai_job_keeps_a_legacy_podgroup_that_exists(
    spec: dict[str, Any], existing: str | None, podgroup: str
) -> None:
    owner = runai_job(**spec)
    pod = make_pod(owned_by(owner), name="hpo-0-0")
    assert group(pod, owner, objects=[legacy(existing)] if existing else []).name == podgroup


def test_legacy_podgroups_are_not_searched_when_the_switch_is_off() -> None:
    owner = runai_job()
    pod = make_pod(owned_by(owner), name="hpo-0-0")
    config = GrouperConfig(search_legacy_podgroups=False)
    assert group(pod, owner, objects=[legacy("pg-hpo-uid-hpo")], config=config).name == "pg-hpo-0-uid-hpo"


# --- Grove ----------------------------------------------------------------------------------------------------------
def pcs(**labels: str) -> wire.Owner:
    return make_owner("grove.io/v1alpha1", "PodCliqueSet", "serve", labels=labels)


def clique(name: str, minimum: Any, *pods: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "minReplicas": minimum,
        "podReferences": [{"namespace": NAMESPACE, "name": p} for p in pods],
        **extra,
    }


def podgang(
    *cliques: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "scheduler.grove.io/v1alpha1",
        "kind": "PodGang",
        "metadata": {
            "name": "serve-0",
            "namespace": NAMESPACE,
            "uid": "uid-gang",
            "labels": {},
            "annotations": annotations or {},
        },
        "spec": {"podgroups": list(cliques), **spec},
    }


def grove_pod(owner: wire.Owner, name: str = "serve-0-prefill-0") -> wire.Pod:
    return make_pod(owned_by(owner), labels={"grove.io/podgang": "serve-0"}, name=name)


GANG = podgang(
    clique("serve-0-frontend", 1, "serve-0-frontend-0"),
    clique("serve-0-prefill", 2, "serve-0-prefill-0", "serve-0-prefill-1"),
    clique("serve-0-decode", 2, "serve-0-decode-0", "serve-0-decode-1"),
    priorityClassName="inference",
)


def test_a_podcliquesets_pods_are_grouped_by_their_podgang() -> None:
    owner = pcs()
    g = group(grove_pod(owner), owner, objects=[GANG])
    assert (g.name, g.grouper) == ("pg-serve-0-uid-gang", "grove")
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "scheduler.grove.io/v1alpha1", "kind": "PodGang", "name": "serve-0", "uid": "uid-gang"}
    ]
    spec = spec_of(g)
    assert (spec["minMember"], spec["priorityClassName"]) == (5, "inference")
    assert {n: sg["minMember"] for n, sg in sub_groups_of(g).items()} == {
        "serve-0-frontend": 1,
        "serve-0-prefill": 2,
        "serve-0-decode": 2,
    }
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: "serve-0-prefill"}


def test_a_podgangset_is_grouped_the_same_way() -> None:
    owner = make_owner("grove.io/v1alpha1", "PodGangSet", "serve")
    assert group(grove_pod(owner), owner, objects=[GANG]).grouper == "grove"


def test_topology_group_configs_become_parent_sub_groups_with_min_sub_group() -> None:
    gang = podgang(
        clique(
            "serve-0-prefill",
            2,
            "serve-0-prefill-0",
            topologyConstraint={"packConstraint": {"required": "host"}},
        ),
        clique("serve-0-decode", 2, "serve-0-decode-0"),
        annotations={"grove.io/topology-name": "dc"},
        topologyConstraint={"packConstraint": {"preferred": "zone"}},
        topologyConstraintGroupConfigs=[
            {
                "name": "disagg",
                "podGroupNames": ["serve-0-prefill", "serve-0-decode"],
                "topologyConstraint": {"packConstraint": {"required": "rack"}},
            },
            {"name": "unused", "podGroupNames": []},
        ],
    )
    owner = pcs()
    g = group(grove_pod(owner), owner, objects=[gang])
    subs = sub_groups_of(g)
    assert subs["disagg"] == {
        "name": "disagg",
        "minSubGroup": 2,
        "topologyConstraint": {"topology": "dc", "requiredTopologyLevel": "rack"},
    }
    assert "unused" not in subs
    assert subs["serve-0-prefill"]["parent"] == "disagg"
    assert subs["serve-0-prefill"]["topologyConstraint"] == {
        "topology": "dc",
        "requiredTopologyLevel": "host",
    }
    assert spec_of(g)["topologyConstraint"] == {"topology": "dc", "preferredTopologyLevel": "zone"}


def test_the_top_owners_labels_and_annotations_fill_in_what_the_podgang_lacks() -> None:
    owner = make_owner(
        "grove.io/v1alpha1",
        "PodCliqueSet",
        "serve",
        labels={
            keys.QUEUE_LABEL: "serving",
            keys.PRIORITY_CLASS_LABEL: "anything",
            keys.PREEMPTIBILITY_LABEL: "non-preemptible",
        },
        annotations={
            keys.TOPOLOGY_ANNOTATION: "dc",
            keys.TOPOLOGY_REQUIRED_ANNOTATION: "rack",
            keys.PREEMPTION_DELAY_ANNOTATION: "1m",
        },
    )
    g = group(grove_pod(owner), owner, objects=[GANG])
    spec = spec_of(g)
    assert spec["priorityClassName"] == "anything"
    assert (spec["preemptibility"], spec["preemptionDelay"]) == ("non-preemptible", "1m0s")
    assert spec["topologyConstraint"] == {"topology": "dc", "requiredTopologyLevel": "rack"}
    assert g.podgroup["metadata"]["labels"][keys.QUEUE_LABEL] == "serving"


def test_a_dynamo_graph_deployment_is_skipped_for_its_podcliqueset_and_lends_it_its_labels() -> None:
    dgd = make_owner(
        "nvidia.com/v1beta1", "DynamoGraphDeployment", "llm", labels={keys.QUEUE_LABEL: "inference-q"}
    )
    owner = make_owner("grove.io/v1alpha1", "PodCliqueSet", "serve", owner=owned_by(dgd))
    g = group(grove_pod(owner), owner, dgd, objects=[GANG])
    assert g.grouper == "grove"
    assert g.podgroup["metadata"]["labels"][keys.QUEUE_LABEL] == "inference-q"


@pytest.mark.parametrize(
    ("gang", "labels", "kind", "field"),
    [
        pytest.param(GANG, {}, "Pod", "metadata.labels[grove.io/podgang]", id="no-podgang-label"),
        pytest.param(
            None, {"grove.io/podgang": "serve-0"}, "Pod", "metadata.labels[grove.io/podgang]", id="no-podgang"
        ),
        pytest.param(
            podgang(clique("c", 0, "p")),
            None,
            "PodGang",
            "spec.podgroups[0].minReplicas",
            id="min-replicas-0",
        ),
        pytest.param(
            podgang({"name": "c", "minReplicas": 1}),
            None,
            "PodGang",
            "spec.podgroups[0].podReferences",
            id="no-refs",
        ),
        pytest.param(
            podgang({"name": "c", "minReplicas": 1, "podReferences": [{"namespace": "other", "name": "p"}]}),
            None,
            "PodGang",
            "spec.podgroups[0].podReferences[0]",
            id="a-pod-of-another-namespace",
        ),
        pytest.param(
            podgang(clique("c", 1, "p"), topologyConstraint={"packConstraint": {"required": "rack"}}),
            None,
            "PodGang",
            "spec.topologyConstraint.packConstraint",
            id="levels-without-a-topology",
        ),
        pytest.param(
            podgang(clique("c", 1, "p"), priorityClassName=5),
            None,
            "PodGang",
            "spec.priorityClassName",
            id="class-not-text",
        ),
    ],
)
def test_a_podgang_grove_cannot_be_grouped_by_refuses_the_pod_naming_the_field(
    gang: dict[str, Any] | None, labels: dict[str, str] | None, kind: str, field: str
) -> None:
    owner = pcs()
    pod = make_pod(
        owned_by(owner), labels={"grove.io/podgang": "serve-0"} if labels is None else labels, name="p"
    )
    error = refusal(pod, owner, objects=[gang] if gang else [])
    assert (error.kind, error.field) == (kind, field)


@given(
    value=HOSTILE_JSON,
    where=st.sampled_from(
        ["podgroups", "clique", "minReplicas", "podReferences", "configs", "pack", "names"]
    ),
)
@settings(max_examples=150, deadline=None)
def test_a_hostile_podgang_is_grouped_or_refused_naming_the_podgang_or_pod(value: Any, where: str) -> None:
    gang = copy.deepcopy(GANG)
    spec = gang["spec"]
    spec["topologyConstraintGroupConfigs"] = [{"name": "p", "podGroupNames": ["serve-0-prefill"]}]
    if where == "podgroups":
        spec["podgroups"] = value
    elif where == "clique":
        spec["podgroups"][1] = value
    elif where == "minReplicas":
        spec["podgroups"][1]["minReplicas"] = value
    elif where == "podReferences":
        spec["podgroups"][1]["podReferences"] = value
    elif where == "configs":
        spec["topologyConstraintGroupConfigs"] = value
    elif where == "pack":
        spec["topologyConstraint"] = {"packConstraint": value}
    else:
        spec["topologyConstraintGroupConfigs"][0]["podGroupNames"] = value
    owner = pcs()
    error: InvalidObject | None = None
    try:
        g = group_or_none(grove_pod(owner), owner, objects=[gang])
    except InvalidObject as exc:
        error, g = exc, None
    if error is not None:
        assert error.kind in ("PodGang", "Pod")
        assert len(str(error)) < 400
    else:
        assert g is not None
        assert spec_of(g)["minMember"] == sum(
            sg.get("minMember", 0) for sg in spec_of(g).get("subGroups", [])
        )


# --- skipped top owners ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gvk", "skipped"),
    [
        (("argoproj.io", "v1alpha1", "Workflow"), True),
        (("argoproj.io", "v1", "Workflow"), False),
        (("trainer.kubeflow.org", "v1alpha1", "TrainJob"), True),
        (("trainer.kubeflow.org", "v1", "TrainJob"), False),
        (("nvidia.com", "v1alpha1", "DynamoGraphDeployment"), True),
        (("nvidia.com", "v1beta1", "DynamoGraphDeployment"), True),
        (("run.ai", "v2", "TrainingWorkload"), True),
        (("run.ai", "v1", "InteractiveWorkload"), True),
        (("run.ai", "v1", "DistributedWorkload"), True),
        (("run.ai", "v1", "InferenceWorkload"), True),
        (("run.ai", "v1", "DistributedInferenceWorkload"), True),
        (("run.ai", "v1alpha1", "WorkloadRunner"), True),
        (("run.ai", "v1", "RunaiJob"), False),
        (("grove.io", "v1alpha1", "PodCliqueSet"), False),
    ],
)
def test_kais_hub_skips_these_top_owners_for_the_owner_below(
    gvk: tuple[str, str, str], skipped: bool
) -> None:
    assert is_skipped(gvk) is skipped
