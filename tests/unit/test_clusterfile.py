"""The cluster YAML (`shared.clusterfile`): round trips, and every kind of bad input named by file, object and
field; `kairos submit` / `kairos status` turn bad input into one `kairos: ...` line before touching NATS."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shared.clusterfile import (
    RUN_SECONDS_LABEL,
    ClusterObjects,
    dump_cluster,
    load_cluster,
    parse_cluster,
    run_seconds,
)
from shared.errors import InvalidObject
from shared.model import (
    GpuRequest,
    Node,
    Pod,
    PodGroup,
    PodSet,
    PodStatus,
    Queue,
    QueueResource,
    SubGroupSet,
    Topology,
    TopologyConstraint,
)
from shared.model.objects import Taint
from tools.cli.main import main

EXAMPLE = """
nodes:
  - {name: node-0, cpu_millis: 64000, memory_bytes: 549755813888, gpus: 8, labels: {rack: r1}}
queues:
  - {name: org, gpu: {quota: -1, limit: -1}}
  - {name: research, parent: org, gpu: {quota: 16, over_quota_weight: 2}}
podgroups:
  - name: train
    queue: research
    root: {name: root, pod_sets: [{name: default, min_available: 2}]}
pods:
  - {name: train-0, podgroup: train, gpu: {devices: 1}, labels: {kairos.io/run-seconds: "600"}}
  - {name: train-1, podgroup: train, gpu: {devices: 1}, status: Running, node: node-0}
topologies:
  - {name: dc, levels: [rack]}
"""


def test_the_documented_example_loads() -> None:
    objects = parse_cluster(EXAMPLE, "example.yaml")
    assert objects.counts() == {"nodes": 1, "queues": 2, "podgroups": 1, "pods": 2, "topologies": 1}
    assert objects.queues[1].gpu == QueueResource(quota=16, over_quota_weight=2)
    assert objects.pods[1].status == PodStatus.RUNNING
    assert run_seconds(objects.pods[0]) == 600.0
    assert run_seconds(objects.pods[1]) is None


def test_dump_then_load_gives_the_same_objects(tmp_path: Path) -> None:
    objects = ClusterObjects(
        nodes=(
            Node(
                name="n",
                cpu_millis=1000,
                memory_bytes=1e9,
                gpus=2,
                taints=(Taint(key="gpu"),),
                scalars={"nvidia.com/mig-1g.10gb": 2},
            ),
        ),
        queues=(Queue(name="q", gpu=QueueResource(quota=2, limit=4)),),
        podgroups=(
            PodGroup(
                name="g",
                namespace="ns",
                queue="q",
                root=SubGroupSet(
                    name="root",
                    pod_sets=(PodSet("a", 1, TopologyConstraint("dc", required_level="rack")),),
                ),
            ),
        ),
        pods=(
            Pod(
                name="p",
                namespace="ns",
                podgroup="g",
                gpu=GpuRequest(devices=1, fraction=0.5),
                gpu_groups=("0",),
            ),
            Pod(name="m", namespace="ns", podgroup="g", gpu=GpuRequest(mig={"1g.10gb": 1})),
        ),
        topologies=(Topology("dc", ("rack", "kubernetes.io/hostname")),),
    )
    text = dump_cluster(objects)
    assert "gpu_memory_mib" not in text  # defaults are left out
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_cluster(path) == objects


def test_an_empty_file_is_an_empty_cluster() -> None:
    assert parse_cluster("", "e.yaml") == ClusterObjects()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: [oops", "cluster file 'f.yaml': invalid YAML: line 2, column 1"),
        ("- 1\n- 2\n", "cluster file 'f.yaml': expected a mapping of object lists, got list"),
        ("jobs: []", "cluster file 'f.yaml': jobs: unknown field"),
        (
            "pods: [{name: p, podgroup: g, gpus: 1}]",
            "cluster file 'f.yaml': pods[0].gpus: unknown field (pod 'p')",
        ),
        (
            "pods: [{name: p, podgroup: g, gpu: {devices: 1, fractoin: 0.5}}]",
            "cluster file 'f.yaml': pods[0].gpu.fractoin: unknown field (pod 'p')",
        ),
        (
            "podgroups: [{name: g, queue: q, root: {name: r, pod_sets: [{name: a, min_available: 1, extra: 2}]}}]",
            "cluster file 'f.yaml': podgroups[0].root.pod_sets[0].extra: unknown field (podgroup 'g')",
        ),
        ("pods: [{name: p}]", "cluster file 'f.yaml': pods[0].podgroup: missing required field (pod 'p')"),
        (
            "nodes: [{name: n, cpu_millis: lots, memory_bytes: 1}]",
            "cluster file 'f.yaml': nodes[0].cpu_millis: expected `float`, got `str` (node 'n')",
        ),
        (
            "nodes: [{name: n, cpu_millis: 1, memory_bytes: 1, gpus: -4}]",
            "cluster file 'f.yaml': nodes[0].gpus: must be a finite number >= 0, got -4 (node 'n')",
        ),
        (
            "pods: [{name: p, podgroup: g, cpu_millis: -1}]",
            "cluster file 'f.yaml': pods[0].cpu_millis: must be a finite number >= 0, got -1.0 (pod 'p')",
        ),
        (
            "pods: [{name: p, podgroup: g, gpu: {devices: 1, fraction: 1.5}}]",
            "cluster file 'f.yaml': pods[0].gpu.fraction: gpu fraction 1.5 outside (0, 1] (pod 'p')",
        ),
        (
            "queues: [{name: q, memory: {quota: -3}}]",
            "cluster file 'f.yaml': queues[0].memory.quota: must be >= 0 or -1 (unlimited), got -3.0 (queue 'q')",
        ),
        (
            "podgroups: [{name: g, queue: q, root: {name: r, pod_sets: [{name: a, min_available: -1}]}}]",
            "cluster file 'f.yaml': podgroups[0].root.pod_sets[0].min_available: must be >= 0, got -1 (podgroup 'g')",
        ),
        (
            "pods: [{name: p, podgroup: g, status: Runing}]",
            "cluster file 'f.yaml': pods[0].status: invalid enum value 'Runing' (pod 'p')",
        ),
        (
            "pods: [{name: p, podgroup: g, labels: {kairos.io/run-seconds: soon}}]",
            (
                f"cluster file 'f.yaml': pods[0].labels[{RUN_SECONDS_LABEL}]: must be a number of seconds between 0 and 1e+09, "
                "got 'soon' (pod 'p')"
            ),
        ),
        (
            "queues: [{name: q}, {name: r}, {name: q}]",
            "cluster file 'f.yaml': queues[2]: duplicate queue 'q'",
        ),
    ],
)
def test_bad_input_names_file_object_and_field(text: str, message: str) -> None:
    with pytest.raises(InvalidObject) as caught:
        parse_cluster(text, "f.yaml")
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidObject, match="cannot read: No such file"):
        load_cluster(tmp_path / "absent.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00nodes")
    with pytest.raises(InvalidObject, match="not UTF-8"):
        load_cluster(binary)


# --- the commands' bad input ------------------------------------------------------------------------------
def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kairos: ")
    return lines[0]


def test_submit_of_a_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{name: n, cpu_millis: 1, memory_bytes: 1, gpus: -4}]\n")
    assert main(["submit", str(bad), "--nats-url", "nats://127.0.0.1:1"]) == 2
    captured = capsys.readouterr()
    assert _one_error_line(captured.err) == (
        f"kairos: cluster file {str(bad)!r}: nodes[0].gpus: must be a finite number >= 0, got -4 (node 'n')"
    )
    assert captured.out == ""


def test_submit_of_an_empty_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["submit", str(empty), "--nats-url", "nats://127.0.0.1:1"]) == 2
    assert "no objects to submit" in _one_error_line(capsys.readouterr().err)


def test_status_without_a_stack_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--state-dir", str(tmp_path / "none")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "nats.url" in line
    assert "kairos up" in line


def test_status_when_nats_is_not_there(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["status", "--nats-url", f"nats://127.0.0.1:{port}"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"cannot reach NATS at nats://127.0.0.1:{port}" in line


def test_an_unreachable_stack_is_named_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    """`nats.url` carries the operator's password: an error line names the server, never the secret."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["status", "--nats-url", f"nats://operator:s3cret-pw@127.0.0.1:{port}"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"cannot reach NATS at nats://operator:***@127.0.0.1:{port}" in line
    assert "s3cret-pw" not in line


def test_nats_url_and_state_dir_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--nats-url", "nats://x:1", "--state-dir", "d"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
