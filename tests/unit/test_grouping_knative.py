"""The pod-grouper's decision for Knative Services, as KAI's knative plugin decides: one PodGroup per
Revision (named by the pod's revision label and read from the cluster) with the Revision's min-scale as
its minimum, the inference priority, and one PodGroup per pod when gang scheduling is off or the
Revision's pods already have one each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import GrouperConfig, Grouping
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import NAMESPACE, group, make_owner, make_pod, owned_by, spec_of
from tests.hostile import HOSTILE_JSON, HOSTILE_TEXT
from tools.kubesim.operators.knative import MAX_REPLICAS, scale_of

REVISION_LABEL = "serving.knative.dev/revision"
MIN_SCALE = "autoscaling.knative.dev/min-scale"
MIN_SCALE_FIELD = f"metadata.annotations[{MIN_SCALE}]"
SERVING = "serving.knative.dev/v1"
GANG_OFF = GrouperConfig(knative_gang_schedule=False)


class Chain:
    """A Knative Service's pod and its owners, as Knative makes them (Pod -> ReplicaSet -> Deployment ->
    Revision -> Configuration -> Service)."""

    def __init__(
        self,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        revision: str = "hello-00001",
    ) -> None:
        self.service = make_owner(SERVING, "Service", "hello", labels={"team": "web"})
        self.configuration = make_owner(SERVING, "Configuration", "hello", owner=owned_by(self.service))
        self.revision = make_owner(
            SERVING,
            "Revision",
            revision,
            labels={"serving.knative.dev/service": "hello", **(labels or {})},
            annotations=annotations,
            owner=owned_by(self.configuration),
        )
        self.deployment = make_owner(
            "apps/v1", "Deployment", f"{revision}-deployment", owner=owned_by(self.revision)
        )
        self.replicaset = make_owner(
            "apps/v1", "ReplicaSet", f"{revision}-deployment-7d9", owner=owned_by(self.deployment)
        )

    @property
    def owners(self) -> tuple[wire.Owner, ...]:
        return (self.replicaset, self.deployment, self.revision, self.configuration, self.service)

    def pod(
        self,
        name: str = "hello-00001-deployment-7d9-x1",
        labels: dict[str, str] | None = None,
        podgroup: str | None = None,
        **spec: Any,
    ) -> wire.Pod:
        annotations = {keys.PODGROUP_ANNOTATION: podgroup} if podgroup is not None else {}
        all_labels = {REVISION_LABEL: self.revision.metadata.name, **(labels or {})}
        return make_pod(
            owned_by(self.replicaset), labels=all_labels, annotations=annotations, name=name, **spec
        )

    def group(
        self,
        pod: wire.Pod | None = None,
        pods: list[wire.Pod] | None = None,
        podgroups: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Grouping:
        pod = pod or self.pod()
        return group(
            pod, *self.owners, objects=[self.revision, *(podgroups or [])], pods=pods or [pod], **kwargs
        )


def podgroup(name: str, owner_kind: str | None) -> dict[str, Any]:
    """A PodGroup of the namespace, owned by an object of `owner_kind` (None: no owner)."""
    refs = [{"apiVersion": "v1", "kind": owner_kind, "name": "x", "uid": "u"}] if owner_kind else []
    return {
        "apiVersion": keys.PODGROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE, "ownerReferences": refs},
        "spec": {"minMember": 1},
    }


REVISION_PG = "pg-hello-00001-uid-hello-00001"


def outcome(decide: Callable[[], Grouping]) -> tuple[Grouping | None, InvalidObject | None]:
    """The decision, or the refusal it raises; anything else propagates and fails the spec."""
    try:
        return decide(), None
    except InvalidObject as exc:
        return None, exc


# --- the gang per Revision ---------------------------------------------------------------------------------
def test_a_knative_pod_is_grouped_by_its_revision_as_kai_does() -> None:
    chain = Chain(annotations={MIN_SCALE: "3"}, labels={keys.QUEUE_LABEL: "serving"})
    g = chain.group()
    assert g.grouper == "knative"
    assert g.name == REVISION_PG
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": SERVING, "kind": "Revision", "name": "hello-00001", "uid": "uid-hello-00001"}
    ]
    assert spec_of(g) == {"minMember": 3, "queue": "serving", "priorityClassName": "inference"}
    assert g.podgroup["metadata"]["labels"] == {
        "serving.knative.dev/service": "hello",
        keys.QUEUE_LABEL: "serving",
    }
    top = g.podgroup["metadata"]["annotations"][keys.TOP_OWNER_METADATA_ANNOTATION]
    assert "kind: Revision" in top
    assert "group: serving.knative.dev" in top
    assert g.pod_patch == {"metadata": {"annotations": {keys.PODGROUP_ANNOTATION: REVISION_PG}}}


@pytest.mark.parametrize(
    ("annotations", "min_member"),
    [
        ({}, 1),
        ({MIN_SCALE: "3"}, 3),
        ({MIN_SCALE: "0"}, 0),
        ({MIN_SCALE: "+2"}, 2),
        ({MIN_SCALE: "007"}, 7),
        ({"autoscaling.knative.dev/minScale": "4"}, 1),
        ({MIN_SCALE: "2", "autoscaling.knative.dev/max-scale": "5"}, 2),
    ],
    ids=[
        "a revision without min-scale is a gang of one",
        "min-scale is the gang",
        "min-scale 0 (scale to zero) asks for no gang",
        "a signed min-scale as Go's Atoi reads it",
        "leading zeros as Go's Atoi reads them",
        "the older minScale spelling is not read, as in KAI",
        "max-scale does not change the gang",
    ],
)
def test_the_revisions_min_scale_is_its_gang(annotations: dict[str, str], min_member: int) -> None:
    assert spec_of(Chain(annotations=annotations).group())["minMember"] == min_member


@pytest.mark.parametrize(
    ("revision_labels", "pod_labels", "pod_spec", "gang", "expected"),
    [
        ({}, {}, {}, True, "inference"),
        ({keys.PRIORITY_CLASS_LABEL: "high"}, {}, {}, True, "high"),
        ({}, {keys.PRIORITY_CLASS_LABEL: "low"}, {}, True, "low"),
        ({}, {}, {"priorityClassName": "high"}, True, "high"),
        ({keys.PRIORITY_CLASS_LABEL: "missing"}, {}, {}, True, "inference"),
        ({keys.PRIORITY_CLASS_LABEL: "high"}, {keys.PRIORITY_CLASS_LABEL: "low"}, {}, True, "high"),
        ({keys.PRIORITY_CLASS_LABEL: "high"}, {}, {}, False, "inference"),
        ({}, {}, {"priorityClassName": "high"}, False, "inference"),
    ],
    ids=[
        "inference by default",
        "the revision's label",
        "the pod's label",
        "the pod's spec",
        "a label naming no PriorityClass",
        "the revision's label before the pod's",
        "gang off: always inference, whatever the label",
        "gang off: always inference, whatever the spec",
    ],
)
def test_the_priority_class_of_a_knative_podgroup(
    revision_labels: dict[str, str],
    pod_labels: dict[str, str],
    pod_spec: dict[str, str],
    gang: bool,
    expected: str,
) -> None:
    chain = Chain(labels=revision_labels)
    config = GrouperConfig(knative_gang_schedule=gang)
    g = chain.group(chain.pod(labels=pod_labels, **pod_spec), config=config)
    assert spec_of(g)["priorityClassName"] == expected


def test_a_knative_podgroup_takes_no_preemptibility_or_topology_as_kai_s_plugin_sets_none() -> None:
    chain = Chain(
        labels={keys.PREEMPTIBILITY_LABEL: "non-preemptible"},
        annotations={keys.TOPOLOGY_ANNOTATION: "dc", keys.TOPOLOGY_REQUIRED_ANNOTATION: "rack"},
    )
    spec = spec_of(chain.group(chain.pod(labels={keys.PREEMPTIBILITY_LABEL: "preemptible"})))
    assert "preemptibility" not in spec
    assert "topologyConstraint" not in spec


def test_the_queue_comes_from_the_revision_then_the_pod() -> None:
    chain = Chain()
    assert spec_of(chain.group(chain.pod(labels={keys.QUEUE_LABEL: "mine"})))["queue"] == "mine"
    chain = Chain(labels={keys.QUEUE_LABEL: "revisions"})
    assert spec_of(chain.group(chain.pod(labels={keys.QUEUE_LABEL: "mine"})))["queue"] == "revisions"


def test_the_service_s_labels_do_not_reach_the_podgroup_the_revision_s_do() -> None:
    labels = Chain().group().podgroup["metadata"]["labels"]
    assert "team" not in labels
    assert labels["serving.knative.dev/service"] == "hello"


# --- one PodGroup per pod ---------------------------------------------------------------------------------
def test_with_gang_scheduling_off_each_pod_is_its_own_podgroup() -> None:
    chain = Chain(annotations={MIN_SCALE: "3"})
    pod = chain.pod(name="hello-x1")
    g = chain.group(pod, config=GANG_OFF)
    assert g.name == "pg-hello-x1-uid-hello-x1"
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "hello-x1", "uid": "uid-hello-x1"}
    ]
    assert spec_of(g)["minMember"] == 1
    assert "kind: Revision" in g.podgroup["metadata"]["annotations"][keys.TOP_OWNER_METADATA_ANNOTATION]


@pytest.mark.parametrize(
    ("others", "podgroups", "per_pod"),
    [
        ([], [], False),
        ([REVISION_PG, REVISION_PG], [], False),
        (["pg-a-uid-a", "pg-b-uid-b"], [], True),
        (["pg-a-uid-a", "pg-a-uid-a", "pg-b-uid-b"], [], False),
        ([REVISION_PG], [podgroup(REVISION_PG, "Revision")], False),
        (["pg-a-uid-a"], [podgroup("pg-a-uid-a", "Pod")], True),
        (["pg-a-uid-a"], [], False),
        ([""], [], False),
    ],
    ids=[
        "no pod of the revision grouped yet: a gang",
        "two pods in one PodGroup: a gang",
        "two pods in PodGroups of their own: one per pod",
        "any two pods sharing a PodGroup: a gang",
        "one PodGroup owned by the revision: a gang",
        "one PodGroup owned by a pod: one per pod",
        "one named PodGroup that does not exist: a gang",
        "an empty podgroup name counts for nothing",
    ],
)
def test_a_revision_grouped_per_pod_before_gang_scheduling_stays_so(
    others: list[str], podgroups: list[dict[str, Any]], per_pod: bool
) -> None:
    chain = Chain(annotations={MIN_SCALE: "3"})
    pod = chain.pod()
    siblings = [chain.pod(name=f"old-{i}", podgroup=name) for i, name in enumerate(others)]
    g = chain.group(pod, pods=[pod, *siblings], podgroups=podgroups)
    if per_pod:
        assert (g.name, spec_of(g)["minMember"]) == (f"pg-{pod.metadata.name}-{pod.metadata.uid}", 1)
    else:
        assert (g.name, spec_of(g)["minMember"]) == (REVISION_PG, 3)


def test_gang_scheduling_off_does_not_read_min_scale() -> None:
    chain = Chain(annotations={MIN_SCALE: "three"})
    assert spec_of(chain.group(config=GANG_OFF))["minMember"] == 1


def test_a_revision_s_pods_under_a_configuration_of_their_own_get_the_default_plugin_as_in_kai() -> None:
    chain = Chain()
    g = group(chain.pod(), *chain.owners[:-1], objects=[chain.revision])
    assert (g.grouper, g.name) == ("default", "pg-hello-uid-hello")


# --- refused ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["three", "-1", "1.5", "", " 3", "1e3", "٣", "9" * 5000, "2147483648"])
def test_a_min_scale_that_is_no_whole_number_of_pods_is_refused_naming_the_revision(value: str) -> None:
    with pytest.raises(InvalidObject) as info:
        Chain(annotations={MIN_SCALE: value}).group()
    assert (info.value.kind, info.value.name, info.value.field) == (
        "Revision",
        f"{NAMESPACE}/hello-00001",
        MIN_SCALE_FIELD,
    )
    assert len(str(info.value)) < 300


def test_a_knative_pod_without_a_revision_label_is_refused() -> None:
    chain = Chain()
    pod = make_pod(owned_by(chain.replicaset), name="hello-x1")
    with pytest.raises(InvalidObject) as info:
        group(pod, *chain.owners, objects=[chain.revision])
    assert (info.value.kind, info.value.field) == ("Pod", f"metadata.labels[{REVISION_LABEL}]")


def test_a_knative_pod_naming_a_revision_that_does_not_exist_is_refused() -> None:
    chain = Chain()
    pod = chain.pod(labels={REVISION_LABEL: "gone"})
    with pytest.raises(InvalidObject) as info:
        chain.group(pod)
    assert (info.value.kind, info.value.field) == ("Pod", f"metadata.labels[{REVISION_LABEL}]")
    assert "gone" in info.value.problem


@pytest.mark.parametrize(
    ("found", "field"),
    [
        (podgroup("pg-a-uid-a", None), "metadata.ownerReferences"),
        (podgroup("pg-a-uid-a", "Job"), "metadata.ownerReferences[0].kind"),
    ],
    ids=["owned by nothing", "owned by a Job"],
)
def test_the_one_podgroup_of_a_revision_must_be_the_revision_s_or_a_pod_s(
    found: dict[str, Any], field: str
) -> None:
    chain = Chain()
    pod = chain.pod()
    with pytest.raises(InvalidObject) as info:
        chain.group(pod, pods=[pod, chain.pod(name="old", podgroup="pg-a-uid-a")], podgroups=[found])
    assert (info.value.kind, info.value.field) == ("PodGroup", field)


# --- properties ------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(replicas=st.integers(min_value=1, max_value=6), gang=st.booleans(), min_scale=st.integers(0, 6))
def test_every_pod_of_a_revision_lands_in_exactly_one_podgroup(
    replicas: int, gang: bool, min_scale: int
) -> None:
    chain = Chain(annotations={MIN_SCALE: str(min_scale)})
    pods = [chain.pod(name=f"hello-x{i}") for i in range(replicas)]
    config = GrouperConfig(knative_gang_schedule=gang)
    groupings = [chain.group(p, pods=pods, config=config) for p in pods]
    for pod, g in zip(pods, groupings, strict=True):
        assert g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: g.name}
        owner = g.podgroup["metadata"]["ownerReferences"][0]
        assert owner["kind"] == ("Revision" if gang else "Pod")
        assert gang or owner["name"] == pod.metadata.name
    assert len({g.name for g in groupings}) == (1 if gang else replicas)


@settings(max_examples=80, deadline=None)
@given(
    annotations=st.dictionaries(
        st.sampled_from(
            [
                MIN_SCALE,
                "autoscaling.knative.dev/minScale",
                "autoscaling.knative.dev/initial-scale",
                "autoscaling.knative.dev/max-scale",
            ]
        ),
        st.integers(min_value=0, max_value=MAX_REPLICAS).map(str),
    )
)
def test_min_member_never_exceeds_the_pods_the_revision_keeps(annotations: dict[str, str]) -> None:
    """The pods the simulated Knative keeps for a routed Revision (`scale_of`, Knative's rule) are never
    fewer than the gang KAI's plugin asks of them."""
    replicas, problems = scale_of(annotations)
    assert problems == [] or "max-scale" in problems[0]
    assert spec_of(Chain(annotations=annotations).group())["minMember"] <= max(replicas, 1)


@settings(max_examples=150, deadline=None)
@given(value=HOSTILE_TEXT)
def test_a_hostile_min_scale_is_a_gang_or_refused_naming_the_field(value: str) -> None:
    g, error = outcome(lambda: Chain(annotations={MIN_SCALE: value}).group())
    if error is not None:
        assert (error.kind, error.field) == ("Revision", MIN_SCALE_FIELD)
    else:
        assert g is not None
        assert spec_of(g)["minMember"] == int(value)


@settings(max_examples=150, deadline=None)
@given(spec=HOSTILE_JSON, labels=HOSTILE_JSON, annotations=HOSTILE_JSON, refs=HOSTILE_JSON)
def test_a_hostile_revision_or_podgroup_object_is_refused_never_a_crash(
    spec: Any, labels: Any, annotations: Any, refs: Any
) -> None:
    """Whatever the API returns for the Revision or the revision's one PodGroup, the decision groups or
    refuses, naming the object."""
    chain = Chain()
    pod = chain.pod()
    revision = {
        "apiVersion": SERVING,
        "kind": "Revision",
        "metadata": {"name": "hello-00001", "labels": labels, "annotations": annotations},
        "spec": spec,
    }
    hostile_pg = {
        "apiVersion": keys.PODGROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": "pg-a-uid-a", "namespace": NAMESPACE, "ownerReferences": refs},
    }
    _, error = outcome(
        lambda: group(
            pod,
            *chain.owners,
            objects=[revision, hostile_pg],
            pods=[pod, chain.pod(name="old", podgroup="pg-a-uid-a")],
        )
    )
    assert error is None or error.kind in ("owner", "Revision", "PodGroup")
