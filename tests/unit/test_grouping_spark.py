"""The pod-grouper's decision for pods as top owners (KAI's podjob plugin) and Spark's pods (its spark
plugin): a Spark driver and the executors it owns share the PodGroup their application id names, owned by
the driver; any other bare pod is a PodGroup of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import Grouping
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import NAMESPACE, group, make_owner, make_pod, owned_by, spec_of
from tests.hostile import HOSTILE_TEXT

APP_ID = "spark-5f0b6a3c2e8d4b1a9c7e6f5d4c3b2a19"
SELECTOR_FIELD = "metadata.labels[spark-app-selector]"


def spark_labels(role: str, app_id: str = APP_ID, **more: str) -> dict[str, str]:
    """The labels spark-submit puts on a driver and its executors."""
    return {"spark-app-name": "spark-pi", "spark-app-selector": app_id, "spark-role": role, **more}


def driver(labels: dict[str, str] | None = None, **kwargs: Any) -> wire.Pod:
    return make_pod(
        labels=spark_labels("driver") if labels is None else labels, name="spark-pi-driver", **kwargs
    )


def as_owner(pod: wire.Pod) -> wire.Owner:
    """A pod as the pod-grouper reads it when it is another pod's owner."""
    return make_owner(
        "v1",
        "Pod",
        pod.metadata.name,
        labels=dict(pod.metadata.labels),
        annotations=dict(pod.metadata.annotations),
    )


def executor(owner: wire.Pod, index: int, labels: dict[str, str] | None = None) -> wire.Pod:
    return make_pod(
        owned_by(as_owner(owner)),
        labels=spark_labels("executor", **{"spark-exec-id": str(index)}) if labels is None else labels,
        name=f"spark-pi-exec-{index}",
    )


def test_a_spark_driver_is_the_podgroup_its_application_id_names() -> None:
    g = group(driver(labels=spark_labels("driver", **{keys.QUEUE_LABEL: "analytics"})))
    assert (g.grouper, g.name) == ("podjob", APP_ID)
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "spark-pi-driver", "uid": "uid-spark-pi-driver"}
    ]
    assert spec_of(g) == {"minMember": 1, "queue": "analytics", "priorityClassName": "train"}


def test_spark_executors_join_their_driver_s_podgroup_owned_by_the_driver() -> None:
    the_driver = driver(labels=spark_labels("driver", **{keys.QUEUE_LABEL: "analytics"}))
    top = as_owner(the_driver)
    groupings = [group(executor(the_driver, i), top) for i in (1, 2)]
    assert {g.name for g in groupings} == {APP_ID}
    for g in groupings:
        assert g.podgroup == group(the_driver).podgroup | {"metadata": g.podgroup["metadata"]}
        assert g.podgroup["metadata"]["ownerReferences"][0]["name"] == "spark-pi-driver"
        assert spec_of(g)["queue"] == "analytics"


@pytest.mark.parametrize(
    ("labels", "expected_name"),
    [
        ({}, "pg-worker-0-uid-worker-0"),
        ({"spark-app-name": "spark-pi"}, "pg-worker-0-uid-worker-0"),
        ({"spark-app-selector": APP_ID}, "pg-worker-0-uid-worker-0"),
        ({"spark-app-name": "spark-pi", "spark-app-selector": APP_ID}, APP_ID),
        ({"spark-app-name": "", "spark-app-selector": "app.1"}, "app.1"),
    ],
    ids=[
        "a bare pod is a PodGroup of its own",
        "only spark-app-name: not Spark's",
        "only spark-app-selector: not Spark's",
        "both labels: Spark's",
        "both labels, whatever the name",
    ],
)
def test_a_pod_is_spark_s_when_it_has_both_of_spark_s_labels(
    labels: dict[str, str], expected_name: str
) -> None:
    g = group(make_pod(labels=labels))
    assert (g.grouper, g.name) == ("podjob", expected_name)


@pytest.mark.parametrize(
    ("labels", "annotations", "spec", "field", "expected"),
    [
        ({}, {}, {}, "priorityClassName", "train"),
        ({keys.PRIORITY_CLASS_LABEL: "high"}, {}, {}, "priorityClassName", "high"),
        ({}, {}, {"priorityClassName": "low"}, "priorityClassName", "low"),
        ({keys.QUEUE_LABEL: "gpu"}, {}, {}, "queue", "gpu"),
        ({}, {}, {}, "queue", keys.DEFAULT_QUEUE),
        ({keys.PREEMPTIBILITY_LABEL: "non-preemptible"}, {}, {}, "preemptibility", "non-preemptible"),
        ({}, {keys.TOPOLOGY_ANNOTATION: "dc"}, {}, "topologyConstraint", {"topology": "dc"}),
    ],
    ids=[
        "train by default",
        "a priorityClassName label",
        "the pod's spec",
        "the queue label",
        "the default queue",
        "preemptibility",
        "topology from the pod's annotations",
    ],
)
@pytest.mark.parametrize("spark", [False, True], ids=["a bare pod", "a spark driver"])
def test_a_pod_as_top_owner_gets_the_default_plugin_s_fields(
    spark: bool,
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: dict[str, Any],
    field: str,
    expected: Any,
) -> None:
    all_labels = {**(spark_labels("driver") if spark else {}), **labels}
    g = group(make_pod(labels=all_labels, annotations=annotations, **spec))
    assert spec_of(g)[field] == expected


def test_a_pod_owned_by_a_pod_that_is_not_spark_s_is_grouped_by_its_owner() -> None:
    owner = make_pod(name="launcher")
    g = group(make_pod(owned_by(as_owner(owner)), name="helper"), as_owner(owner))
    assert g.name == "pg-launcher-uid-launcher"
    assert g.podgroup["metadata"]["ownerReferences"][0]["name"] == "launcher"


def test_spark_pods_under_an_owner_of_another_kind_are_that_kind_s_as_in_kai() -> None:
    app = make_owner("sparkoperator.k8s.io/v1beta2", "SparkApplication", "pi")
    g = group(make_pod(owned_by(app), labels=spark_labels("driver")), app)
    assert (g.grouper, g.name) == ("default", "pg-pi-uid-pi")


@pytest.mark.parametrize("app_id", ["Spark-App", "spark_app", "-spark", "spark-", ".", ""])
def test_an_application_id_that_cannot_name_a_podgroup_is_refused_naming_the_label(app_id: str) -> None:
    with pytest.raises(InvalidObject) as info:
        group(driver(labels=spark_labels("driver", app_id=app_id)))
    assert (info.value.kind, info.value.name, info.value.field) == (
        "Pod",
        f"{NAMESPACE}/spark-pi-driver",
        SELECTOR_FIELD,
    )


# --- properties ------------------------------------------------------------------------------------------
def outcome(decide: Callable[[], Grouping]) -> tuple[Grouping | None, InvalidObject | None]:
    try:
        return decide(), None
    except InvalidObject as exc:
        return None, exc


@settings(max_examples=50, deadline=None)
@given(executors=st.integers(min_value=0, max_value=8))
def test_a_driver_and_all_its_executors_land_in_exactly_one_podgroup(executors: int) -> None:
    the_driver = driver()
    pods = [the_driver, *(executor(the_driver, i) for i in range(1, executors + 1))]
    groupings = [group(p, *([as_owner(the_driver)] if p is not the_driver else [])) for p in pods]
    assert {g.name for g in groupings} == {APP_ID}
    assert {g.podgroup["metadata"]["ownerReferences"][0]["uid"] for g in groupings} == {"uid-spark-pi-driver"}
    assert all(
        g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: APP_ID} for g in groupings
    )
    assert all(spec_of(g)["minMember"] == 1 for g in groupings)


@settings(max_examples=150, deadline=None)
@given(app_id=HOSTILE_TEXT)
def test_a_hostile_application_id_names_the_podgroup_or_is_refused_naming_the_label(app_id: str) -> None:
    g, error = outcome(lambda: group(driver(labels=spark_labels("driver", app_id=app_id))))
    if error is not None:
        assert (error.kind, error.field) == ("Pod", SELECTOR_FIELD)
        assert len(str(error)) < 300
    else:
        assert g is not None
        assert g.name == app_id
