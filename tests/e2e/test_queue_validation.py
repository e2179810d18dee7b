"""KAI's queue validating webhook on `kairos up`, through the real kubectl: kubesim sends every Queue created
or updated to the state service's endpoint. A Queue without spec.resources is refused either way; with the
state option queue_quota_validation on, a child of a queue that does not exist is refused naming
spec.parentQueue, and a child whose quota goes over its parent's is admitted with KAI's warning, which
kubectl prints; with it off, both are admitted silently (KAI's enableQuotaValidation, off by default)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.kubectl import kubesim_stack
from tests.e2e.manifests import documents
from tools.stack.supervisor import Stack

pytestmark = pytest.mark.e2e


def queue(name: str, parent: str | None, gpu_quota: float | None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if parent:
        spec["parentQueue"] = parent
    if gpu_quota is not None:
        spec["resources"] = {"gpu": {"quota": gpu_quota, "limit": -1, "overQuotaWeight": 1}}
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def kubectl_apply(stack: Stack, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -f -` as a user runs it: its exit code, stdout and stderr (warnings and refusals)."""
    assert stack.kubeconfig is not None
    return subprocess.run(
        ["kubectl", "apply", "-f", "-"],
        input=documents(obj),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": str(stack.kubeconfig)},
    )


@pytest.fixture(scope="module", params=[True, False], ids=["check on", "check off"])
def checked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, bool]]:
    on = bool(request.param)
    options = {"state": {"queue_quota_validation": "true"}} if on else {}
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=1, gpus_per_node=8, options=options) as stack:
        parent = kubectl_apply(stack, queue("research", None, 2))
        assert parent.returncode == 0, parent.stderr
        yield stack, on


def test_a_queue_without_resources_is_refused_naming_the_field(checked: tuple[Stack, bool]) -> None:
    stack, _ = checked
    done = kubectl_apply(stack, queue("bare", "research", None))
    assert done.returncode != 0
    assert "denied the request" in done.stderr
    assert "Queue 'bare': spec.resources: resources must be specified" in done.stderr


def test_a_child_of_a_queue_that_does_not_exist_is_refused_only_with_the_check(
    checked: tuple[Stack, bool],
) -> None:
    stack, on = checked
    done = kubectl_apply(stack, queue("orphan", "nowhere", 1))
    if on:
        assert done.returncode != 0
        assert "Queue 'orphan': spec.parentQueue: failed to get parent queue nowhere" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert "orphan" in done.stdout


def test_a_child_over_its_parents_quota_is_admitted_with_kais_warning_only_with_the_check(
    checked: tuple[Stack, bool],
) -> None:
    stack, on = checked
    done = kubectl_apply(stack, queue("big-child", "research", 4))
    assert done.returncode == 0, done.stderr
    warning = "child queue GPU quota (4.00) exceeds parent queue research GPU quota (2.00)"
    if on:
        assert "Warning:" in done.stderr
        assert f"Queue 'big-child': spec.resources.gpu.quota: {warning}" in done.stderr
    else:
        assert warning not in done.stderr
