"""The local stack from the command line: `kairos up --detach` prints `ready`, `kairos submit` adds work,
`kairos status` shows it running, `kairos down` leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.stack.nats_server import pid_alive

pytestmark = pytest.mark.e2e

WORKLOAD = """
queues:
  - {name: team-x, parent: org, gpu: {quota: 8, over_quota_weight: 1, limit: -1},
     cpu: {quota: -1, over_quota_weight: 1, limit: -1}, memory: {quota: -1, over_quota_weight: 1, limit: -1}}
podgroups:
  - {name: e2e-gang, queue: team-x, priority: 50,
     root: {name: root, pod_sets: [{name: default, min_available: 2}]}}
pods:
  - {name: e2e-gang-0, uid: e2e-gang-0, podgroup: e2e-gang, cpu_millis: 1000, memory_bytes: 1000000000, gpu: {devices: 1}}
  - {name: e2e-gang-1, uid: e2e-gang-1, podgroup: e2e-gang, cpu_millis: 1000, memory_bytes: 1000000000, gpu: {devices: 1}}
"""


def kairos(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.timeout(300)
def test_up_submit_status_down(tmp_path: Path) -> None:
    state = tmp_path / "kairos"
    up = kairos("up", "--detach", "--memory", "--state-dir", str(state), "--replicas", "placement=2,binder=2")
    assert up.returncode == 0, (
        up.stderr + (state / "up.log").read_text() if (state / "up.log").exists() else ""
    )
    assert up.stdout.strip().splitlines()[-1] == "ready"
    # The CLI's address names the operator identity and its password: readable by the owner only.
    url = (state / "nats.url").read_text()
    assert url.startswith("nats://operator:")
    assert "@127.0.0.1:" in url
    assert (state / "nats.url").stat().st_mode & 0o777 == 0o600
    record = json.loads((state / "stack.json").read_text())
    pids = [record["nats"], *record["services"].values()]
    assert len(record["services"]) == 6
    try:
        # The demo cluster's top-level queue is `org`: the submitted queue hangs below it.
        workload = tmp_path / "work.yaml"
        workload.write_text(WORKLOAD)
        submitted = kairos("submit", str(workload), "--state-dir", str(state))
        assert submitted.returncode == 0, submitted.stderr
        deadline = time.monotonic() + 60
        while True:
            status = kairos("status", "--state-dir", str(state), "--all")
            assert status.returncode == 0, status.stderr
            lines = [line for line in status.stdout.splitlines() if "e2e-gang-" in line]
            if len(lines) == 2 and all("Running" in line for line in lines):
                break
            assert time.monotonic() < deadline, status.stdout
            time.sleep(1)
        # A replica that dies is started again; the stack goes on.
        os.kill(record["services"]["placement-0"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            status = kairos("status", "--state-dir", str(state))
            rows = [line for line in status.stdout.splitlines() if "placement-0" in line]
            if status.returncode == 0 and rows and "running" in rows[0]:
                break
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.5)
        assert "Processes restarted by kairos up" in status.stdout
        assert [cell.strip() for cell in rows[0].split("│")[1:-1]] == ["placement-0", "1", "-9", "running"], (
            rows
        )
        restarted = json.loads((state / "stack.json").read_text())["services"]
        assert restarted["placement-0"] != record["services"]["placement-0"]
        pids.append(restarted["placement-0"])
        assert all(
            restarted[name] == pid for name, pid in record["services"].items() if name != "placement-0"
        )
    finally:
        down = kairos("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if pid_alive(pid)], "processes left running after kairos down"
