"""The write-back remembers what a pod asks for across its versions (`WriteBack._pod_demand`): a version
that asks for the same (its containers, init containers, overhead and annotations) is counted from the
remembered sums, any other is parsed again, and either way a pod counts exactly as
`translate.pod_resources` counts it afresh."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.controllers.writeback import WriteBack, WriteBackOptions
from services.state.mirror.cache import Mirror
from shared.bus.service import ServiceContext
from shared.errors import InvalidObject
from shared.kube import translate, wire
from shared.kubeapi.client import Kube
from tests.unit.test_podgroup_fields import pod_doc


def writeback() -> WriteBack:
    return WriteBack(
        cast(ServiceContext, SimpleNamespace(counters={})),
        cast(Kube, None),
        Mirror(scheduler_name="kai-scheduler"),
        WriteBackOptions(),
    )


def counted(wb: WriteBack, pod: wire.Pod) -> tuple[dict[str, str], dict[str, str]] | str:
    try:
        requested, allocated = wb._pod_resources(pod, None)
    except InvalidObject as exc:
        return str(exc)
    return requested.resource_list(), allocated.resource_list()


def fresh(pod: wire.Pod) -> tuple[dict[str, str], dict[str, str]] | str:
    try:
        requested, allocated = translate.pod_resources(pod, None)
    except InvalidObject as exc:
        return str(exc)
    return requested.resource_list(), allocated.resource_list()


def test_a_bound_pod_is_counted_from_the_sums_it_had_pending() -> None:
    wb = writeback()
    pending = pod_doc("Pending", requests={"cpu": "500m", "memory": "1Gi"}, node=None)
    bound = pod_doc("Pending", requests={"cpu": "500m", "memory": "1Gi"}, scheduled=True)
    assert counted(wb, pending) == ({"cpu": "500m", "memory": "1Gi"}, {})
    [(_, remembered)] = wb._pod_demands.values()
    assert counted(wb, bound) == ({"cpu": "500m", "memory": "1Gi"}, {"cpu": "500m", "memory": "1Gi"})
    [(_, now)] = wb._pod_demands.values()
    assert now is remembered  # not parsed again


def test_a_pod_resized_in_place_is_counted_with_its_new_requests() -> None:
    wb = writeback()
    assert counted(wb, pod_doc("Running", requests={"cpu": "1"})) == ({"cpu": "1"}, {"cpu": "1"})
    assert counted(wb, pod_doc("Running", requests={"cpu": "2"})) == ({"cpu": "2"}, {"cpu": "2"})


amounts = st.sampled_from(["100m", "1", "2", "1Gi", "1500M", "0.5", "-1", "lots"])
requests = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/foo"]), amounts)
annotations = st.dictionaries(
    st.sampled_from(["gpu-fraction", "gpu-memory", "gpu-fraction-num-devices", "team"]),
    st.sampled_from(["0.5", "1", "2", "1024", "x", "-1"]),
    max_size=2,
)
versions = st.builds(
    lambda phase, node, scheduled, requests, limits, annotations: pod_doc(
        phase, requests=requests, limits=limits, annotations=annotations, node=node, scheduled=scheduled
    ),
    st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
    st.sampled_from([None, "n1"]),
    st.sampled_from([None, True, False]),
    requests,
    st.one_of(st.none(), requests),
    st.one_of(st.none(), annotations),
)


@settings(max_examples=200)
@given(st.lists(versions, min_size=1, max_size=5))
def test_every_version_of_a_pod_counts_as_counting_it_afresh_does(history: list[Any]) -> None:
    wb = writeback()
    for version in history:
        assert counted(wb, version) == fresh(version)


def test_a_started_pod_counted_as_when_it_was_bound_gets_the_very_same_sums() -> None:
    wb = writeback()
    bound = pod_doc("Pending", requests={"cpu": "500m", "memory": "1Gi"}, scheduled=True)
    running = pod_doc("Running", requests={"cpu": "500m", "memory": "1Gi"}, scheduled=True)
    first = wb._pod_resources(bound, None)
    assert wb._pod_resources(running, None) is first  # not worked out, nor then summed, again
    assert counted(wb, running) == fresh(running)


@settings(max_examples=100)
@given(st.lists(versions, min_size=1, max_size=4), st.lists(versions, min_size=0, max_size=3))
def test_a_podgroup_recounted_after_any_history_of_its_pods_shows_their_fresh_sums(
    one: list[Any], other: list[Any]
) -> None:
    wb = writeback()
    others = [
        msgspec.structs.replace(p, metadata=msgspec.structs.replace(p.metadata, uid="u2")) for p in other
    ]
    for step in range(max(len(one), len(others))):
        pods = [one[min(step, len(one) - 1)], *([others[min(step, len(others) - 1)]] if others else [])]
        status = translate.podgroup_resources_status(
            pods, non_preemptible=False, resources_of=wb._pod_resources
        )
        assert status == translate.podgroup_resources_status(pods, non_preemptible=False)
