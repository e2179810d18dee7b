"""The rules every kind shares, as KAI v0.17's pod-grouper has them: the per-kind defaults ConfigMap, the
preemption delay and staleness grace period, the defaults a skipped owner hands down, and the update of an
existing PodGroup (its topology kept, the durations managed).

Read from KAI's ``defaultgrouper/default_grouper.go``, ``skiptopowner/skiptopowner.go`` and
``podgroup/handler.go``; the ConfigMap's format from ``default_grouper.go``'s parser.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import GrouperConfig, Grouping, podgroup_update
from services.state.controllers.grouping.default import go_duration
from services.state.controllers.grouping.kind_defaults import parse_types
from shared.errors import InvalidObject
from shared.kube import keys, wire
from shared.kube.quantity import DurationError, parse_duration
from tests.grouping import group, group_or_none, make_owner, make_pod, owned_by, spec_of
from tests.hostile import HOSTILE_TEXT

CM_NAME = "kai-defaults"
CM_NAMESPACE = "kai-system"
WITH_DEFAULTS = GrouperConfig(defaults_configmap=CM_NAME, defaults_configmap_namespace=CM_NAMESPACE)
DELAY = keys.PREEMPTION_DELAY_ANNOTATION
GRACE = keys.STALENESS_GRACE_PERIOD_ANNOTATION


def configmap(types: Any, *, raw: str | None = None, key: str = "types") -> dict[str, Any]:
    """The defaults ConfigMap, ``data.types`` holding `types` as JSON (or `raw` text)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CM_NAME, "namespace": CM_NAMESPACE},
        "data": {key: raw if raw is not None else json.dumps(types)},
    }


def entry(kind: str, group: str = "", priority: str = "", preemptibility: str = "") -> dict[str, str]:
    return {"typeName": kind, "group": group, "priorityName": priority, "preemptibility": preemptibility}


def job(**kwargs: Any) -> wire.Owner:
    return make_owner("batch/v1", "Job", "train", **kwargs)


def grouped(pod: wire.Pod, *owners: wire.Owner, cm: dict[str, Any] | None = None) -> Grouping:
    return group(pod, *owners, config=WITH_DEFAULTS, objects=[cm] if cm else [])


# --- the per-kind defaults ConfigMap -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("types", "priority", "preemptibility"),
    [
        pytest.param(
            [entry("Job", "batch", "high", "non-preemptible")],
            "high",
            "non-preemptible",
            id="by-kind-and-group",
        ),
        pytest.param([entry("Job", "", "low")], "low", None, id="an-entry-without-group-matches-every-group"),
        pytest.param(
            [entry("Job", "batch", "low"), entry("Job", "", "high")], "low", None, id="kind-and-group-first"
        ),
        pytest.param([entry("Job", "apps", "high")], "train", None, id="another-group-does-not-match"),
        pytest.param(
            [entry("Job", "batch", "platinum")], "train", None, id="a-class-that-does-not-exist-is-skipped"
        ),
        pytest.param(
            [entry("Job", "batch", "", "Preemptible")],
            "train",
            "preemptible",
            id="preemptibility-lower-cased",
        ),
        pytest.param(
            [entry("Job", "batch", "", "sometimes")], "train", None, id="invalid-preemptibility-skipped"
        ),
        pytest.param(
            [entry("Job", "batch", "low"), entry("Job", "batch", "high")],
            "high",
            None,
            id="the-later-entry-wins",
        ),
        pytest.param(
            [{"TYPENAME": "Job", "Group": "batch", "priorityname": "low"}],
            "low",
            None,
            id="field-names-fold-case",
        ),
        pytest.param(
            [{"typeName": "Job", "group": "batch", "priorityName": "low", "other": 1}],
            "low",
            None,
            id="unknown-fields-ignored",
        ),
        pytest.param(None, "train", None, id="null-list"),
    ],
)
def test_the_defaults_configmap_names_a_kinds_priority_class_and_preemptibility(
    types: Any, priority: str, preemptibility: str | None
) -> None:
    j = job()
    spec = spec_of(grouped(make_pod(owned_by(j)), j, cm=configmap(types)))
    assert spec["priorityClassName"] == priority
    assert spec.get("preemptibility") == preemptibility


@pytest.mark.parametrize(
    "cm",
    [
        pytest.param(None, id="missing"),
        pytest.param(configmap(None, raw="[{"), id="not-json"),
        pytest.param(configmap(None, raw='{"typeName": "Job"}'), id="not-a-list"),
        pytest.param(configmap([entry("Job", "batch", "high"), 7]), id="an-entry-not-an-object"),
        pytest.param(
            configmap([{"typeName": "Job", "group": "batch", "priorityName": 5}]), id="a-field-not-text"
        ),
        pytest.param(configmap([entry("Job", "batch", "high")], key="kinds"), id="no-types-key"),
    ],
)
def test_a_missing_or_malformed_configmap_gives_no_defaults_as_in_kai(cm: dict[str, Any] | None) -> None:
    j = job()
    spec = spec_of(grouped(make_pod(owned_by(j)), j, cm=cm))
    assert (spec["priorityClassName"], spec.get("preemptibility")) == ("train", None)


def test_labels_on_the_owner_or_pod_win_over_the_configmap() -> None:
    cm = configmap([entry("Job", "batch", "high", "non-preemptible")])
    j = job(labels={keys.PRIORITY_CLASS_LABEL: "low"})
    pod = make_pod(owned_by(j), labels={keys.PREEMPTIBILITY_LABEL: "preemptible"})
    spec = spec_of(grouped(pod, j, cm=cm))
    assert (spec["priorityClassName"], spec["preemptibility"]) == ("low", "preemptible")


def test_a_deployments_inference_default_gives_way_to_the_configmap() -> None:
    cm = configmap([entry("Deployment", "apps", "high")])
    deployment = make_owner("apps/v1", "Deployment", "serve")
    rs = make_owner("apps/v1", "ReplicaSet", "serve-7d9", owner=owned_by(deployment))
    assert spec_of(grouped(make_pod(owned_by(rs)), rs, deployment, cm=cm))["priorityClassName"] == "high"


def test_the_default_plugin_asks_the_configmap_for_each_owner_of_the_chain_in_turn() -> None:
    cm = configmap([entry("Trial", "example.com", "low"), entry("Experiment", "example.com", "high")])
    top = make_owner("example.com/v1", "Experiment", "exp")
    trial = make_owner("example.com/v1", "Trial", "trial", owner=owned_by(top))
    assert spec_of(grouped(make_pod(owned_by(trial)), trial, top, cm=cm))["priorityClassName"] == "low"


def test_nothing_is_read_without_a_configured_configmap() -> None:
    j = job()
    cm = configmap([entry("Job", "batch", "high")])
    assert spec_of(group(make_pod(owned_by(j)), j, objects=[cm]))["priorityClassName"] == "train"
    half = GrouperConfig(defaults_configmap=CM_NAME)
    assert spec_of(group(make_pod(owned_by(j)), j, config=half, objects=[cm]))["priorityClassName"] == "train"


def test_the_configmap_table_is_keyed_as_kai_keys_it() -> None:
    table = parse_types(configmap([entry("Job", "batch", "high"), entry("Pod"), entry("", "apps")]))
    assert table is not None
    assert sorted(table) == [".apps", "Job.batch", "Pod"]


# --- defaults a skipped owner hands down ---------------------------------------------------------------------
def workflow_job(**labels: str) -> tuple[wire.Pod, wire.Owner, wire.Owner]:
    workflow = make_owner("argoproj.io/v1alpha1", "Workflow", "wf", labels=labels)
    j = make_owner("batch/v1", "Job", "wf-step", owner=owned_by(workflow))
    return make_pod(owned_by(j)), j, workflow


def test_a_skipped_owners_kind_defaults_reach_the_owner_below_it() -> None:
    cm = configmap([entry("Workflow", "argoproj.io", "high", "non-preemptible")])
    pod, j, workflow = workflow_job()
    spec = spec_of(grouped(pod, j, workflow, cm=cm))
    assert (spec["priorityClassName"], spec["preemptibility"]) == ("high", "non-preemptible")


def test_a_skipped_kinds_defaults_come_before_the_skipped_owners_own_labels() -> None:
    """KAI applies the ConfigMap's defaults to the owner below before it propagates the skipped owner's
    labels (``applyDefaultsFromSkippedOwner`` then ``propagateMetadataDownChain``)."""
    cm = configmap([entry("Workflow", "argoproj.io", "high")])
    pod, j, workflow = workflow_job(**{keys.PRIORITY_CLASS_LABEL: "low"})
    assert spec_of(grouped(pod, j, workflow, cm=cm))["priorityClassName"] == "high"
    assert spec_of(grouped(pod, j, workflow))["priorityClassName"] == "low"


def test_the_owner_below_keeps_its_own_priority_label_over_the_skipped_kinds_default() -> None:
    cm = configmap([entry("Workflow", "argoproj.io", "high")])
    workflow = make_owner("argoproj.io/v1alpha1", "Workflow", "wf")
    j = make_owner(
        "batch/v1", "Job", "wf-step", owner=owned_by(workflow), labels={keys.PRIORITY_CLASS_LABEL: "build"}
    )
    assert spec_of(grouped(make_pod(owned_by(j)), j, workflow, cm=cm))["priorityClassName"] == "build"


# --- preemption delay and staleness grace period -------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("300s", "5m0s"),
        ("5m", "5m0s"),
        ("1h30m", "1h30m0s"),
        ("1.5s", "1.5s"),
        ("0", "0s"),
        ("250ms", "250ms"),
    ],
)
def test_a_preemption_delay_annotation_becomes_the_podgroups_spec_as_kai_writes_it(
    text: str, written: str
) -> None:
    j = job(annotations={DELAY: text})
    assert spec_of(group(make_pod(owned_by(j)), j))["preemptionDelay"] == written


def test_the_owners_delay_comes_before_the_pods_and_the_pods_is_read_without_one() -> None:
    j = job(annotations={DELAY: "2m"})
    assert spec_of(group(make_pod(owned_by(j), annotations={DELAY: "9m"}), j))["preemptionDelay"] == "2m0s"
    assert (
        spec_of(group(make_pod(owned_by(job()), annotations={DELAY: "9m"}), job()))["preemptionDelay"]
        == "9m0s"
    )
    assert "preemptionDelay" not in spec_of(group(make_pod(owned_by(job())), job()))


def test_the_default_plugin_reads_the_delay_from_every_owner_of_the_chain() -> None:
    top = make_owner("example.com/v1", "Experiment", "exp")
    trial = make_owner("example.com/v1", "Trial", "trial", owner=owned_by(top), annotations={DELAY: "45s"})
    assert spec_of(group(make_pod(owned_by(trial)), trial, top))["preemptionDelay"] == "45s"


def test_a_staleness_grace_period_annotation_becomes_the_podgroups_spec_even_negative() -> None:
    j = job(annotations={GRACE: "90s"})
    assert spec_of(group(make_pod(owned_by(j)), j))["stalenessGracePeriod"] == "1m30s"
    pod = make_pod(owned_by(job()), annotations={GRACE: "-1s"})
    assert spec_of(group(pod, job()))["stalenessGracePeriod"] == "-1s"


@pytest.mark.parametrize(
    ("on_pod", "text"),
    [(False, "soon"), (False, "-5m"), (True, "5"), (True, "1d"), (False, "9999999999h")],
)
def test_a_delay_that_is_not_a_duration_refuses_the_pod_naming_the_object_and_annotation(
    on_pod: bool, text: str
) -> None:
    j = job(annotations={} if on_pod else {DELAY: text})
    pod = make_pod(owned_by(j), annotations={DELAY: text} if on_pod else {})
    with pytest.raises(InvalidObject) as info:
        group(pod, j)
    assert (info.value.kind, info.value.name) == (("Pod", "ml/worker-0") if on_pod else ("Job", "ml/train"))
    assert info.value.field == f"metadata.annotations[{DELAY}]"


@given(text=HOSTILE_TEXT, on_pod=st.booleans(), key=st.sampled_from([DELAY, GRACE]))
@settings(max_examples=150, deadline=None)
def test_hostile_duration_annotations_are_written_as_go_durations_or_refused_naming_the_field(
    text: str, on_pod: bool, key: str
) -> None:
    j = job(annotations={} if on_pod else {key: text})
    pod = make_pod(owned_by(j), annotations={key: text} if on_pod else {})
    field = "preemptionDelay" if key == DELAY else "stalenessGracePeriod"
    error: InvalidObject | None = None
    try:
        g = group_or_none(pod, j)
    except InvalidObject as exc:
        error, g = exc, None
    if error is not None:
        assert error.field == f"metadata.annotations[{key}]"
        assert (error.kind, error.name) == (("Pod", "ml/worker-0") if on_pod else ("Job", "ml/train"))
        assert len(str(error)) < 400
        return
    assert g is not None
    written = spec_of(g)[field]
    assert abs(parse_duration(written) - parse_duration(text)) < 1e-6 * max(1.0, abs(parse_duration(text)))


@given(nanos=st.integers(min_value=-(2**53), max_value=2**53))
def test_a_written_duration_reads_back_as_the_same_duration(nanos: int) -> None:
    seconds = nanos / 10**9
    try:
        back = parse_duration(go_duration(seconds))
    except DurationError as exc:  # pragma: no cover - a failure says which
        raise AssertionError(go_duration(seconds)) from exc
    assert round(back * 10**9) == round(seconds * 10**9)


# --- the skip-podgrouper annotation --------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["pod", "owner", "top"])
def test_skip_podgrouper_on_the_pod_or_any_owner_leaves_the_pod_alone(where: str) -> None:
    skip = {keys.SKIP_PODGROUPER_ANNOTATION: "true"}
    deployment = make_owner("apps/v1", "Deployment", "serve", annotations=skip if where == "top" else {})
    rs = make_owner(
        "apps/v1",
        "ReplicaSet",
        "serve-7d9",
        owner=owned_by(deployment),
        annotations=skip if where == "owner" else {},
    )
    pod = make_pod(owned_by(rs), annotations=skip if where == "pod" else {})
    assert group_or_none(pod, rs, deployment) is None


@pytest.mark.parametrize("value", ["True", "TRUE", "1", "yes", "false", ""])
def test_only_the_exact_value_true_skips_the_grouper(value: str) -> None:
    j = job(annotations={keys.SKIP_PODGROUPER_ANNOTATION: value})
    assert group_or_none(make_pod(owned_by(j), annotations={keys.SKIP_PODGROUPER_ANNOTATION: value}), j)


# --- updating an existing PodGroup ---------------------------------------------------------------------------
def existing(grouping: Grouping, **spec: Any) -> wire.PodGroup:
    doc = {**grouping.podgroup, "spec": {**grouping.podgroup["spec"], **spec}}
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}
    return wire.convert(wire.PodGroup, doc)


def test_an_existing_topology_constraint_is_kept_when_the_decision_names_no_topology() -> None:
    j = job()
    g = group(make_pod(owned_by(j)), j)
    constraint = {"topology": "dc", "requiredTopologyLevel": "rack"}
    assert podgroup_update(existing(g, topologyConstraint=constraint), g) is None
    patch = podgroup_update(existing(g, topologyConstraint=constraint, minMember=3), g)
    assert patch is not None
    assert "topologyConstraint" not in patch["spec"]
    assert patch["spec"]["minMember"] == 1


def test_a_decision_naming_a_topology_replaces_the_existing_constraint() -> None:
    j = job(annotations={keys.TOPOLOGY_ANNOTATION: "dc", keys.TOPOLOGY_PREFERRED_ANNOTATION: "zone"})
    g = group(make_pod(owned_by(j)), j)
    patch = podgroup_update(
        existing(g, topologyConstraint={"topology": "other", "requiredTopologyLevel": "rack"}), g
    )
    assert patch == {
        "spec": {
            **{
                k: spec_of(g).get(k)
                for k in ("minMember", "minSubGroup", "priorityClassName", "preemptibility", "subGroups")
            },
            "topologyConstraint": {"topology": "dc", "preferredTopologyLevel": "zone"},
        }
    }


def test_the_delay_and_grace_period_are_managed_and_compared_as_durations() -> None:
    j = job(annotations={GRACE: "300s"})
    g = group(make_pod(owned_by(j)), j)
    assert podgroup_update(existing(g, stalenessGracePeriod="5m"), g) is None
    patch = podgroup_update(existing(g, stalenessGracePeriod="10m"), g)
    assert patch is not None
    assert patch["spec"]["stalenessGracePeriod"] == "5m0s"
    plain = group(make_pod(owned_by(job())), job())
    patch = podgroup_update(existing(plain, stalenessGracePeriod="10m"), plain)
    assert patch is not None
    assert patch["spec"]["stalenessGracePeriod"] is None


def test_the_fields_others_own_are_never_patched() -> None:
    j = job(annotations={GRACE: "1m"})
    g = group(make_pod(owned_by(j)), j)
    old = existing(g, queue="moved", markUnschedulable=True, schedulingBackoff=1, minMember=5)
    patch = podgroup_update(old, g)
    assert patch is not None
    assert not {"queue", "markUnschedulable", "schedulingBackoff"} & patch["spec"].keys()
