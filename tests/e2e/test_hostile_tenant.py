"""A hostile tenant on `kairos up`, through the real kubectl: pods, a Job, PodGroups and Queues carrying
values no scheduler should trust (5,000-digit numbers, "²", NaN, numbers beyond int32 and int64, wrong
types) are applied first; then another tenant's ordinary pods must be bound within seconds, with no
process of the stack exited, and each hostile pod must say why it waits, naming the field (InvalidPod,
or InvalidPodGroup when the value went to its PodGroup, as a staleness grace period does).

The values that stopped every scheduling before (issue 27): a `gpu-memory` of 5,000 digits on a pod and a
`kai.scheduler/batch-min-member` of 5,000 digits on a Job.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from shared.kube import keys
from tests.e2e import manifests
from tests.e2e.kubectl import kubectl, kubesim_stack
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tests.hostile import LONG_DIGITS
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTLE = 60.0
"""Seconds the test waits for what it expects (generous: a loaded machine is slow); the time it took is
printed."""

HOSTILE_PODS: dict[str, dict[str, str]] = {
    "long-memory": {keys.GPU_MEMORY: LONG_DIGITS},
    "nan-fraction": {keys.GPU_FRACTION: "nan"},
    "superscript-fraction": {keys.GPU_FRACTION: "²"},
    "many-devices": {keys.GPU_FRACTION: "0.5", keys.GPU_FRACTION_NUM_DEVICES: "2000000000"},
    "long-staleness": {keys.STALENESS_GRACE_PERIOD_ANNOTATION: LONG_DIGITS + "s"},
}
"""Pod name -> the annotations that make it hostile."""


def hostile_objects() -> list[dict[str, Any]]:
    pods = [manifests.pod(name, annotations=annotations) for name, annotations in HOSTILE_PODS.items()]
    job = manifests.job("long-min-member", annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: LONG_DIGITS})
    podgroups = [
        {
            "apiVersion": keys.PODGROUP_API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"queue": manifests.DEFAULT_QUEUE, **spec},
        }
        for name, spec, annotations in (
            ("huge-min-member", {"minMember": 2**63 - 1}, {}),
            ("odd-sub-groups", {"minMember": 1, "subGroups": [{"name": "²", "minMember": -5}]}, {}),
            ("long-last-start", {"minMember": 1}, {keys.LAST_START_ANNOTATION: LONG_DIGITS}),
        )
    ]
    queues = [
        {
            "apiVersion": keys.QUEUE_API_VERSION,
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": {"parentQueue": "default-parent-queue", "resources": {"gpu": gpu}},
        }
        for name, gpu in (
            ("huge-quota", {"quota": 1e308, "limit": -1, "overQuotaWeight": 1}),
            ("text-weight", {"quota": 1, "limit": -1, "overQuotaWeight": "²"}),
        )
    ]
    return [*pods, job, *podgroups, *queues]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def apply_unvalidated(stack: Stack, objects: list[dict[str, Any]]) -> None:
    """`kubectl apply` as a user would, without client-side validation: the API server is what stands
    between a tenant and the scheduler, and it does not validate annotations' contents."""
    for obj in objects:
        kubectl(stack, "apply", "--validate=false", "-f", "-", stdin=manifests.documents(obj))


def test_ordinary_pods_are_bound_within_seconds_after_a_hostile_tenant_and_nothing_exits(
    stack: Stack,
) -> None:
    apply_unvalidated(stack, hostile_objects())
    started = time.monotonic()
    ordinary = [manifests.pod(f"ordinary-{i}", gpus="1") for i in range(3)]
    apply_unvalidated(stack, ordinary)

    def all_bound() -> bool:
        nodes = [
            kubectl(stack, "get", "pod", pod["metadata"]["name"], "-o", "jsonpath={.spec.nodeName}")
            for pod in ordinary
        ]
        return all(nodes)

    kubectl_wait_for(
        "the ordinary pods bound",
        all_bound,
        lambda: kubectl(stack, "get", "pods", "-o", "wide"),
        settle=SETTLE,
    )
    print(f"ordinary pods bound {time.monotonic() - started:.1f} s after the hostile objects")

    for name, hostile in HOSTILE_PODS.items():
        field = next(iter(hostile)) if len(hostile) == 1 else keys.GPU_FRACTION_NUM_DEVICES
        described = kubectl_wait_for(
            f"pod {name} held back naming {field}",
            lambda name=name, field=field: (
                (text := kubectl(stack, "describe", "pod", name))
                and "InvalidPod" in text
                and field in text
                and text
            ),
            settle=SETTLE,
        )
        assert "5,000 characters" in described or LONG_DIGITS not in described
        assert kubectl(stack, "get", "pod", name, "-o", "jsonpath={.spec.nodeName}") == ""

    def job_pod_says_why() -> str | None:
        text = kubectl(stack, "describe", "pods", "-l", "job-name=long-min-member")
        return text if "InvalidPod" in text and keys.BATCH_MIN_MEMBER_ANNOTATION in text else None

    described = kubectl_wait_for("the Job's pod naming batch-min-member", job_pod_says_why, settle=SETTLE)
    assert "Job" in described

    exited = {
        name: process.returncode for name, process in stack.processes.items() if process.poll() is not None
    }
    assert exited == {}, f"processes exited: {exited}"
