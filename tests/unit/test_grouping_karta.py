"""KAI v0.17's Karta fallback grouper: a kind no plugin claims, grouped as the one Karta describing it says.

Read from KAI's ``plugins/karta`` (``hub.go``: which Karta applies; ``grouper.go``: the ``podGroup`` and
alpha ``podGroups`` forms) and run-ai/karta's ``instructions`` (a subtree's scale, a pod's component).
The workload is a made-up ``jobs.example.com/v1`` PyFlow with one master and two workers.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import karta_paths
from services.state.controllers.grouping.karta import karta_for, read_karta
from shared.errors import InvalidObject
from shared.kube import wire
from tests.grouping import group, group_or_none, make_owner, make_pod, owned_by, spec_of, sub_groups_of
from tests.hostile import HOSTILE_JSON

GVK = ("jobs.example.com", "v1", "PyFlow")


def component(name: str, role: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "ownerRef": "pyflow",
        "specDefinition": {"podTemplateSpecPath": f".spec.{name}.template"},
        "scaleDefinition": {"replicasPath": f".spec.{name}.replicas"},
        "podSelector": {"componentTypeSelector": {"keyPath": ".metadata.labels.role", "value": role}},
        **extra,
    }


def karta(
    gang: dict[str, Any] | None, *, name: str = "pyflow", gvk: tuple[str, str, str] = GVK
) -> dict[str, Any]:
    group_, version, kind = gvk
    return {
        "apiVersion": "run.ai/v1alpha1",
        "kind": "Karta",
        "metadata": {
            "name": name,
            "labels": {
                "run.ai/karta-group": group_,
                "run.ai/karta-version": version,
                "run.ai/karta-kind": kind,
            },
        },
        "spec": {
            "structureDefinition": {
                "rootComponent": {
                    "name": "pyflow",
                    "kind": {"group": group_, "version": version, "kind": kind},
                },
                "childComponents": [component("master", "master"), component("worker", "worker")],
            },
            "instructions": {"gangScheduling": gang},
        },
    }


V2 = {
    "podGroup": {
        "name": "training",
        "topology": {
            "topologyName": "rack-topology",
            "preferredTopologyLevel": "rack",
            "requiredTopologyLevel": "zone",
        },
        "subGroups": [
            {"componentName": "master"},
            {
                "componentName": "worker",
                "topology": {
                    "topologyName": "gpu-topology",
                    "preferredTopologyLevel": "host",
                    "requiredTopologyLevel": "rack",
                },
            },
        ],
    }
}
ALPHA = {
    "podGroups": [
        {
            "name": "job",
            "members": [{"componentName": "pyflow", "groupByKeyPaths": ['.metadata.labels["job-name"]']}],
        }
    ]
}


def pyflow(master: Any = 1, workers: Any = 2) -> wire.Owner:
    return make_owner(
        "jobs.example.com/v1",
        "PyFlow",
        "pyflow-example",
        spec={"master": {"replicas": master}, "worker": {"replicas": workers}},
    )


def pod_of(owner: wire.Owner, role: str = "worker", **labels: str) -> wire.Pod:
    return make_pod(
        owned_by(owner),
        labels={"role": role, "job-name": "pyflow-example", **labels},
        name=f"pyflow-{role}-0",
    )


# --- which Karta applies ---------------------------------------------------------------------------------------
def test_the_one_karta_for_exactly_the_kind_applies() -> None:
    found = karta_for([karta(V2)], GVK)
    assert found is not None
    assert found.name == "pyflow"
    assert karta_for([karta(V2)], ("jobs.example.com", "v2", "PyFlow")) is None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda k: k["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"), id="being-deleted"
        ),
        pytest.param(
            lambda k: k["spec"]["instructions"].update(gangScheduling=None), id="no-gang-instructions"
        ),
        pytest.param(
            lambda k: k["spec"]["instructions"].update(gangScheduling={"podGroups": []}), id="no-pod-groups"
        ),
        pytest.param(
            lambda k: k["metadata"]["labels"].pop("run.ai/karta-kind"), id="not-labelled-with-the-kind"
        ),
        pytest.param(
            lambda k: k["spec"]["structureDefinition"]["rootComponent"].pop("kind"), id="no-root-kind"
        ),
        pytest.param(
            lambda k: k["spec"]["structureDefinition"]["childComponents"][0]["podSelector"][
                "componentTypeSelector"
            ].update(keyPath=".. | .metadata.name"),
            id="a-path-kairos-does-not-read",
        ),
        pytest.param(
            lambda k: k["spec"]["structureDefinition"]["childComponents"][0].update(ownerRef="nowhere"),
            id="a-dangling-owner",
        ),
    ],
)
def test_a_karta_that_cannot_apply_is_passed_over(change: Any) -> None:
    doc = karta(V2)
    change(doc)
    assert karta_for([doc], GVK) is None


def test_an_unreadable_karta_does_not_hide_a_valid_one_but_two_valid_ones_cancel_out() -> None:
    bad = karta(V2, name="bad")
    bad["spec"]["structureDefinition"]["childComponents"][1]["scaleDefinition"]["replicasPath"] = "[.spec]"
    found = karta_for([bad, karta(V2, name="good")], GVK)
    assert found is not None
    assert found.name == "good"
    assert karta_for([karta(V2, name="a"), karta(V2, name="b")], GVK) is None


def test_a_kind_a_module_claims_keeps_its_plugin_whatever_kartas_exist() -> None:
    j = make_owner("batch/v1", "Job", "train")
    g = group(make_pod(owned_by(j)), j, kartas=[karta(ALPHA, gvk=("batch", "v1", "Job"))])
    assert g.grouper == "batch-job"


def test_without_kartas_an_unclaimed_kind_gets_the_default_plugin() -> None:
    owner = pyflow()
    assert group(pod_of(owner), owner).grouper == "default"
    assert group(pod_of(owner), owner, kartas=[]).grouper == "default"


# --- the podGroup form -------------------------------------------------------------------------------------------
def test_the_pod_group_form_makes_one_podgroup_with_a_sub_group_per_component() -> None:
    owner = pyflow()
    g = group(pod_of(owner, "worker"), owner, kartas=[karta(V2)])
    assert (g.name, g.grouper) == ("pg-uid-pyflow-example-training", "karta pyflow")
    spec = spec_of(g)
    assert spec["minSubGroup"] == 2
    assert spec["topologyConstraint"] == {
        "topology": "rack-topology",
        "requiredTopologyLevel": "zone",
        "preferredTopologyLevel": "rack",
    }
    subs = sub_groups_of(g)
    assert subs["master"] == {"name": "master", "minMember": 1}
    assert subs["worker"]["minMember"] == 2
    assert subs["worker"]["topologyConstraint"] == {
        "topology": "gpu-topology",
        "requiredTopologyLevel": "rack",
        "preferredTopologyLevel": "host",
    }
    assert g.pod_patch["metadata"]["labels"] == {"kai.scheduler/subgroup-name": "worker"}
    assert g.podgroup["metadata"]["ownerReferences"][0]["kind"] == "PyFlow"


def test_a_pod_no_listed_component_selects_joins_the_podgroup_without_a_sub_group() -> None:
    owner = pyflow()
    g = group(pod_of(owner, "evaluator"), owner, kartas=[karta(V2)])
    assert "labels" not in g.pod_patch["metadata"]


def test_the_pod_group_form_without_sub_groups_gangs_the_whole_workload() -> None:
    owner = pyflow(master=1, workers=5)
    g = group(pod_of(owner), owner, kartas=[karta({"podGroup": {"name": "all"}})])
    assert (g.name, spec_of(g)["minMember"]) == ("pg-uid-pyflow-example-all", 6)
    assert "subGroups" not in spec_of(g)


def test_the_pod_group_form_is_taken_over_the_alpha_form() -> None:
    owner = pyflow()
    g = group(pod_of(owner), owner, kartas=[karta({**ALPHA, "podGroup": {"name": "v2"}})])
    assert g.name == "pg-uid-pyflow-example-v2"


@pytest.mark.parametrize(
    ("gang", "field"),
    [
        pytest.param(
            {"podGroup": {"name": "x", "subGroups": [{"componentName": "ghost"}]}},
            "subGroups",
            id="unknown-component",
        ),
        pytest.param(
            {"podGroup": {"name": "x", "topology": {"topologyName": "", "requiredTopologyLevel": "zone"}}},
            "topology",
            id="topology-without-name",
        ),
        pytest.param(
            {"podGroup": {"name": "x", "topology": {"topologyName": "dc"}}},
            "topology",
            id="topology-without-level",
        ),
    ],
)
def test_a_pod_group_the_karta_cannot_make_refuses_the_pod_naming_the_owner(
    gang: dict[str, Any], field: str
) -> None:
    owner = pyflow()
    with pytest.raises(InvalidObject) as info:
        group(pod_of(owner), owner, kartas=[karta(gang)])
    assert (info.value.kind, info.value.name, info.value.field) == ("PyFlow", "ml/pyflow-example", field)
    assert "Karta 'pyflow'" in info.value.problem


def test_a_sub_group_whose_component_has_no_scale_is_refused() -> None:
    owner = pyflow(master=None)
    with pytest.raises(InvalidObject) as info:
        group(pod_of(owner), owner, kartas=[karta(V2)])
    assert info.value.field == "master"


# --- the alpha podGroups form ------------------------------------------------------------------------------------
def test_the_alpha_form_names_the_podgroup_by_the_group_keys_and_gangs_the_member_subtree() -> None:
    owner = pyflow()
    g = group(pod_of(owner, "master"), owner, kartas=[karta(ALPHA)])
    assert g.name == "pg-uid-pyflow-example-pyflow-example"
    assert spec_of(g)["minMember"] == 3
    assert "subGroups" not in spec_of(g)


def test_a_member_naming_the_pods_own_component_comes_before_one_naming_a_component_above() -> None:
    gang = {
        "podGroups": [
            {
                "name": "all",
                "members": [{"componentName": "pyflow", "groupByKeyPaths": ['.metadata.labels["job-name"]']}],
            },
            {
                "name": "workers",
                "members": [{"componentName": "worker", "groupByKeyPaths": [".metadata.labels.role"]}],
            },
        ]
    }
    owner = pyflow(workers=4)
    worker = group(pod_of(owner), owner, kartas=[karta(gang)])
    assert (worker.name, spec_of(worker)["minMember"]) == ("pg-uid-pyflow-example-worker", 4)
    master = group(pod_of(owner, "master"), owner, kartas=[karta(gang)])
    assert (master.name, spec_of(master)["minMember"]) == ("pg-uid-pyflow-example-pyflow-example", 5)


def test_a_member_filter_the_pod_fails_passes_to_the_next_member() -> None:
    gang = {
        "podGroups": [
            {
                "name": "gpu",
                "members": [{"componentName": "worker", "filters": ['.metadata.labels.gpu == "yes"']}],
            },
            {"name": "all", "members": [{"componentName": "pyflow"}]},
        ]
    }
    owner = pyflow()
    assert group(pod_of(owner, gpu="yes"), owner, kartas=[karta(gang)]).name == "pg-uid-pyflow-example"
    assert spec_of(group(pod_of(owner, gpu="yes"), owner, kartas=[karta(gang)]))["minMember"] == 2
    assert spec_of(group(pod_of(owner, gpu="no"), owner, kartas=[karta(gang)]))["minMember"] == 3


@pytest.mark.parametrize(
    ("labels", "role"),
    [({"job-name": ""}, "worker"), ({}, "nobody")],
    ids=["an-empty-group-key", "no-component-selects-the-pod"],
)
def test_a_pod_the_alpha_form_cannot_place_is_refused_naming_the_pod(
    labels: dict[str, str], role: str
) -> None:
    owner = pyflow()
    with pytest.raises(InvalidObject) as info:
        group(pod_of(owner, role, **labels), owner, kartas=[karta(ALPHA)])
    assert (info.value.kind, info.value.name) == ("Pod", f"ml/pyflow-{role}-0")


# --- scale ---------------------------------------------------------------------------------------------------------
def test_without_any_scale_definition_the_scale_is_the_number_of_leaves() -> None:
    doc = karta({"podGroup": {"name": "all"}})
    for child in doc["spec"]["structureDefinition"]["childComponents"]:
        del child["scaleDefinition"]
    owner = pyflow()
    assert spec_of(group(pod_of(owner), owner, kartas=[doc]))["minMember"] == 2


def test_min_replicas_come_before_replicas() -> None:
    doc = karta({"podGroup": {"name": "all"}})
    doc["spec"]["structureDefinition"]["childComponents"][1]["scaleDefinition"]["minReplicasPath"] = (
        ".spec.worker.min"
    )
    owner = make_owner(
        "jobs.example.com/v1",
        "PyFlow",
        "pyflow-example",
        spec={"master": {"replicas": 1}, "worker": {"replicas": 8, "min": 3}},
    )
    assert spec_of(group(pod_of(owner), owner, kartas=[doc]))["minMember"] == 4


@given(master=HOSTILE_JSON, workers=HOSTILE_JSON)
@settings(max_examples=120, deadline=None)
def test_hostile_replica_counts_are_grouped_or_refused_naming_the_owner(master: Any, workers: Any) -> None:
    owner = pyflow(master, workers)
    for gang in (V2, ALPHA, {"podGroup": {"name": "all"}}):
        error: InvalidObject | None = None
        try:
            g = group_or_none(pod_of(owner), owner, kartas=[karta(gang)])
        except InvalidObject as exc:
            error, g = exc, None
        if error is not None:
            assert (error.kind, error.name) == ("PyFlow", "ml/pyflow-example")
            assert len(str(error)) < 400
        else:
            assert g is not None
            assert 0 <= spec_of(g).get("minMember", 0) <= 2**31 - 1


@given(
    value=HOSTILE_JSON,
    where=st.sampled_from(
        [
            "spec",
            "structureDefinition",
            "rootComponent",
            "childComponents",
            "gangScheduling",
            "podGroup",
            "labels",
        ]
    ),
)
@settings(max_examples=150, deadline=None)
def test_a_hostile_karta_is_read_or_passed_over_never_a_crash(value: Any, where: str) -> None:
    doc = copy.deepcopy(karta(V2))
    targets = {
        "spec": (doc, "spec"),
        "structureDefinition": (doc["spec"], "structureDefinition"),
        "rootComponent": (doc["spec"]["structureDefinition"], "rootComponent"),
        "childComponents": (doc["spec"]["structureDefinition"], "childComponents"),
        "gangScheduling": (doc["spec"]["instructions"], "gangScheduling"),
        "podGroup": (doc["spec"]["instructions"]["gangScheduling"], "podGroup"),
        "labels": (doc["metadata"], "labels"),
    }
    parent, key = targets[where]
    parent[key] = value
    found = karta_for([doc, value], GVK)
    if found is not None:
        owner = pyflow()
        with contextlib.suppress(InvalidObject):
            group_or_none(pod_of(owner), owner, kartas=[doc])
    read_karta(doc)


# --- the jq paths a Karta writes -------------------------------------------------------------------------------
DOC = {
    "metadata": {"labels": {"job-name": "j", "role": "worker"}},
    "spec": {"groups": [{"n": 1}, {"n": 2}], "m": {"a": 1, "b": 2}},
}


@pytest.mark.parametrize(
    ("path", "outputs"),
    [
        (".", [DOC]),
        (".metadata.labels.role", ["worker"]),
        ('.metadata.labels["job-name"]', ["j"]),
        ('.metadata.labels."job-name"', ["j"]),
        ('.["metadata"].labels.missing', [None]),
        (".spec.groups[1].n", [2]),
        (".spec.groups[-1].n", [2]),
        (".spec.groups[5]", [None]),
        (".spec.groups[].n", [1, 2]),
        (".spec.m[]", [1, 2]),
        (".missing.deeper", [None]),
        (".metadata.labels.role.x?", []),
        ('.metadata.labels.role == "worker"', [True]),
        (".spec.groups[].n == 2", [False, True]),
    ],
)
def test_a_path_gives_what_jq_gives(path: str, outputs: list[Any]) -> None:
    program = karta_paths.parse(path)
    assert program is not None
    assert karta_paths.evaluate(program, DOC) == outputs


@pytest.mark.parametrize(
    "path", ["", "metadata", ".a | .b", ".a // 1", "[.a]", ".a[", ". a", ".[1:2]", ".a == {}", "$x"]
)
def test_other_jq_is_not_read(path: str) -> None:
    assert karta_paths.parse(path) is None


@pytest.mark.parametrize("path", [".metadata.labels.role.x", ".spec.m[0]", ".metadata.labels.role[]", ".x[]"])
def test_jq_runtime_errors_are_raised(path: str) -> None:
    program = karta_paths.parse(path)
    assert program is not None
    with pytest.raises(karta_paths.PathError):
        karta_paths.evaluate(program, DOC)
