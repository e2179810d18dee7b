"""The real kubectl 1.32 against the simulated API server: what a KAI user types works unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.kubectl_helpers import kubectl, running_kubesim
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

WORK = """
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata:
  name: research
spec:
  priority: 100
  resources:
    gpu: {quota: 8, overQuotaWeight: 1, limit: -1}
---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata:
  name: train
  namespace: default
spec:
  queue: research
  minMember: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  labels:
    kai.scheduler/queue: research
spec:
  schedulerName: kai-scheduler
  containers:
    - name: main
      image: ubuntu
      resources:
        limits:
          nvidia.com/gpu: 1
---
apiVersion: batch/v1
kind: Job
metadata:
  name: batch
spec:
  template:
    spec:
      schedulerName: kai-scheduler
      restartPolicy: Never
      containers:
        - name: main
          image: ubuntu
"""


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(tmp_path, nodes=3) as server:
        yield server


@pytest.fixture
def kubeconfig(sim: KubeSim, tmp_path: Path) -> Path:
    return tmp_path / "kubeconfig"


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "work.yaml"
    path.write_text(WORK)
    return path


async def ok(kubeconfig: Path, *args: str) -> str:
    code, out, err = await kubectl(kubeconfig, *args)
    assert code == 0, f"kubectl {' '.join(args)} failed: {err}"
    return out


def table(text: str) -> list[dict[str, str]]:
    """kubectl's column output as rows keyed by header (headers are single tokens or joined by one space)."""
    header, *lines = text.strip().splitlines()
    starts = [0] + [
        i
        for i in range(1, len(header))
        if header[i] != " " and header[i - 1] == " " and header[i - 2 : i] == "  "
    ]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    return [
        {n: line[s:e].strip() for n, s, e in zip(names, starts, [*starts[1:], None], strict=True)}
        for line in lines
    ]


async def test_get_nodes_lists_the_simulated_nodes_ready(kubeconfig: Path) -> None:
    rows = table(await ok(kubeconfig, "get", "nodes"))
    assert [(r["NAME"], r["STATUS"]) for r in rows] == [
        ("node-0", "Ready"),
        ("node-1", "Ready"),
        ("node-2", "Ready"),
    ]


async def test_apply_creates_a_queue_a_podgroup_a_pod_and_a_job_with_validation_on(
    kubeconfig: Path, manifest: Path
) -> None:
    out = await ok(kubeconfig, "apply", "-f", str(manifest))
    assert out.split("\n")[:4] == [
        "queue.scheduling.run.ai/research created",
        "podgroup.scheduling.run.ai/train created",
        "pod/gpu-pod created",
        "job.batch/batch created",
    ]
    again = await ok(kubeconfig, "apply", "-f", str(manifest))
    assert "pod/gpu-pod unchanged" in again


async def test_get_queues_and_podgroups_show_their_printer_columns(kubeconfig: Path, manifest: Path) -> None:
    await ok(kubeconfig, "apply", "-f", str(manifest))
    (queue,) = table(await ok(kubeconfig, "get", "queues"))
    assert (queue["NAME"], queue["PRIORITY"]) == ("research", "100")
    (group,) = table(await ok(kubeconfig, "get", "pg"))
    assert (group["NAME"], group["QUEUE"], group["MINMEMBER"]) == ("train", "research", "1")


async def test_get_pods_wide_shows_the_node_a_pod_was_bound_to_through_the_api(
    sim: KubeSim, kubeconfig: Path, manifest: Path
) -> None:
    await ok(kubeconfig, "apply", "-f", str(manifest))
    sim.cluster.bind("default", "gpu-pod", {"target": {"kind": "Node", "name": "node-2"}})
    sim.cluster.settle()
    rows = {r["NAME"]: r for r in table(await ok(kubeconfig, "get", "pods", "-o", "wide"))}
    assert (rows["gpu-pod"]["NODE"], rows["gpu-pod"]["STATUS"]) == ("node-2", "Running")
    job_pod = next(name for name in rows if name.startswith("batch-"))
    assert (rows[job_pod]["NODE"], rows[job_pod]["STATUS"]) == ("<none>", "Pending")


async def test_describe_pod_shows_its_node_and_conditions(
    sim: KubeSim, kubeconfig: Path, manifest: Path
) -> None:
    await ok(kubeconfig, "apply", "-f", str(manifest))
    sim.cluster.bind("default", "gpu-pod", {"target": {"kind": "Node", "name": "node-1"}})
    sim.cluster.settle()
    described = await ok(kubeconfig, "describe", "pod", "gpu-pod")
    assert "Node:         node-1/172.16.0.2" in described
    assert "Status:       Running" in described
    assert "nvidia.com/gpu:  1" in described


async def test_delete_f_removes_everything_the_manifest_created(kubeconfig: Path, manifest: Path) -> None:
    await ok(kubeconfig, "apply", "-f", str(manifest))
    out = await ok(kubeconfig, "delete", "-f", str(manifest))
    assert 'pod "gpu-pod" deleted' in out
    listed = json.loads(await ok(kubeconfig, "get", "pods,jobs,podgroups,queues", "-o", "json"))
    assert listed["items"] == []


async def test_create_f_twice_reports_already_exists(kubeconfig: Path, manifest: Path) -> None:
    await ok(kubeconfig, "create", "-f", str(manifest))
    code, _, err = await kubectl(kubeconfig, "create", "-f", str(manifest))
    assert code == 1
    assert 'queues.scheduling.run.ai "research" already exists' in err


async def test_kubectl_scale_and_rollout_status_follow_a_deployment(kubeconfig: Path, tmp_path: Path) -> None:
    deployment = tmp_path / "web.yaml"
    deployment.write_text(
        """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: nginx, image: "nginx:1.27", resources: {requests: {cpu: 100m}}}]
"""
    )
    await ok(kubeconfig, "apply", "-f", str(deployment))
    await ok(kubeconfig, "scale", "deployment/web", "--replicas=3")
    await ok(kubeconfig, "rollout", "status", "deployment/web", "--timeout=30s")
    (row,) = table(await ok(kubeconfig, "get", "deployment", "web"))
    assert row["READY"] == "3/3"


async def test_kubectl_logs_says_the_simulated_cluster_has_none(kubeconfig: Path, manifest: Path) -> None:
    await ok(kubeconfig, "apply", "-f", str(manifest))
    code, _, err = await kubectl(kubeconfig, "logs", "gpu-pod")
    assert code == 1
    assert "logs are not supported by the simulated cluster" in err


async def test_kubectl_create_generators_work_although_they_send_protobuf(kubeconfig: Path) -> None:
    await ok(kubeconfig, "create", "namespace", "team")
    await ok(kubeconfig, "-n", "team", "create", "configmap", "settings", "--from-literal=mode=fast")
    await ok(kubeconfig, "-n", "team", "create", "deployment", "web", "--image=nginx:1.27", "--replicas=2")
    await ok(kubeconfig, "-n", "team", "rollout", "status", "deployment/web", "--timeout=30s")
    settings = json.loads(await ok(kubeconfig, "-n", "team", "get", "configmap", "settings", "-o", "json"))
    assert settings["data"] == {"mode": "fast"}
    pods = json.loads(await ok(kubeconfig, "-n", "team", "get", "pods", "-o", "json"))["items"]
    assert [p["spec"]["containers"][0]["image"] for p in pods] == ["nginx:1.27", "nginx:1.27"]


async def test_kubectl_auth_says_everything_is_allowed(kubeconfig: Path) -> None:
    assert (await ok(kubeconfig, "auth", "can-i", "delete", "nodes")).strip() == "yes"
    assert "kubesim-admin" in await ok(kubeconfig, "auth", "whoami")
