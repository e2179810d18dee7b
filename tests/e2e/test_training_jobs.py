"""A Kubeflow PyTorchJob on `kairos up`, through the real kubectl: the example manifest (examples/kai/
pytorch-job.yaml, written the way KAI's docs write one) applies unchanged, the simulated training operator
creates its three pods, the pod-grouper makes one PodGroup owned by the job with KAI's pytorch grouping
(min member 3, master and worker sub-groups), and the gang is bound whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.kubectl import kubectl, kubesim_stack, listed, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kai" / "pytorch-job.yaml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def test_the_pytorch_job_example_is_grouped_as_kai_groups_it_and_bound_whole(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLE))

    def podgroup() -> dict[str, Any] | None:
        groups = [
            g
            for g in listed(stack, "podgroups", "default")
            if g["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
        ]
        return groups[0] if groups else None

    group = wait_for("the PyTorchJob's PodGroup", podgroup)
    spec = group["spec"]
    assert spec["minMember"] == 3
    assert [(s["name"], s["minMember"]) for s in spec["subGroups"]] == [("master", 1), ("worker", 2)]
    assert group["metadata"]["ownerReferences"][0]["name"] == "pytorch-dist"

    def all_bound() -> list[str] | None:
        pods = listed(stack, "pods", "default")
        nodes = [p["spec"].get("nodeName") for p in pods if p["metadata"]["name"].startswith("pytorch-dist-")]
        return nodes if len(nodes) == 3 and all(nodes) else None

    wait_for("the job's three pods bound", all_bound, lambda: kubectl(stack, "get", "pods", "-o", "wide"))
    pods = json.loads(
        kubectl(stack, "get", "pods", "-l", "training.kubeflow.org/job-name=pytorch-dist", "-o", "json")
    )
    names = {p["metadata"]["annotations"]["pod-group-name"] for p in pods["items"]}
    assert names == {group["metadata"]["name"]}
