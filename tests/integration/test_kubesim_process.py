"""`python -m tools.kubesim` as `kairos up` runs it: one ready line, a kubeconfig, a clean exit on SIGTERM,
and one line naming the file and field when the cluster file is bad."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.kubectl_helpers import CRDS, REPO, kubectl

pytestmark = pytest.mark.integration


async def start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.kubesim",
        *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_the_server_prints_one_ready_line_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = await start(
        "--nodes", "3", "--gpus-per-node", "4", "--crds", str(CRDS), "--kubeconfig-out", str(kubeconfig)
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("kubesim ready http://127.0.0.1:")
        url = line.split()[2]
        written = yaml.safe_load(kubeconfig.read_text())
        assert written["clusters"][0]["cluster"]["server"] == url
        assert written["current-context"] == "kubesim"
        code, out, err = await kubectl(kubeconfig, "get", "nodes", "-o", "name")
        assert code == 0, err
        assert out.split() == ["node/node-0", "node/node-1", "node/node-2"]
        code, out, err = await kubectl(kubeconfig, "get", "crd", "-o", "name")
        assert "customresourcedefinition.apiextensions.k8s.io/queues.scheduling.run.ai" in out.split()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        stdout, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    assert stdout == b"", "nothing but the ready line goes to stdout"


async def test_a_bad_cluster_file_is_one_line_naming_the_file_and_field_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - {name: n1, cpu_millis: lots, memory_bytes: 1}\n")
    process = await start("--cluster", str(bad))
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert stdout == b""
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert str(bad) in lines[0]
    assert "nodes[0].cpu_millis" in lines[0]


async def test_the_cluster_file_s_nodes_are_the_simulated_nodes(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "nodes:\n"
        "  - {name: a100-0, cpu_millis: 64000, memory_bytes: 549755813888, gpus: 8, gpu_memory_mib: 81920}\n"
        "  - {name: cpu-0, cpu_millis: 32000, memory_bytes: 137438953472}\n"
    )
    kubeconfig = tmp_path / "kubeconfig"
    process = await start("--cluster", str(cluster), "--kubeconfig-out", str(kubeconfig))
    try:
        assert process.stdout is not None
        await asyncio.wait_for(process.stdout.readline(), 30)
        code, out, err = await kubectl(
            kubeconfig,
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.allocatable.nvidia\\.com/gpu};{end}",
        )
        assert code == 0, err
        assert out == "a100-0=8;cpu-0=;"
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
