"""Where the bind back-off's record lives between cycles: on the PodGroup as annotations
(`shared.kube.bind_failure`, written by the state service's Kubernetes owner), and on the in-memory cluster's
podgroup (`services.state.sources.sim_source`); both take a binder's `PodGroupStamps.bind_failure` as it is, and
None clears it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.state.sources.sim_source import SimulatedCluster
from shared.contracts.messages import ApplyRequest, PodGroupStamps
from shared.errors import InvalidObject
from shared.kube import bind_failure, translate, wire
from shared.model import PodGroup, Queue
from shared.model.objects import BindFailure
from tests.builders import podgroup_manifest

AT = 1_800_000_000.25
FAILURE = BindFailure(at=AT, attempts=3, reason='running PreBind plugin "VolumeBinding": binding volumes: x')


def podgroup(annotations: dict[str, str]) -> wire.PodGroup:
    return wire.convert(wire.PodGroup, podgroup_manifest("train", 1, "team", "team", annotations=annotations))


def test_a_record_written_as_annotations_reads_back_the_same_to_the_millisecond() -> None:
    changes = bind_failure.annotations_patch(podgroup({}), FAILURE)
    assert changes[bind_failure.AT_ANNOTATION] == "2027-01-15T08:00:00.250Z"
    stored = podgroup({k: v for k, v in changes.items() if v is not None})
    assert translate.podgroup_of(stored, priority_classes={}).bind_failure == FAILURE
    assert bind_failure.annotations_patch(stored, FAILURE) == {}


def test_none_removes_the_record_and_a_podgroup_without_one_reads_none() -> None:
    changes = bind_failure.annotations_patch(podgroup({}), FAILURE)
    stored = podgroup({k: v for k, v in changes.items() if v is not None})
    cleared = bind_failure.annotations_patch(stored, None)
    assert cleared == dict.fromkeys(changes)
    assert bind_failure.annotations_patch(podgroup({}), None) == {}
    assert translate.podgroup_of(podgroup({}), priority_classes={}).bind_failure is None


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        pytest.param({bind_failure.AT_ANNOTATION: "yesterday"}, bind_failure.AT_ANNOTATION, id="a time"),
        pytest.param(
            {bind_failure.AT_ANNOTATION: "2026-01-01T00:00:00Z", bind_failure.ATTEMPTS_ANNOTATION: "many"},
            bind_failure.ATTEMPTS_ANNOTATION,
            id="a count",
        ),
        pytest.param(
            {bind_failure.AT_ANNOTATION: "2026-01-01T00:00:00Z", bind_failure.ATTEMPTS_ANNOTATION: "0"},
            bind_failure.ATTEMPTS_ANNOTATION,
            id="no attempts",
        ),
        pytest.param(
            {bind_failure.AT_ANNOTATION: "2026-01-01T00:00:00Z", bind_failure.ATTEMPTS_ANNOTATION: "9" * 40},
            bind_failure.ATTEMPTS_ANNOTATION,
            id="a count of 40 digits",
        ),
    ],
)
def test_an_edited_record_that_cannot_be_read_names_the_podgroup_and_the_annotation(
    annotations: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidObject) as caught:
        translate.podgroup_of(podgroup(annotations), priority_classes={})
    assert (caught.value.kind, caught.value.name) == ("PodGroup", "team/train")
    assert caught.value.field == f"metadata.annotations[{field}]"


@given(st.dictionaries(st.sampled_from(sorted(bind_failure.__all__[:3])), st.text(max_size=30)))
def test_any_annotation_text_is_read_or_refused_by_name(annotations: dict[str, str]) -> None:
    keys = {getattr(bind_failure, name) for name in annotations}
    pg = podgroup({getattr(bind_failure, name): text for name, text in annotations.items()})
    refused: InvalidObject | None = None
    try:
        translate.podgroup_of(pg, priority_classes={})
    except InvalidObject as exc:
        refused = exc
    if refused is not None:
        assert refused.field.removeprefix("metadata.annotations[").removesuffix("]") in keys


def test_the_in_memory_cluster_stores_a_record_and_clears_it() -> None:
    cluster = SimulatedCluster()
    cluster.apply(
        ApplyRequest(queues=(Queue(name="team"),), podgroups=(PodGroup(name="train", queue="team"),)), 0.0
    )
    changed = cluster.stamp(PodGroupStamps(shard="default", bind_failure={"train": FAILURE}), 1.0)
    assert [c.after.bind_failure for c in changed] == [FAILURE]  # type: ignore[union-attr]
    again = cluster.stamp(PodGroupStamps(shard="default", bind_failure={"train": FAILURE}), 2.0)
    assert again == []
    cleared = cluster.stamp(PodGroupStamps(shard="default", bind_failure={"train": None}), 3.0)
    assert [c.after.bind_failure for c in cleared] == [None]  # type: ignore[union-attr]
