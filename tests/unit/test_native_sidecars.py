"""Native sidecars (KEP-753): a pod's requests as the kubelet admits it and kube-scheduler fits it, which KAI
v0.15 follows (issue 29, deliverable 4).

An init container with ``restartPolicy: Always`` is a sidecar: it keeps running beside the containers, so
its requests are summed with theirs, and a regular init container after it runs beside it too. The pod asks
max(containers + sidecars, each init container's turn) per resource, plus its overhead. The same rule in
every place Kairos counts a pod: translation for the core (`shared.kube.translate.pod_requests`), the
simulated default scheduler (`tools.kubesim.scheduler.pod_requests`) and the scale adjuster's scaling pods
(`services.state.controllers.scaling_pods`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.state.controllers import scaling_pods
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.kube import translate, wire
from shared.kube.effective_requests import effective_requests
from shared.model import Node, Snapshot
from tests import builders
from tests.builders import GIB
from tests.unit.test_kube_translate import pod, pod_doc, podgroup, podgroup_doc
from tools.kubesim.scheduler import pod_requests as kubesim_requests

SIDECAR = {"restartPolicy": "Always"}


def c(name: str, cpu: str | None = None, memory: str | None = None, **fields: Any) -> dict[str, Any]:
    """A container asking `cpu` and `memory` (omitted when None)."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": name, "resources": {"requests": requests}, **fields}


def doc(containers: list[dict[str, Any]], inits: list[dict[str, Any]] = (), **spec: Any) -> dict[str, Any]:  # type: ignore[assignment]
    body = pod_doc(**spec)
    body["spec"]["containers"] = containers
    if inits:
        body["spec"]["initContainers"] = list(inits)
    return body


def cpu_of(body: dict[str, Any]) -> float:
    return translate.pod_requests(pod(body)).cpu_millis


# --- the rule, case by case (KEP-753's resource calculation) ---------------------------------------------
@pytest.mark.parametrize(
    ("containers", "inits", "millicores"),
    [
        pytest.param([c("app", "1")], [c("istio-proxy", "500m", **SIDECAR)], 1500, id="Istio: app + sidecar"),
        pytest.param(
            [c("a", "1"), c("b", "1")], [c("setup", "3")], 3000, id="no sidecar: the largest init wins"
        ),
        pytest.param(
            [c("a", "1"), c("b", "1")], [c("setup", "1")], 2000, id="no sidecar: the containers win"
        ),
        pytest.param(
            [c("app", "1")],
            [c("proxy", "500m", **SIDECAR), c("migrate", "2")],
            2500,
            id="an init after a sidecar runs beside it",
        ),
        pytest.param(
            [c("app", "1")],
            [c("migrate", "2"), c("proxy", "500m", **SIDECAR)],
            2000,
            id="an init before a sidecar runs alone",
        ),
        pytest.param(
            [c("app", "100m")],
            [c("log", "200m", **SIDECAR), c("proxy", "300m", **SIDECAR), c("warm-up", "1")],
            1500,
            id="every sidecar started before an init runs beside it",
        ),
        pytest.param(
            [c("app", "1")], [c("big", "3", **SIDECAR)], 4000, id="a sidecar larger than the app adds up"
        ),
        pytest.param(
            [c("app", "1")],
            [c("proxy", "500m", restartPolicy="Never")],
            1000,
            id="only Always makes a sidecar",
        ),
        pytest.param([c("app", "1")], [c("proxy", None, **SIDECAR)], 1000, id="a sidecar asking nothing"),
    ],
)
def test_a_pods_cpu_counts_its_sidecars_as_the_kubelet_does(
    containers: list[dict[str, Any]], inits: list[dict[str, Any]], millicores: float
) -> None:
    assert cpu_of(doc(containers, inits)) == millicores


def test_each_resource_peaks_on_its_own() -> None:
    # CPU peaks while running (app + sidecar), memory during the init that runs beside the sidecar.
    body = doc([c("app", "2", "1Gi")], [c("proxy", "500m", "1Gi", **SIDECAR), c("load", "1", "8Gi")])
    requests = translate.pod_requests(pod(body))
    assert (requests.cpu_millis, requests.memory_bytes) == (2500, 9 * GIB)


def test_the_overhead_comes_on_top_of_the_sidecars() -> None:
    body = doc([c("app", "1")], [c("proxy", "500m", **SIDECAR)], overhead={"cpu": "250m"})
    assert cpu_of(body) == 1750


def test_a_sidecars_extended_resources_add_up_with_the_apps() -> None:
    app = {"name": "app", "resources": {"requests": {"cpu": "1", "rdma/ib": "1"}}}
    proxy = {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"rdma/ib": "1"}}}
    assert translate.pod_of(pod(doc([app], [proxy]))).scalars == {"rdma/ib": 2.0}


def test_a_sidecar_with_a_limit_only_asks_for_it() -> None:
    proxy = {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"cpu": "500m"}}}
    assert cpu_of(doc([c("app", "1")], [proxy])) == 1500


# --- what it changes for placement -----------------------------------------------------------------------
def two_cpu_node() -> Node:
    return builders.node("n1", 0, cpu_millis=2000, memory_bytes=64 * GIB)


def istio_pods(count: int) -> Snapshot:
    workloads: list[builders.Workload] = []
    for i in range(count):
        body = doc([c("app", "1")], [c("istio-proxy", "500m", **SIDECAR)])
        body["metadata"] |= {"name": f"web-{i}", "uid": f"uid-{i}"}
        body["metadata"]["annotations"]["pod-group-name"] = f"pg-{i}"
        body["metadata"]["labels"] = {"kai.scheduler/queue": "team-a"}
        group = podgroup_doc(queue="team-a", minMember=1)
        group["metadata"] |= {"name": f"pg-{i}", "uid": f"pg-uid-{i}"}
        workloads.append((podgroup(group), [translate.pod_of(pod(body))]))
    return builders.snapshot([two_cpu_node()], *workloads, queues=builders.team_queues("team-a", root="root"))


def test_a_two_cpu_node_takes_one_istio_pod_not_two() -> None:
    # Each pod needs 1.5 CPU; counted as 1 CPU (sidecar max'ed away), two would go and the kubelet would
    # refuse the second with OutOfcpu.
    result = schedule(istio_pods(2), 0.0, Policy(actions=("allocate",)))
    bound = [b.pod for p in result.binds for b in p.bindings]
    assert len(bound) == 1
    (pending,) = result.pending
    assert "CPU" in pending.message


# --- the same rule in kubesim's default scheduler and in scaling pods ------------------------------------
def test_kubesims_default_scheduler_counts_sidecars_too() -> None:
    body = doc([c("app", "1", "1Gi")], [c("proxy", "500m", "256Mi", **SIDECAR), c("init", "2")])
    assert kubesim_requests(body) == {"cpu": Fraction(5, 2), "memory": Fraction(GIB + GIB // 4)}


def test_a_scaling_pod_asks_for_what_the_pod_with_its_sidecar_needs() -> None:
    body = doc([c("app", "1", "1Gi")], [c("proxy", "500m", "512Mi", **SIDECAR)])
    body["metadata"]["annotations"]["gpu-fraction"] = "0.5"
    waiting = scaling_pods.Waiting(pod=wire.convert(wire.Pod, body), hundredths=50, devices=1)
    manifest = scaling_pods.scaling_pod(waiting, scaling_pods.ScaleAdjustOptions())
    requests = manifest["spec"]["containers"][0]["resources"]["requests"]
    assert (requests["cpu"], requests["memory"]) == ("1500m", "1610612736")


# --- properties ----------------------------------------------------------------------------------------------
amounts = st.dictionaries(
    st.sampled_from(["cpu", "memory", "rdma/ib"]),
    st.fractions(min_value=0, max_value=64, max_denominator=1000),
)


@given(
    containers=st.lists(amounts, max_size=3), inits=st.lists(st.tuples(st.booleans(), amounts), max_size=5)
)
def test_the_request_covers_every_moment_of_the_pods_life_and_no_more(
    containers: list[dict[str, Fraction]], inits: list[tuple[bool, dict[str, Fraction]]]
) -> None:
    got = effective_requests(containers, inits)
    for resource in {r for a in [*containers, *(i for _, i in inits)] for r in a}:
        sidecars = [a.get(resource, Fraction(0)) for side, a in inits if side]
        running = sum((a.get(resource, Fraction(0)) for a in containers), Fraction(0)) + sum(sidecars)
        moments = [running]
        before = Fraction(0)
        for side, a in inits:
            own = a.get(resource, Fraction(0))
            moments.append(before + own)
            if side:
                before += own
        assert got.get(resource, Fraction(0)) == max(moments)


@given(containers=st.lists(amounts, max_size=3), inits=st.lists(amounts, max_size=4))
def test_without_sidecars_it_is_the_old_rule(
    containers: list[dict[str, Fraction]], inits: list[dict[str, Fraction]]
) -> None:
    got = effective_requests(containers, [(False, a) for a in inits])
    for resource in {r for a in [*containers, *inits] for r in a}:
        summed = sum((a.get(resource, Fraction(0)) for a in containers), Fraction(0))
        largest = max((a.get(resource, Fraction(0)) for a in inits), default=Fraction(0))
        assert got.get(resource, Fraction(0)) == max(summed, largest)
