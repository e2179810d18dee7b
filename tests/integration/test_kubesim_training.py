"""The real kubectl 1.32 against the simulated API server with Kubeflow training jobs: a PyTorchJob written as
KAI's docs write one (examples/kai/pytorch-job.yaml) applies, and the simulated training operator creates its
pods."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.kubectl_helpers import kubectl, running_kubesim
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kai" / "pytorch-job.yaml"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(tmp_path, nodes=2) as server:
        yield server


@pytest.fixture
def kubeconfig(sim: KubeSim, tmp_path: Path) -> Path:
    return tmp_path / "kubeconfig"


async def ok(kubeconfig: Path, *args: str) -> str:
    code, out, err = await kubectl(kubeconfig, *args)
    assert code == 0, f"kubectl {' '.join(args)} failed: {err}"
    return out


async def test_discovery_lists_the_kubeflow_training_kinds(kubeconfig: Path) -> None:
    out = await ok(kubeconfig, "api-resources", "--api-group=kubeflow.org", "-o", "name")
    assert set(out.split()) == {
        "pytorchjobs.kubeflow.org",
        "tfjobs.kubeflow.org",
        "xgboostjobs.kubeflow.org",
        "jaxjobs.kubeflow.org",
        "mpijobs.kubeflow.org",
    }
    versions = await ok(kubeconfig, "api-versions")
    assert {"kubeflow.org/v1", "kubeflow.org/v2beta1"} <= set(versions.split())


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
