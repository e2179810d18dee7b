"""Spec: a podgroup's translation brought to a version that changed only its status
(`shared.kube.translate.podgroups.podgroup_restated`).

The write-back patches a PodGroup's status about once per bound pod; the state mirror then keeps the
podgroup's translation instead of translating it again. Whatever `podgroup_restated` returns is exactly
what a whole translation of the new version gives; it returns the translation itself when nothing of it
moved, and declines (None) whenever anything but the status and the resourceVersion changed.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import keys, wire
from shared.kube.translate.podgroups import podgroup_of, podgroup_restated
from shared.model import PodGroup

TRIED_IN_DEFAULT = {
    "type": "UnschedulableOnNodePool",
    "nodePool": "default",
    "status": "True",
    "transitionID": "1",
}
STATUSES: dict[str, dict[str, Any]] = {
    "empty": {},
    "running": {"phase": "Running", "running": 2, "resourcesStatus": {"allocated": {"cpu": "1"}}},
    "tried in its pool": {"phase": "Pending", "schedulingConditions": [TRIED_IN_DEFAULT]},
    "tried in another pool": {"schedulingConditions": [{**TRIED_IN_DEFAULT, "nodePool": "b"}]},
}


def raw_group(
    *,
    status: str = "empty",
    version: str = "1",
    backoff: int | None = None,
    queue: str = "research",
    min_member: int = 1,
    pool: str = "",
    annotation: str = "",
    priority_class: str = "",
) -> wire.PodGroup:
    meta: dict[str, Any] = {
        "name": "g",
        "namespace": "team",
        "uid": "uid-g",
        "resourceVersion": version,
        "creationTimestamp": "2026-01-01T00:00:01Z",
        "labels": {keys.NODE_POOL_LABEL: pool} if pool else {},
        "annotations": {keys.LAST_START_ANNOTATION: annotation} if annotation else {},
    }
    spec: dict[str, Any] = {"minMember": min_member, "queue": queue}
    if backoff is not None:
        spec["schedulingBackoff"] = backoff
    if priority_class:
        spec["priorityClassName"] = priority_class
    return wire.convert(
        wire.PodGroup,
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": meta,
            "spec": spec,
            "status": STATUSES[status],
        },
    )


versions = st.builds(
    raw_group,
    status=st.sampled_from(tuple(STATUSES)),
    version=st.sampled_from(("1", "2")),
    backoff=st.sampled_from((None, -1, 1)),
    queue=st.sampled_from(("research", "dev")),
    min_member=st.sampled_from((1, 2, -1)),
    pool=st.sampled_from(("", "b")),
    annotation=st.sampled_from(("", "2026-01-01T00:00:05Z", "not a time")),
    priority_class=st.sampled_from(("", "high")),
)


def translated(group: wire.PodGroup) -> PodGroup | None:
    try:
        return podgroup_of(group, priority_classes={"high": 1000})
    except InvalidObject:
        return None


@given(versions, versions)
def test_a_restated_podgroup_is_exactly_what_translating_its_new_version_whole_gives(
    before: wire.PodGroup, after: wire.PodGroup
) -> None:
    first = translated(before)
    if first is None:
        return
    restated = podgroup_restated(before, first, after)
    if restated is not None:
        assert restated == translated(after)


@pytest.mark.parametrize("status", tuple(STATUSES))
@pytest.mark.parametrize("backoff", [None, -1])
def test_a_status_patch_leaves_the_translation_itself_when_no_backoff_is_asked(
    status: str, backoff: int | None
) -> None:
    before = raw_group(backoff=backoff)
    first = podgroup_of(before, priority_classes={})
    assert podgroup_restated(before, first, raw_group(status=status, version="2", backoff=backoff)) is first


def test_a_scheduling_condition_in_its_pool_backs_off_a_podgroup_that_asks_for_it() -> None:
    before = raw_group(backoff=1)
    first = podgroup_of(before, priority_classes={})
    tried = podgroup_restated(before, first, raw_group(status="tried in its pool", version="2", backoff=1))
    assert tried is not None
    assert (first.backed_off, tried.backed_off) == (False, True)
    elsewhere = raw_group(status="tried in another pool", version="3", backoff=1)
    assert podgroup_restated(before, first, elsewhere) is first


@given(
    st.sampled_from(
        (
            {"queue": "dev"},
            {"min_member": 2},
            {"backoff": 1},
            {"pool": "b"},
            {"annotation": "2026-01-01T00:00:05Z"},
            {"priority_class": "high"},
        )
    )
)
def test_a_change_beyond_the_status_is_translated_whole(change: dict[str, Any]) -> None:
    before = raw_group()
    first = podgroup_of(before, priority_classes={})
    assert podgroup_restated(before, first, raw_group(version="2", **change)) is None
