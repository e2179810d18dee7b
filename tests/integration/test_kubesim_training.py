"""The real kubectl 1.32 against the simulated API server with Kubeflow's kinds: every Kubeflow example
(examples/kai/: a PyTorchJob, KAI's elastic PyTorchJob, a TFJob, an XGBoostJob, a JAXJob, an MPIJob and a
Notebook) applies unchanged and the simulated operators create their pods; and, with the state service's
Kubernetes owner running its pod-grouper against the same server, an MPIJob whose launcher waits for its
workers is one gang of its workers until the MPI operator creates the launcher, whose pod then joins the
same PodGroup and is counted in it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.kubeapi.client import Kube, connect
from tests.integration.kubectl_helpers import kubectl, running_kubesim
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"
EXAMPLE = EXAMPLES / "pytorch-job.yaml"
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(tmp_path, nodes=2) as server:
        yield server


@pytest.fixture
def kubeconfig(sim: KubeSim, tmp_path: Path) -> Path:
    return tmp_path / "kubeconfig"


async def ok(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    code, out, err = await kubectl(kubeconfig, *args, stdin=stdin)
    assert code == 0, f"kubectl {' '.join(args)} failed: {err}"
    return out


async def eventually(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll `check` until it returns something truthy; fails naming `what` after `WAIT` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            pytest.fail(f"not within {WAIT:.0f} s: {what}")
        await asyncio.sleep(0.1)


async def test_discovery_lists_the_kubeflow_kinds(kubeconfig: Path) -> None:
    out = await ok(kubeconfig, "api-resources", "--api-group=kubeflow.org", "-o", "name")
    assert set(out.split()) == {
        "pytorchjobs.kubeflow.org",
        "tfjobs.kubeflow.org",
        "xgboostjobs.kubeflow.org",
        "jaxjobs.kubeflow.org",
        "mpijobs.kubeflow.org",
        "notebooks.kubeflow.org",
    }
    versions = await ok(kubeconfig, "api-versions")
    assert {"kubeflow.org/v1", "kubeflow.org/v1beta1", "kubeflow.org/v2beta1"} <= set(versions.split())


async def test_applying_a_pytorchjob_like_kais_docs_creates_its_pods(kubeconfig: Path) -> None:
    out = await ok(kubeconfig, "apply", "-f", str(EXAMPLE))
    assert out.strip() == "pytorchjob.kubeflow.org/pytorch-dist created"
    pods = json.loads(
        await ok(kubeconfig, "get", "pods", "-l", "training.kubeflow.org/job-name=pytorch-dist", "-o", "json")
    )["items"]
    by_name = {p["metadata"]["name"]: p for p in pods}
    assert set(by_name) == {"pytorch-dist-master-0", "pytorch-dist-worker-0", "pytorch-dist-worker-1"}
    master = by_name["pytorch-dist-master-0"]
    assert master["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert master["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "master"
    assert master["spec"]["schedulerName"] == "kai-scheduler"
    assert master["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    job = json.loads(await ok(kubeconfig, "get", "pytorchjob", "pytorch-dist", "-o", "json"))
    assert [c["type"] for c in job["status"]["conditions"]] == ["Created"]
    again = await ok(kubeconfig, "apply", "-f", str(EXAMPLE))
    assert again.strip() == "pytorchjob.kubeflow.org/pytorch-dist unchanged"
    await ok(kubeconfig, "delete", "-f", str(EXAMPLE), "--wait=true")
    left = await ok(
        kubeconfig, "get", "pods", "-l", "training.kubeflow.org/job-name=pytorch-dist", "-o", "name"
    )
    assert left.strip() == ""


@pytest.mark.parametrize(
    ("example", "created", "pods"),
    [
        (
            "pytorch-elastic.yaml",
            "pytorchjob.kubeflow.org/elastic-example-imagenet",
            {"elastic-example-imagenet-worker-0", "elastic-example-imagenet-worker-1"},
        ),
        (
            "tf-job.yaml",
            "tfjob.kubeflow.org/tf-dist-mnist",
            {"tf-dist-mnist-chief-0", "tf-dist-mnist-worker-0", "tf-dist-mnist-worker-1"},
        ),
        (
            "xgboost-job.yaml",
            "xgboostjob.kubeflow.org/xgboost-dist-iris",
            {"xgboost-dist-iris-master-0", "xgboost-dist-iris-worker-0", "xgboost-dist-iris-worker-1"},
        ),
        (
            "jax-job.yaml",
            "jaxjob.kubeflow.org/jax-dist-mnist",
            {f"jax-dist-mnist-worker-{i}" for i in range(4)},
        ),
        (
            "mpi-job.yaml",
            "mpijob.kubeflow.org/mpi-hello-world",
            {"mpi-hello-world-worker-0", "mpi-hello-world-worker-1", "mpi-hello-world-launcher-*"},
        ),
        ("notebook.yaml", "notebook.kubeflow.org/lab", {"lab-0"}),
    ],
)
async def test_every_kubeflow_example_applies_unchanged_and_its_operator_creates_its_pods(
    kubeconfig: Path, example: str, created: str, pods: set[str]
) -> None:
    out = await ok(kubeconfig, "apply", "-f", str(EXAMPLES / example))
    assert out.strip() == f"{created} created"
    names = (await ok(kubeconfig, "get", "pods", "-o", "name")).split()
    found = {n.removeprefix("pod/") for n in names}
    shown = {
        n if not n.startswith("mpi-hello-world-launcher-") else "mpi-hello-world-launcher-*" for n in found
    }
    assert shown == pods
    for name in found:
        pod = json.loads(await ok(kubeconfig, "get", "pod", name, "-o", "json"))
        assert pod["spec"]["schedulerName"] == "kai-scheduler"


# --- the pod-grouper against the simulated cluster -----------------------------------------------------------
WAITING_MPIJOB = """\
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata:
  name: pi
  labels:
    kai.scheduler/queue: default-queue
spec:
  slotsPerWorker: 1
  launcherCreationPolicy: WaitForWorkersReady
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          schedulerName: kai-scheduler
          containers:
            - name: launcher
              image: mpioperator/mpi-pi:openmpi
    Worker:
      replicas: 2
      template:
        spec:
          schedulerName: kai-scheduler
          containers:
            - name: worker
              image: mpioperator/mpi-pi:openmpi
"""


@pytest.fixture
async def grouper(bus: Bus, sim: KubeSim, kubeconfig: Path) -> AsyncIterator[Kube]:
    """The state service's Kubernetes owner (whose pod-grouper groups the pods) on the simulated cluster;
    yields a client of that cluster."""
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    kube = await connect(str(kubeconfig))
    owner = KubeOwner(ctx, replica, str(kubeconfig), KubeSourceOptions(debounce=0.01, problem_settle=0.5))
    await owner.start()
    try:
        yield kube
    finally:
        await owner.stop()
        await kube.close()
        await replica.stop()


async def podgroups(kube: Kube) -> list[dict[str, Any]]:
    raw = await kube.call(
        "list podgroups",
        kube.custom.list_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
    )
    return json.loads(raw)["items"]  # type: ignore[no-any-return]


async def pods_of(kube: Kube, selector: str) -> list[dict[str, Any]]:
    raw = await kube.call("list pods", kube.core.list_namespaced_pod, "default", label_selector=selector)
    return json.loads(raw)["items"]  # type: ignore[no-any-return]


async def bind(kube: Kube, pod: str, node: str) -> None:
    """Bind `pod` to `node` as Kairos's binder would (no scheduler runs in this test)."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await kube.call("bind", kube.core.create_namespaced_pod_binding, pod, "default", body)


async def test_a_waiting_mpijobs_podgroup_counts_the_launcher_once_its_pod_exists(
    grouper: Kube, kubeconfig: Path
) -> None:
    kube = grouper
    await ok(kubeconfig, "apply", "-f", "-", stdin=WAITING_MPIJOB)

    async def workers_gang() -> dict[str, Any] | None:
        groups = await podgroups(kube)
        workers = await pods_of(kube, "training.kubeflow.org/job-role=worker")
        grouped = all((p["metadata"].get("annotations") or {}).get("pod-group-name") for p in workers)
        return groups[0] if len(groups) == 1 and len(workers) == 2 and grouped else None

    group = await eventually("the workers grouped into the MPIJob's PodGroup", workers_gang)
    name = group["metadata"]["name"]
    assert group["spec"]["minMember"] == 2
    assert group["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
    assert await pods_of(kube, "training.kubeflow.org/job-role=launcher") == []

    for i, pod in enumerate(("pi-worker-0", "pi-worker-1")):
        await bind(kube, pod, f"node-{i}")

    async def launcher_grouped() -> dict[str, Any] | None:
        launchers = await pods_of(kube, "training.kubeflow.org/job-role=launcher")
        if len(launchers) != 1:
            return None
        return (
            launchers[0]
            if (launchers[0]["metadata"].get("annotations") or {}).get("pod-group-name")
            else None
        )

    launcher = await eventually(
        "the launcher created once the workers are ready, and grouped", launcher_grouped
    )
    assert launcher["metadata"]["annotations"]["pod-group-name"] == name

    async def counted() -> bool:
        groups = await podgroups(kube)
        return len(groups) == 1 and groups[0]["spec"]["minMember"] == 3

    await eventually("the launcher counted in the gang", counted)
