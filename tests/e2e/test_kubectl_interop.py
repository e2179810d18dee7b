"""A KAI user switches without rewriting manifests: KAI's quickstart shapes, applied unchanged with the real
kubectl against `kairos up`'s simulated API server, are scheduled, and kubectl shows where and why.

One stack for the module (starting it costs seconds); each test reads what it needs through kubectl.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"
NODES = 4
SETTLE = 60.0
"""Seconds a test waits for the cluster to reach what it expects."""

TOO_BIG = manifests.pod("too-big", gpus="16")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=NODES, gpus_per_node=8) as started:
        yield started


def pods(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = json.loads(kubectl(stack, "get", "pods", "-o", "json"))
    return {item["metadata"]["name"]: item for item in listed["items"]}


def wait_for(stack: Stack, what: str, check: Any) -> Any:
    """Poll the cluster through kubectl until `check()` returns something truthy (what the test reads)."""
    return kubectl_wait_for(what, check, lambda: json.dumps(pods(stack), indent=1), settle=SETTLE)


@pytest.fixture(scope="module")
def applied(stack: Stack) -> dict[str, dict[str, Any]]:
    """KAI's quickstart shapes applied unchanged, then the cluster once every one of their pods runs."""
    for name in ("queues.yaml", "gpu-pod.yaml", "gpu-fraction-pod.yaml", "batch-job.yaml", "gang.yaml"):
        kubectl(stack, "apply", "-f", str(EXAMPLES / name))

    def all_running() -> dict[str, dict[str, Any]] | None:
        now = pods(stack)
        ours = {n: p for n, p in now.items() if not n.startswith("too-big")}
        expected = 1 + 1 + 2 + 3
        running = [p for p in ours.values() if p["status"].get("phase") == "Running"]
        return now if len(running) >= expected else None

    return wait_for(stack, "every quickstart pod Running", all_running)  # type: ignore[no-any-return]


def test_kubectl_sees_the_simulated_nodes(stack: Stack) -> None:
    nodes = json.loads(kubectl(stack, "get", "nodes", "-o", "json"))["items"]
    assert len(nodes) == NODES
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in nodes)


def test_default_queues_exist_as_kai_creates_them(stack: Stack) -> None:
    names = kubectl(stack, "get", "queues", "-o", "name").split()
    assert "queue.scheduling.run.ai/default-parent-queue" in names
    assert "queue.scheduling.run.ai/default-queue" in names


def test_kai_s_default_shard_is_in_force_and_editing_it_reconfigures_the_scheduler(stack: Stack) -> None:
    names = kubectl(stack, "get", "schedulingshards", "-o", "name").split()
    assert names == ["schedulingshard.kai.scheduler/default"]

    def shown(pattern: str) -> str | None:
        status = kairos(stack, "status")
        return status if re.search(pattern, status) else None

    wait_for(stack, "the default shard in kairos status", lambda: shown(r"SchedulingShard default"))
    kubectl(stack, "patch", "schedulingshard", "default", "--type=merge", "-p", '{"spec":{"kValue":2}}')
    status = wait_for(stack, "kValue 2 in kairos status", lambda: shown(r"kValue\W+2\b"))
    assert re.search(r"placement \(gpu / cpu\)\W+binpack / binpack", status), status
    kubectl(stack, "patch", "schedulingshard", "default", "--type=merge", "-p", '{"spec":{"kValue":1}}')


def test_quickstart_pods_are_bound_and_shown_with_their_nodes(stack: Stack, applied: dict[str, Any]) -> None:
    node_names = set(kubectl(stack, "get", "nodes", "-o", "name").replace("node/", "").split())
    wide = kubectl(stack, "get", "pods", "-o", "wide")
    header, *rows = wide.strip().splitlines()
    assert "NODE" in header.split()
    column = header.split().index("NODE")
    shown = {row.split()[0]: row.split()[column] for row in rows}
    for name in ("gpu-pod", "gpu-fraction-pod", "gang-0", "gang-1", "gang-2"):
        assert shown[name] in node_names, wide
    job_pods = [n for n in shown if n.startswith("batch-job-")]
    assert len(job_pods) == 2
    assert all(shown[n] in node_names for n in job_pods)


def test_a_gang_is_bound_whole(stack: Stack, applied: dict[str, Any]) -> None:
    gang = [applied[f"gang-{i}"] for i in range(3)]
    assert all(p["spec"].get("nodeName") for p in gang)
    group = json.loads(kubectl(stack, "get", "podgroups.scheduling.run.ai", "gang", "-o", "json"))
    assert group["spec"]["minMember"] == 3


def test_the_pod_grouper_gives_the_batch_job_one_podgroup(stack: Stack, applied: dict[str, Any]) -> None:
    job_pods = [p for n, p in applied.items() if n.startswith("batch-job-")]
    groups = {p["metadata"]["annotations"]["pod-group-name"] for p in job_pods}
    assert len(groups) == 1
    group = json.loads(kubectl(stack, "get", "podgroups.scheduling.run.ai", groups.pop(), "-o", "json"))
    assert group["spec"]["queue"] == "default-queue"
    assert group["metadata"]["ownerReferences"][0]["kind"] == "Job"


def test_a_fractional_pod_carries_its_device(stack: Stack, applied: dict[str, Any]) -> None:
    annotations = applied["gpu-fraction-pod"]["metadata"]["annotations"]
    assert annotations["kairos.io/gpu-groups"]


def test_scheduled_events_name_the_node(stack: Stack, applied: dict[str, Any]) -> None:
    node = applied["gpu-pod"]["spec"]["nodeName"]

    def scheduled() -> list[dict[str, Any]]:
        events = json.loads(
            kubectl(stack, "get", "events", "--field-selector", "involvedObject.name=gpu-pod", "-o", "json")
        )["items"]
        return [e for e in events if e["reason"] == "Scheduled"]

    events = wait_for(stack, "a Scheduled event on gpu-pod", scheduled)
    assert node in events[0]["message"]


def test_a_pod_that_cannot_fit_says_why(stack: Stack, applied: dict[str, Any]) -> None:
    apply(stack, TOO_BIG)

    def failed() -> list[dict[str, Any]]:
        events = json.loads(
            kubectl(stack, "get", "events", "--field-selector", "involvedObject.name=too-big", "-o", "json")
        )["items"]
        return [e for e in events if e["reason"] == "FailedScheduling"]

    events = wait_for(stack, "a FailedScheduling event on too-big", failed)
    assert f"0/{NODES} nodes are available" in events[0]["message"]
    assert "nvidia.com/gpu" in events[0]["message"] or "GPU" in events[0]["message"]
    assert pods(stack)["too-big"]["spec"].get("nodeName") is None
    described = kubectl(stack, "describe", "pod", "too-big")
    assert "FailedScheduling" in described


def test_kairos_explain_says_where_a_pod_runs_and_why_one_waits(
    stack: Stack, applied: dict[str, Any]
) -> None:
    apply(stack, TOO_BIG)
    node = applied["gpu-pod"]["spec"]["nodeName"]
    assert f"Running on {node}" in kairos(stack, "explain", "gpu-pod")

    def explained() -> str | None:
        text = kairos(stack, "explain", "too-big")
        return text if "nodes are available" in text else None

    text = wait_for(stack, "an explanation for too-big", explained)
    assert f"0/{NODES} nodes are available" in text
    assert "Pending" in text.splitlines()[0]
    assert "3 of 3 pods placed" in kairos(stack, "explain", "podgroup/gang")


def test_a_cluster_file_submitted_to_a_kubernetes_stack_is_refused_with_what_to_do(stack: Stack) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli.main",
            "submit",
            "examples/work.yaml",
            "--state-dir",
            str(stack.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=EXAMPLES.parents[1],
    )
    assert done.returncode == 2
    assert "apply Kubernetes manifests with kubectl" in done.stderr
