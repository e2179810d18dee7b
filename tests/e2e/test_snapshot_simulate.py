"""An operator captures what the scheduler sees and replays it offline: after a kubectl walk-through on
`kairos up` (two pods that run, a gang that does not fit), `kairos snapshot` writes the file, `kairos
simulate` with no change reproduces what the stack decided (the same pods running, the gang pending), and
with the node the gang lacks the gang starts."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack, wait_for
from tools.cli.main import main
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GANG = "big"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def _pods(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = json.loads(kubectl(stack, "get", "pods", "-o", "json"))
    return {item["metadata"]["name"]: item for item in listed["items"]}


@pytest.fixture(scope="module")
def walked(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Any]], Path]:
    """Two 4-GPU pods running (on one node, bin-packed), a gang of two 8-GPU pods that cannot start on the 8
    GPUs left; then the snapshot of that cluster."""
    gang_group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": GANG},
        "spec": {"minMember": 2, "queue": manifests.DEFAULT_QUEUE},
    }
    apply(stack, manifests.pod("small-0", gpus="4"), manifests.pod("small-1", gpus="4"))
    wait_for(
        "the small pods Running",
        lambda: (
            all(
                _pods(stack).get(n, {}).get("status", {}).get("phase") == "Running"
                for n in ("small-0", "small-1")
            )
            or None
        ),
    )
    apply(
        stack,
        gang_group,
        *(manifests.pod(f"{GANG}-{i}", gpus="8", annotations={"pod-group-name": GANG}) for i in range(2)),
    )

    def gang_held() -> dict[str, dict[str, Any]] | None:
        pods = _pods(stack)
        gang = [pods.get(f"{GANG}-{i}", {}) for i in range(2)]
        unschedulable = all(
            any(c.get("reason") == "Unschedulable" for c in p.get("status", {}).get("conditions", []))
            for p in gang
        )
        return pods if unschedulable and not any(p.get("spec", {}).get("nodeName") for p in gang) else None

    pods = wait_for("the gang held as unschedulable", gang_held)
    path = tmp_path_factory.mktemp("snapshots") / "walked.kairos.gz"
    out = kairos(stack, "snapshot", "-o", str(path))
    assert f"wrote {path}" in out
    return pods, path


def _simulate(path: Path, *flags: str) -> dict[str, Any]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["simulate", str(path), "--json", *flags]) == 0
    return json.loads(buffer.getvalue())  # type: ignore[no-any-return]


def test_a_plain_replay_reproduces_what_the_stack_decided(
    walked: tuple[dict[str, dict[str, Any]], Path],
) -> None:
    pods, path = walked
    answer = _simulate(path)
    assert (answer["binds"], answer["evictions"]) == (0, 0)
    by_group = {g["podgroup"]: g for g in answer["podgroups"]}
    gang = by_group[f"default/{GANG}"]
    assert gang["captured"]["phase"] == gang["simulated"]["phase"] == "Pending"
    assert gang["change"] == "stays pending"
    assert gang["why"]
    stack_nodes = sorted({pods[n]["spec"]["nodeName"] for n in ("small-0", "small-1")})
    running = [g for g in answer["podgroups"] if g["simulated"]["phase"] == "Running"]
    assert len(running) == 2
    assert sorted({node for g in running for node in g["simulated"]["nodes"]}) == stack_nodes
    assert all(g["change"] == "keeps running" for g in running)


def test_adding_the_node_the_gang_lacks_starts_it(
    walked: tuple[dict[str, dict[str, Any]], Path], stack: Stack
) -> None:
    _, path = walked
    node = json.loads(kubectl(stack, "get", "nodes", "-o", "json"))["items"][0]["metadata"]["name"]
    answer = _simulate(path, "--add-nodes", f"1:like={node}")
    assert answer["starting"] == [f"default/{GANG}"]
    assert answer["binds"] == 2
    assert answer["nodes"] == {"captured": 2, "simulated": 3}
