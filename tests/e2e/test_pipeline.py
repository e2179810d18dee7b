"""Stages with dependencies, end to end: examples/pipeline.yaml applied at once with the real kubectl
against `kairos up` runs preprocess, then the 4-pod training gang, then inference on half GPUs, each
stage only after the one it names succeeded; meanwhile the waiting pods carry the scheduling gate, the
PodGroup has an Event and `kairos explain` says what it waits for. A failed stage blocks what follows it,
and a cycle is refused, each with an Event naming it.

One stack for the module; each test works in its own namespace.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack, listed
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.yaml"
GATE = "kairos.io/after"
SETTLE = 120.0
"""Seconds a test waits for the cluster to reach what it expects (the pipeline itself takes ~20 s)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=4) as started:
        yield started


def owned_by(pod: dict[str, Any], name: str) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get("job-name") == name or pod["metadata"]["name"].startswith(f"{name}-")


def job_condition(stack: Stack, namespace: str, name: str) -> str:
    """ "Complete", "Failed" or "" for a Job."""
    for job in listed(stack, "jobs", namespace):
        if job["metadata"]["name"] == name:
            for condition in (job.get("status") or {}).get("conditions") or ():
                if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
                    return str(condition["type"])
    return ""


def events(stack: Stack, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in listed(stack, "events", namespace) if e.get("reason") == reason]


def wait_for(what: str, check: Callable[[], Any], dump: Callable[[], str]) -> Any:
    return kubectl_wait_for(what, check, dump, settle=SETTLE)


def namespace(stack: Stack, name: str) -> str:
    kubectl(stack, "create", "namespace", name)
    return name


def test_the_pipeline_runs_stage_after_stage(stack: Stack) -> None:
    ns = namespace(stack, "pipeline")
    kubectl(stack, "apply", "-n", ns, "-f", str(PIPELINE))

    def dump() -> str:
        return kubectl(stack, "get", "pods,jobs,podgroups", "-n", ns, "-o", "wide")

    # The training pods exist at once (the Job controller makes them) but carry the gate and wait.
    def gated_trainers() -> list[dict[str, Any]] | None:
        trainers = [p for p in listed(stack, "pods", ns) if owned_by(p, "train")]
        if len(trainers) < 4 or not all(
            any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or ()) for p in trainers
        ):
            return None
        return trainers

    trainers = wait_for("four gated training pods", gated_trainers, dump)
    if job_condition(stack, ns, "preprocess") != "Complete":
        assert not any(p["spec"].get("nodeName") for p in trainers)
        assert "SchedulingGated" in kubectl(stack, "get", "pods", "-n", ns)

        def waiting_explained() -> str | None:
            text = kairos(stack, "explain", "-n", ns, trainers[0]["metadata"]["name"])
            if f"waiting for {ns}/preprocess" in text:
                return text
            # On a loaded machine preprocess can finish between two answers (each a few seconds): the
            # trainers are then released, and no later answer can name what they waited for.
            return (
                "preprocess finished first" if job_condition(stack, ns, "preprocess") == "Complete" else None
            )

        wait_for("kairos explain naming preprocess", waiting_explained, dump)
    waiting = wait_for(
        "a WaitingForDependencies Event", lambda: events(stack, ns, "WaitingForDependencies"), dump
    )
    assert any("preprocess" in e["message"] for e in waiting)

    # The same words on the Job the user created, where `kubectl describe job train` shows them.
    def on_the_job() -> list[dict[str, Any]]:
        return [
            e
            for e in events(stack, ns, "WaitingForDependencies")
            if e["involvedObject"]["kind"] == "Job" and e["involvedObject"]["name"] == "train"
        ]

    told = wait_for("a WaitingForDependencies Event on Job train", on_the_job, dump)
    assert any(f"waiting for {ns}/preprocess" in e["message"] for e in told)

    # Each stage starts only once the one before it has succeeded: whenever a training pod is seen on a
    # node, preprocess has completed; whenever an inference pod is, training has.
    def watch() -> bool:
        pods = listed(stack, "pods", ns)
        placed_trainers = [p for p in pods if owned_by(p, "train") and p["spec"].get("nodeName")]
        placed_servers = [p for p in pods if owned_by(p, "inference") and p["spec"].get("nodeName")]
        if placed_trainers:
            assert job_condition(stack, ns, "preprocess") == "Complete", dump()
        if placed_servers:
            assert job_condition(stack, ns, "train") == "Complete", dump()
        running = [p for p in placed_servers if (p.get("status") or {}).get("phase") == "Running"]
        return len(running) == 2

    wait_for("both inference replicas running", watch, dump)

    pods = listed(stack, "pods", ns)
    trainers = [p for p in pods if owned_by(p, "train")]
    assert len(trainers) == 4
    assert all((p.get("status") or {}).get("phase") == "Succeeded" for p in trainers)
    assert not any(p["spec"].get("schedulingGates") for p in pods)
    servers = [p for p in pods if owned_by(p, "inference")]
    # Half a GPU each: Kairos chose the device and said which.
    assert all(p["metadata"]["annotations"].get("gpu-fraction") == "0.5" for p in servers)
    assert all(p["metadata"]["annotations"].get("kairos.io/gpu-groups") for p in servers)
    assert f"Running on {servers[0]['spec']['nodeName']}" in kairos(
        stack, "explain", "-n", ns, servers[0]["metadata"]["name"]
    )


BLOCKED = (
    manifests.job("extract", command=["false"], backoff_limit=0),
    manifests.job("load", annotations={GATE: "extract"}),
)


def test_a_failed_stage_blocks_the_next_one(stack: Stack) -> None:
    ns = namespace(stack, "blocked")
    apply(stack, *BLOCKED, namespace=ns)

    def dump() -> str:
        return kubectl(stack, "get", "pods,jobs,podgroups,events", "-n", ns, "-o", "wide")

    def running_extractor() -> str | None:
        for p in listed(stack, "pods", ns):
            if owned_by(p, "extract") and (p.get("status") or {}).get("phase") == "Running":
                return str(p["metadata"]["name"])
        return None

    extractor = wait_for("the extract pod running", running_extractor, dump)
    # The container exits non-zero: what the kubelet reports, played here through the status subresource.
    kubectl(
        stack,
        "patch",
        "pod",
        extractor,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed"}}),
    )
    wait_for("the extract Job failed", lambda: job_condition(stack, ns, "extract") == "Failed", dump)
    blocked = wait_for("a DependencyFailed Event", lambda: events(stack, ns, "DependencyFailed"), dump)
    assert any(f"{ns}/extract failed" in e["message"] for e in blocked)
    loaders = [p for p in listed(stack, "pods", ns) if owned_by(p, "load")]
    assert loaders
    assert not any(p["spec"].get("nodeName") for p in loaders)
    assert f"{ns}/extract failed" in kairos(stack, "explain", "-n", ns, loaders[0]["metadata"]["name"])


def after(name: str, stage: str) -> manifests.Manifest:
    """A one-CPU pod that waits for `stage`."""
    return manifests.pod(name, annotations={GATE: stage}, image="busybox", cpu="1")


def test_a_cycle_is_refused_with_an_event_naming_it(stack: Stack) -> None:
    ns = namespace(stack, "cycle")
    apply(stack, after("ping", "pong"), after("pong", "ping"), namespace=ns)

    def dump() -> str:
        return kubectl(stack, "get", "pods,podgroups,events", "-n", ns, "-o", "wide")

    refused = wait_for("a DependencyCycle Event", lambda: events(stack, ns, "DependencyCycle"), dump)
    assert any(f"{ns}/ping -> {ns}/pong -> {ns}/ping" in e["message"] for e in refused)
    assert any(e.get("type") == "Warning" for e in refused)
    pods = listed(stack, "pods", ns)
    assert len(pods) == 2
    assert not any(p["spec"].get("nodeName") for p in pods)
    assert "dependency cycle" in kairos(stack, "explain", "-n", ns, "ping")
