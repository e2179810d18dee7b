"""An operator captures what the scheduler sees and replays it offline: after a kubectl walk-through on
`kairos up` (two pods that run, a gang that does not fit), `kairos snapshot` writes the file, `kairos
simulate` with no change reproduces what the stack decided (the same pods running, the gang pending), and
with the node the gang lacks the gang starts. The file carries the DRA objects kubesim's driver publishes,
and the state service serves the same snapshot at `GET /get-snapshot` on its health port, beside
/metrics, which `kairos snapshot --url` downloads."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.snapshot_file import read_snapshot
from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack, wait_for
from tools.cli.main import main
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GANG = "big"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Every service gets a health port the OS picks; the state service's is read from its log.
    with kubesim_stack(
        tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8, env={"KAIROS_HEALTH_PORT": "0"}
    ) as started:
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


def test_the_snapshot_carries_the_dra_objects_the_driver_publishes(
    walked: tuple[dict[str, dict[str, Any]], Path], stack: Stack
) -> None:
    _, path = walked
    dra = read_snapshot(path).cluster.dra
    nodes = {n["metadata"]["name"] for n in json.loads(kubectl(stack, "get", "nodes", "-o", "json"))["items"]}
    assert "gpu.nvidia.com" in {c.name for c in dra.classes}
    assert {s.node for s in dra.slices} == nodes


def _health_port(stack: Stack) -> int:
    log = (stack.state_dir / "logs" / "state-0.log").read_text()
    found = re.findall(r"health endpoints on http://[^:]+:(\d+)/healthz", log)
    assert found, "the state service logged no health port"
    return int(found[-1])


def test_the_state_service_serves_the_snapshot_on_its_health_port(
    walked: tuple[dict[str, dict[str, Any]], Path], stack: Stack, tmp_path: Path
) -> None:
    _, over_nats = walked
    path = tmp_path / "over-http.kairos.gz"
    url = f"http://127.0.0.1:{_health_port(stack)}/get-snapshot"
    out = kairos(stack, "snapshot", "--url", url, "-o", str(path))
    assert f"wrote {path}" in out
    http, nats = read_snapshot(path), read_snapshot(over_nats)
    assert http.header.source == "state replica state-0"
    assert [n.name for n in http.cluster.nodes] == [n.name for n in nats.cluster.nodes]
    assert [g.key for g in http.cluster.podgroups] == [g.key for g in nats.cluster.podgroups]
    assert [s.name for s in http.cluster.dra.slices] == [s.name for s in nats.cluster.dra.slices]
    assert [s.shard for s in http.shards] == [s.shard for s in nats.shards]
