"""Bad input through the real kubectl: a Queue with a negative quota and a pod with gpu-fraction "abc"
applied to `kairos up`'s simulated API server are held back, `kubectl describe` and `kubectl get events`
say why (naming the object and the field), a valid pod next to them runs, and fixing the queue with
`kubectl apply` sets its condition back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.kubectl import kubectl
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tools.stack.supervisor import ClusterChoice, Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTLE = 60.0
"""Seconds a test waits for the cluster to reach what it expects (generous: the machine may be loaded)."""


def bad_queue(quota: int) -> str:
    return f"""
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata:
  name: broken
spec:
  parentQueue: default-parent-queue
  resources:
    gpu: {{quota: {quota}, limit: -1, overQuotaWeight: 1}}
"""


PODS = """
apiVersion: v1
kind: Pod
metadata:
  name: odd-fraction
  labels: {kai.scheduler/queue: default-queue}
  annotations: {gpu-fraction: "abc"}
spec:
  schedulerName: kai-scheduler
  containers: [{name: main, image: ubuntu}]
---
apiVersion: v1
kind: Pod
metadata:
  name: fine
  labels: {kai.scheduler/queue: default-queue}
spec:
  schedulerName: kai-scheduler
  containers: [{name: main, image: ubuntu, resources: {limits: {nvidia.com/gpu: "1"}}}]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = start_stack(
        tmp_path_factory.mktemp("kairos"),
        cluster=ClusterChoice(kind="kubesim", nodes=2, gpus_per_node=8, run_delay=0.1),
        options={"queue": {"period": "0.5"}},
    )
    try:
        yield started
    finally:
        started.stop()


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    return kubectl_wait_for(what, check, settle=SETTLE)


def accepted(stack: Stack) -> dict[str, Any] | None:
    queue = json.loads(kubectl(stack, "get", "queue", "broken", "-o", "json"))
    conditions = (queue.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Accepted"), None)


def test_kubectl_shows_why_a_bad_queue_and_pod_are_held_back_and_the_rest_runs(stack: Stack) -> None:
    kubectl(stack, "apply", "-f", "-", stdin=bad_queue(-5))
    kubectl(stack, "apply", "-f", "-", stdin=PODS)

    def warned() -> str | None:
        text = kubectl(stack, "get", "events", "-A")
        return text if "InvalidQueue" in text and "InvalidPod" in text else None

    events = wait_for("InvalidQueue and InvalidPod events in `kubectl get events`", warned)
    assert "spec.resources.gpu.quota" in events
    assert "gpu-fraction" in events

    described = wait_for(
        "the condition in `kubectl describe queue`",
        lambda: (text := kubectl(stack, "describe", "queue", "broken")) and "InvalidQueue" in text and text,
    )
    assert "spec.resources.gpu.quota" in described
    pod = kubectl(stack, "describe", "pod", "odd-fraction")
    assert "InvalidPod" in pod
    assert "gpu-fraction" in pod

    def fine_running() -> bool:
        return kubectl(stack, "get", "pod", "fine", "-o", "jsonpath={.status.phase}") == "Running"

    wait_for("the valid pod Running next to the bad ones", fine_running)
    assert kubectl(stack, "get", "pod", "odd-fraction", "-o", "jsonpath={.spec.nodeName}") == ""

    kubectl(stack, "apply", "-f", "-", stdin=bad_queue(4))
    back = wait_for(
        "Accepted=True once the queue is fixed",
        lambda: (c := accepted(stack)) is not None and c["status"] == "True" and c,
    )
    assert back["reason"] == "Accepted"
