"""Spec: a pod's requests are remembered by what they are read from (`shared.kube.translate.pods.pod_requests`).

A cluster's pods repeat a few shapes of requests; the state mirror reads every new pod's. Whatever pods came
before, the requests of a pod are exactly what reading them afresh gives, and a pod whose requests cannot
be read is refused with its own name and field, every time.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.translate import pods

QUANTITIES = st.sampled_from(("500m", "1", "1.5", "2Gi", "1e3", 2, 0.5, "-1", "x", "0.5"))
RESOURCES = st.sampled_from(("cpu", "memory", "nvidia.com/gpu", "example.com/fpga", "hugepages-2Mi"))
AMOUNTS = st.dictionaries(RESOURCES, QUANTITIES, max_size=3)


def containers(prefix: str, *, init: bool) -> st.SearchStrategy[list[dict[str, Any]]]:
    def one(i: int, requests: dict[str, Any], limits: dict[str, Any], policy: str | None) -> dict[str, Any]:
        c: dict[str, Any] = {"name": f"{prefix}{i}", "resources": {"requests": requests, "limits": limits}}
        if init and policy:
            c["restartPolicy"] = policy
        return c

    return st.lists(st.tuples(AMOUNTS, AMOUNTS, st.sampled_from((None, "Always"))), max_size=2).map(
        lambda cs: [one(i, *c) for i, c in enumerate(cs)]
    )


def raw_pod(
    name: str, main: list[dict[str, Any]], inits: list[dict[str, Any]], overhead: dict[str, Any]
) -> wire.Pod:
    spec: dict[str, Any] = {"containers": main, "initContainers": inits, "overhead": overhead}
    return wire.convert(wire.Pod, {"metadata": {"name": name, "namespace": "team"}, "spec": spec})


shapes = st.tuples(containers("c", init=False), containers("i", init=True), AMOUNTS)


def read(pod: wire.Pod) -> Any:
    try:
        return pods.pod_requests(pod)
    except InvalidObject as exc:
        return str(exc)


def read_afresh(pod: wire.Pod) -> Any:
    try:
        return pods._pod_requests(pod)
    except InvalidObject as exc:
        return str(exc)


@given(st.lists(st.tuples(st.sampled_from(("a", "b")), shapes), min_size=1, max_size=6))
def test_a_pod_s_requests_are_what_reading_them_afresh_gives_whatever_came_before(
    history: list[tuple[str, tuple[Any, Any, Any]]],
) -> None:
    for name, shape in history:
        pod = raw_pod(name, *shape)
        assert read(pod) == read_afresh(pod)


@pytest.mark.parametrize("first", ["good", "bad"])
def test_a_pod_whose_requests_cannot_be_read_is_refused_with_its_own_name_every_time(first: str) -> None:
    bad = [{"name": "main", "resources": {"requests": {"cpu": "lots"}}}]
    if first == "good":
        pods.pod_requests(
            raw_pod("fine", [{"name": "main", "resources": {"requests": {"cpu": "1"}}}], [], {})
        )
    for name in ("p1", "p2"):
        with pytest.raises(InvalidObject) as caught:
            pods.pod_requests(raw_pod(name, bad, [], {}))
        assert caught.value.name == f"team/{name}"
        assert caught.value.field == "spec.containers[0].resources.requests[cpu]"


def test_pods_of_one_shape_share_what_was_read() -> None:
    main = [{"name": "main", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]
    first = pods.pod_requests(raw_pod("p1", main, [], {}))
    assert pods.pod_requests(raw_pod("p2", main, [], {})) is first
    assert first.cpu_millis == 500.0
