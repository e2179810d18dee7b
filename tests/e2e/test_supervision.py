"""`kairos up`'s supervision under faults: kill -9 of one replica of every service, the only state and
queue replicas included, while kubectl's pods wait to be scheduled. The supervisor (`tools.stack.supervision`,
the loop `kairos up` runs) starts each again after its back-off; the replicas not killed keep running;
every pod ends bound exactly once and no node holds more GPUs than it has.

The stack runs on the simulated API server (the pods live there, not in a service); the test drives the
supervisor's loop in a thread, as `kairos up` does in its main loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e import manifests
from tests.e2e.invariants import Observer
from tests.e2e.kubectl import apply, kubesim_stack
from tests.e2e.supervised import bound_once, running_pods, supervised
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PODS = 24
KILLED = ("state-0", "queue-0", "placement-0", "binder-0")
SPARED = ("placement-1", "binder-1")


@pytest.mark.timeout(300)
def test_every_service_loses_a_replica_under_load_and_every_pod_is_bound_once(tmp_path: Path) -> None:
    lines: list[str] = []
    with kubesim_stack(
        tmp_path / "kairos", nodes=4, gpus_per_node=8, replicas={"placement": 2, "binder": 2}
    ) as stack:
        with supervised(stack, lines) as supervisor:
            spared = {name: stack.processes[name].pid for name in SPARED}
            half = PODS // 2
            apply(stack, *(manifests.pod(f"load-{i:02d}", gpus="1") for i in range(half)))
            for name in KILLED:
                os.kill(stack.processes[name].pid, signal.SIGKILL)
            # The rest arrive while the killed replicas are down or coming back.
            apply(stack, *(manifests.pod(f"load-{i:02d}", gpus="1") for i in range(half, PODS)))

            deadline = time.monotonic() + 180
            while len(placed := running_pods(stack)) < PODS:
                assert time.monotonic() < deadline, f"{len(placed)} of {PODS} pods running; {lines}"
                time.sleep(1)
            per_node = Counter(placed.values())
            assert all(count <= 8 for count in per_node.values()), per_node

            statuses = bound_once(stack, PODS, "supervision-test")
            assert sum(statuses.values()) == PODS
        for name in KILLED:
            assert supervisor.records[name].count >= 1, lines
            assert supervisor.records[name].last_exit == -signal.SIGKILL
            assert any(line.startswith(f"{name} restarted") for line in lines), lines
        for name, pid in spared.items():
            assert supervisor.records[name].count == 0, lines
            assert stack.processes[name].pid == pid
        record = json.loads((stack.state_dir / "restarts.json").read_text())
        assert {name: record[name]["count"] for name in KILLED} == dict.fromkeys(KILLED, 1)


@pytest.mark.timeout(300)
def test_nats_server_and_kubesim_killed_are_restarted_and_scheduling_goes_on(tmp_path: Path) -> None:
    lines: list[str] = []
    with kubesim_stack(tmp_path / "kairos", nodes=4, gpus_per_node=8) as stack:
        with supervised(stack, lines) as supervisor:
            apply(stack, *(manifests.pod(f"before-{i}", gpus="1") for i in range(4)))
            stack.nats.process.kill()
            deadline = time.monotonic() + 120
            while len(running_pods(stack)) < 4:
                assert time.monotonic() < deadline, lines
                time.sleep(1)
            # The simulated API server's objects live in its memory: a restarted one is a fresh cluster
            # (KAI's default queues and shard are created again), where new pods are scheduled.
            stack.processes["kubesim"].kill()
            while supervisor.records["kubesim"].count < 1:
                assert time.monotonic() < deadline, lines
                time.sleep(0.5)
            apply(stack, *(manifests.pod(f"after-{i}", gpus="1") for i in range(4)))
            while len(placed := running_pods(stack)) < 4 or not all(n.startswith("after-") for n in placed):
                assert time.monotonic() < deadline, (placed, lines)
                time.sleep(1)
            # What the state service holds is the new cluster: the pods and podgroups of the wiped one left.
            forgotten(stack, "before-")
        assert supervisor.records["nats-server"].count == 1, lines
        assert supervisor.records["kubesim"].count == 1, lines
        assert all(
            record.count == 0
            for name, record in supervisor.records.items()
            if name not in ("nats-server", "kubesim")
        )


def forgotten(stack: Stack, word: str) -> None:
    """Wait until no key of the state bucket names `word`."""

    async def check() -> None:
        observer = await Observer.open(stack.url, "supervision-test")

        def left() -> list[str]:
            return sorted(key for key in observer.replica.records if word in key)

        try:
            await observer.until(f"no key naming {word!r} in the state bucket", lambda: not left(), 60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still there: {left()}") from None
        finally:
            await observer.close()

    asyncio.run(check())
