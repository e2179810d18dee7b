"""Bad input through the real kubectl: a Queue with a negative quota and a pod with gpu-fraction "abc"
applied to `kairos up`'s simulated API server are held back, `kubectl describe` and `kubectl get events`
say why (naming the object and the field), a valid pod next to them runs, and fixing the queue with
`kubectl apply` sets its condition back. A SchedulingShard patched with a negative kValue or an unknown
plugin gets a Warning naming the field while the last good configuration stays in force.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTLE = 60.0
"""Seconds a test waits for the cluster to reach what it expects (generous: the machine may be loaded)."""


PODS = (
    manifests.pod("odd-fraction", annotations={"gpu-fraction": "abc"}),
    manifests.pod("fine", gpus="1"),
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    return kubectl_wait_for(what, check, settle=SETTLE)


def accepted(stack: Stack) -> dict[str, Any] | None:
    queue = json.loads(kubectl(stack, "get", "queue", "broken", "-o", "json"))
    conditions = (queue.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Accepted"), None)


def test_kubectl_shows_why_a_bad_queue_and_pod_are_held_back_and_the_rest_runs(stack: Stack) -> None:
    apply(stack, manifests.queue("broken", gpu_quota=-5))
    apply(stack, *PODS)

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

    apply(stack, manifests.queue("broken", gpu_quota=4))
    back = wait_for(
        "Accepted=True once the queue is fixed",
        lambda: (c := accepted(stack)) is not None and c["status"] == "True" and c,
    )
    assert back["reason"] == "Accepted"


def test_a_bad_scheduling_shard_is_named_in_an_event_and_the_last_good_one_stays(stack: Stack) -> None:
    def shard_events() -> str | None:
        text = kubectl(stack, "get", "events", "-A", "--field-selector", "reason=InvalidSchedulingShard")
        return text if "spec.kValue" in text and "fairy" in text else None

    kubectl(stack, "patch", "schedulingshard", "default", "--type=merge", "-p", '{"spec":{"kValue":2}}')
    wait_for("kValue 2 in force", lambda: re.search(r"kValue\W+2\b", kairos(stack, "status")))
    kubectl(stack, "patch", "schedulingshard", "default", "--type=merge", "-p", '{"spec":{"kValue":-1}}')
    wait_for(
        "the negative kValue named",
        lambda: "spec.kValue" in kubectl(stack, "describe", "schedulingshard", "default"),
    )
    kubectl(
        stack,
        "patch",
        "schedulingshard",
        "default",
        "--type=merge",
        "-p",
        '{"spec":{"kValue":2,"plugins":{"fairy":{"enabled":true}}}}',
    )
    events = wait_for("Warnings naming kValue and the unknown plugin", shard_events)
    assert "Warning" in events
    status = kairos(stack, "status")
    assert re.search(r"kValue\W+2\b", status), status
    apply(stack, manifests.pod("after-bad-shard", gpus="1"))
    wait_for(
        "a pod scheduled under the last good configuration",
        lambda: (
            kubectl(stack, "get", "pod", "after-bad-shard", "-o", "jsonpath={.status.phase}") == "Running"
        ),
    )
    kubectl(
        stack,
        "patch",
        "schedulingshard",
        "default",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/plugins"}]',
    )
    accepted_again = wait_for(
        "Accepted=True once the shard is fixed",
        lambda: (
            "True"
            in kubectl(
                stack,
                "get",
                "schedulingshard",
                "default",
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Accepted')].status}",
            )
        ),
    )
    assert accepted_again
