"""The simulated kubelet's ends and false starts of a pod, as the real one has them: graceful termination
(``kairos.io/stop-seconds``: the pod stays Running with a deletionTimestamp, holding its devices, until its
containers exit or its grace period ends; then the kubelet writes its terminal phase and deletes it) and an
image that cannot be pulled (a registry host ending in ``.invalid``: ErrImagePull, then ImagePullBackOff,
the pod Pending and holding the devices it was admitted with). The clock is moved by hand."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import START, Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.images import pull_failure
from tools.kubesim.nodesim import STOP_SECONDS

RUN_DELAY = 0.5
UNPULLABLE = "registry.kairos.invalid/kairos:1.0"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=RUN_DELAY, seed=3))


def run_pod(
    cluster: Cluster,
    name: str,
    *,
    gpus: int = 0,
    image: str = "busybox",
    stop: float | None = None,
    grace: int | None = None,
    node: str | None = "node-0",
) -> None:
    container: dict[str, Any] = {"name": "main", "image": image}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {"schedulerName": "kai-scheduler", "containers": [container]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    annotations = {STOP_SECONDS: str(stop)} if stop is not None else {}
    body = {"metadata": {"name": name, "annotations": annotations}, "spec": spec}
    cluster.create(cluster.type_of("pods"), "default", body)
    if node is not None:
        cluster.bind("default", name, {"target": {"name": node}})
    cluster.settle()


def at(cluster: Cluster, clock: Clock, seconds: float) -> None:
    clock.now = START + seconds
    cluster.settle()


def pod(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.find("pods", "default", name)


def delete(cluster: Cluster, name: str, **options: Any) -> dict[str, Any]:
    answer = cluster.delete(cluster.type_of("pods"), "default", name, options)
    cluster.settle()
    return answer


def changes_of(cluster: Cluster, name: str) -> list[tuple[str, str | None, bool]]:
    """Every change the pod went through, as a watch sees it: (type, phase, marked for deletion)."""
    out = []
    for change in cluster.store.storage("pods").history:
        obj = change.obj
        if obj["metadata"]["name"] == name:
            md = obj["metadata"]
            out.append(
                (change.type, (obj.get("status") or {}).get("phase"), bool(md.get("deletionTimestamp")))
            )
    return out


def events_of(cluster: Cluster, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in cluster.objects("events", "default")
        if e["involvedObject"]["name"] == name
    ]


# --- graceful termination -----------------------------------------------------------------------------------
def test_a_pod_deleted_with_a_grace_period_runs_until_its_containers_exit(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(cluster, "p", gpus=2, stop=20)
    at(cluster, clock, RUN_DELAY)
    uid = (pod(cluster, "p") or {})["metadata"]["uid"]

    answer = delete(cluster, "p", gracePeriodSeconds=60)
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 60
    terminating = pod(cluster, "p")
    assert terminating is not None
    assert terminating["status"]["phase"] == "Running"
    assert terminating["metadata"]["deletionTimestamp"]
    assert cluster.nodesim.kubelet.plugin.free("node-0", 8) == [2, 3, 4, 5, 6, 7]  # still holds its devices

    at(cluster, clock, RUN_DELAY + 19.9)
    assert pod(cluster, "p") is not None
    at(cluster, clock, RUN_DELAY + 20)
    assert pod(cluster, "p") is None
    assert cluster.nodesim.kubelet.plugin.free("node-0", 8) == list(range(8))
    # Exited by itself (0): Succeeded, written before the kubelet's own delete.
    assert changes_of(cluster, "p")[-2:] == [("MODIFIED", "Succeeded", True), ("DELETED", "Succeeded", True)]
    assert uid not in cluster.nodesim.stop_at


def test_containers_still_running_at_the_end_of_the_grace_period_are_killed(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(cluster, "p", stop=3600, grace=45)
    at(cluster, clock, RUN_DELAY)
    delete(cluster, "p")  # the pod's own terminationGracePeriodSeconds
    at(cluster, clock, RUN_DELAY + 44)
    assert (pod(cluster, "p") or {})["status"]["phase"] == "Running"
    at(cluster, clock, RUN_DELAY + 45)
    assert pod(cluster, "p") is None
    modified = [c for c in cluster.store.storage("pods").history if c.obj["metadata"]["name"] == "p"][-2]
    assert modified.obj["status"]["phase"] == "Failed"
    [terminated] = modified.obj["status"]["containerStatuses"]
    assert terminated["state"]["terminated"]["exitCode"] == 137


def test_a_second_delete_can_shorten_the_grace_period_and_grace_zero_removes_at_once(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(cluster, "slow", stop=3600)
    run_pod(cluster, "forced", stop=3600)
    at(cluster, clock, RUN_DELAY)
    for name in ("slow", "forced"):
        delete(cluster, name, gracePeriodSeconds=600)
    delete(cluster, "slow", gracePeriodSeconds=900)  # a longer one does not extend it
    assert (pod(cluster, "slow") or {})["metadata"]["deletionGracePeriodSeconds"] == 600
    delete(cluster, "slow", gracePeriodSeconds=10)
    delete(cluster, "forced", gracePeriodSeconds=0)
    assert pod(cluster, "forced") is None
    at(cluster, clock, RUN_DELAY + 10)
    assert pod(cluster, "slow") is None


@pytest.mark.parametrize(
    ("stop", "node", "grace"),
    [(None, "node-0", 60), (30.0, None, 60), (30.0, "node-0", 0)],
    ids=["no stop-seconds", "not bound", "grace 0"],
)
def test_deletion_is_immediate_without_graceful_termination(
    cluster: Cluster, clock: Clock, stop: float | None, node: str | None, grace: int
) -> None:
    run_pod(cluster, "p", stop=stop, node=node)
    at(cluster, clock, RUN_DELAY)
    delete(cluster, "p", gracePeriodSeconds=grace)
    assert pod(cluster, "p") is None


def test_a_terminating_pod_can_still_be_changed_and_is_not_removed_by_the_change(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(cluster, "p", stop=3600)
    at(cluster, clock, RUN_DELAY)
    delete(cluster, "p", gracePeriodSeconds=60)
    cluster.patch(
        cluster.type_of("pods"),
        "default",
        "p",
        "application/merge-patch+json",
        b'{"metadata": {"labels": {"seen": "yes"}}}',
    )
    still = pod(cluster, "p")
    assert still is not None
    assert still["metadata"]["labels"] == {"seen": "yes"}


# --- images that cannot be pulled ---------------------------------------------------------------------------------
def test_an_image_from_a_registry_that_cannot_resolve_fails_to_pull_and_backs_off(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(cluster, "p", gpus=1, image=UNPULLABLE)
    at(cluster, clock, RUN_DELAY)
    p = pod(cluster, "p")
    assert p is not None
    assert p["status"]["phase"] == "Pending"
    [status] = p["status"]["containerStatuses"]
    failure = pull_failure(UNPULLABLE)
    assert failure is not None
    assert "lookup registry.kairos.invalid: no such host" in failure
    assert status["state"]["waiting"] == {"reason": "ErrImagePull", "message": failure}
    assert cluster.nodesim.kubelet.plugin.free("node-0", 8) == list(range(1, 8))  # admitted before the pull
    assert events_of(cluster, "p") == [
        ("Warning", "Failed", f'Failed to pull image "{UNPULLABLE}": {failure}')
    ]

    at(cluster, clock, RUN_DELAY + 10)
    [status] = (pod(cluster, "p") or {})["status"]["containerStatuses"]
    assert status["state"]["waiting"] == {
        "reason": "ImagePullBackOff",
        "message": f'Back-off pulling image "{UNPULLABLE}"',
    }
    assert ("Normal", "BackOff", f'Back-off pulling image "{UNPULLABLE}"') in events_of(cluster, "p")
    at(cluster, clock, RUN_DELAY + 20)
    assert len(events_of(cluster, "p")) == 2  # backing off as before: nothing new to report


@pytest.mark.parametrize(
    "image", ["busybox", "kairos:1.0", "ghcr.io/nvidia/kai:v1", "localhost:5000/x", "invalid/x"]
)
def test_every_other_image_can_be_pulled(image: str) -> None:
    assert pull_failure(image) is None
