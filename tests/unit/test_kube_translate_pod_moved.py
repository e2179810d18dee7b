"""Spec: a pod's translation brought to its next version (`shared.kube.translate.pods.pod_moved`).

The state mirror reuses a pod's last translation when the pod changed only where a bind and the kubelet
write (its node, its status): whatever it returns is exactly what a whole translation of the new version
gives, and it declines (None) whenever anything else the translation reads changed.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.translate.pods import pod_moved, pod_of
from shared.model import PodStatus


def raw_pod(
    *,
    node: str = "",
    phase: str = "Pending",
    deleting: bool = False,
    fraction: bool = False,
    cpu: str = "500m",
    labels: tuple[tuple[str, str], ...] = (),
    claim_made: bool = False,
    ready: bool = False,
    version: str = "1",
) -> wire.Pod:
    meta: dict[str, Any] = {
        "name": "p",
        "namespace": "team",
        "uid": "uid-p",
        "resourceVersion": version,
        "creationTimestamp": "2026-01-01T00:00:01Z",
        "labels": dict(labels),
        "annotations": {"pod-group-name": "g"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    if fraction:
        meta["annotations"]["gpu-fraction"] = "0.5"
        meta["annotations"]["runai/shared-gpu-configmap"] = "p-shared-gpu"
    spec: dict[str, Any] = {
        "schedulerName": "kai-scheduler",
        "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
    }
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
        status["containerStatuses"] = [{"name": "main", "ready": True}]
    if claim_made:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]
    return wire.convert(
        wire.Pod, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
    )


versions = st.builds(
    raw_pod,
    node=st.sampled_from(("", "n1", "n2")),
    phase=st.sampled_from(("Pending", "Running", "Succeeded", "Failed", "")),
    deleting=st.booleans(),
    fraction=st.booleans(),
    cpu=st.sampled_from(("500m", "1")),
    labels=st.sampled_from(((), (("tier", "a"),))),
    claim_made=st.booleans(),
    ready=st.booleans(),
    version=st.sampled_from(("1", "2")),
)


def translated(pod: wire.Pod) -> Any:
    try:
        return pod_of(pod, podgroup="team/g")
    except InvalidObject:
        return None


@given(versions, versions)
def test_a_moved_pod_is_exactly_what_translating_its_new_version_whole_gives(
    before: wire.Pod, after: wire.Pod
) -> None:
    first = translated(before)
    if first is None:
        return
    moved = pod_moved(before, first, after)
    if moved is not None:
        assert moved == translated(after)


def test_a_bind_and_the_kubelet_s_running_reuse_the_translation() -> None:
    pending = raw_pod()
    bound = raw_pod(node="n1", version="2")
    running = raw_pod(node="n1", phase="Running", ready=True, version="3")
    pod = pod_of(pending, podgroup="team/g")
    on_node = pod_moved(pending, pod, bound)
    assert on_node is not None
    assert (on_node.status, on_node.node) == (PodStatus.BOUND, "n1")
    started = pod_moved(bound, on_node, running)
    assert started is not None
    assert started.status == PodStatus.RUNNING
    assert started == pod_of(running, podgroup="team/g")


@given(
    st.sampled_from(
        (
            {"cpu": "1"},
            {"labels": (("tier", "a"),)},
            {"deleting": True},
            {"claim_made": True},
        )
    )
)
def test_a_change_beyond_node_and_status_is_translated_whole(change: dict[str, Any]) -> None:
    before = raw_pod(node="n1", phase="Running")
    assert (
        pod_moved(before, pod_of(before, podgroup="team/g"), raw_pod(node="n1", phase="Running", **change))
        is None
    )


def test_a_pod_sharing_a_gpu_is_translated_whole() -> None:
    """Its checks read the node and the phase (an unbound fractional pod needs its sharing ConfigMap)."""
    before = raw_pod(fraction=True)
    assert pod_moved(before, pod_of(before, podgroup="team/g"), raw_pod(fraction=True, node="n1")) is None
