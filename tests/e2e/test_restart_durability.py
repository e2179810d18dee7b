"""A restart of every service and of nats-server loses no pending or bound pod.

A stack with bound and pending pods is stopped whole (SIGTERM to every service, then nats-server; the
JetStream store stays on disk) and started again on the same store (`Stack.restart_nats`,
`Stack.restart`). Afterwards every pod is there with the status and node it had, every bound pod keeps
its claim on that node, and the pending pods still get scheduled once there is room.

Two sources: the state service's in-memory cluster, which rebuilds from JetStream alone (the owner adopts
what KV holds), and the simulated Kubernetes API server, which keeps running through the restart while the
state service lists it again (the API server is the truth; KV is rebuilt from it and the ledger).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from shared.bus.client import BusClient
from shared.bus.health import wait_ready
from shared.contracts.messages import ApplyRequest
from shared.model import PodStatus
from shared.model.builders import gpu_nodes
from tests.e2e import manifests
from tests.e2e.invariants import Observer, load
from tests.e2e.kubectl import apply, kubectl, kubesim_stack
from tools.stack.supervisor import KUBESIM, Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

Placement = dict[str, tuple[str, str | None]]
"""Pod key -> (status, node)."""


async def _settled(url: str, bound: int, pending: int) -> tuple[Placement, dict[str, str]]:
    """Wait until exactly `bound` pods are bound and `pending` pending; the pods and the claims then."""
    observer = await Observer.open(url, "restart-test")
    try:
        await observer.until(
            f"{bound} bound and {pending} pending",
            lambda: (
                observer.count(PodStatus.RUNNING) == bound and observer.count(PodStatus.PENDING) == pending
            ),
            timeout=300,
        )
        observer.check()
        placement = {p.key: (p.status.value, p.node) for p in observer.pods()}
        claims = {c.pod: c.node for c in observer.replica.claims.values()}
        return placement, claims
    finally:
        await observer.close()


def _restart_everything(stack: Stack) -> None:
    """SIGTERM every service (the simulated API server keeps running), restart nats-server on its store,
    start the services again, and wait until each reports ready."""
    services = [name for name in stack.processes if name != KUBESIM]
    for name in services:
        stack.processes[name].send_signal(signal.SIGTERM)
    for name in services:
        assert stack.processes[name].wait(30) == 0, f"{name} did not stop cleanly"
    stack.restart_nats()
    for name in services:
        stack.restart(name)
    asyncio.run(wait_ready(stack.url, set(services), 120.0, stack.first_exit))


def _same(before: Placement, after: Placement) -> None:
    lost = sorted(set(before) - set(after))
    assert not lost, f"{len(lost)} pods lost in the restart, e.g. {lost[:5]}"
    changed = {k: (before[k], after[k]) for k in before if after[k] != before[k]}
    assert not changed, f"{len(changed)} pods changed in the restart, e.g. {list(changed.items())[:5]}"


@pytest.mark.timeout(600)
def test_a_restart_of_every_service_and_nats_keeps_every_pod_of_the_in_memory_cluster(tmp_path: Path) -> None:
    stack = start_stack(
        tmp_path / "stack",
        replicas={"state": 1, "queue": 1, "placement": 1, "binder": 1},
        options={"state": {"source": "sim"}, "queue": {"batch": "50", "period": "0.5"}},
    )
    try:
        # 20 nodes of 8 GPUs for 200 one-GPU pods: 160 bound, 40 pending.
        started = time.monotonic()
        asyncio.run(load(stack.url, nodes=20, pods=200))
        before, claims_before = asyncio.run(_settled(stack.url, bound=160, pending=40))
        settled = time.monotonic()

        _restart_everything(stack)
        restarted = time.monotonic()

        after, claims_after = asyncio.run(_settled(stack.url, bound=160, pending=40))
        _same(before, after)
        assert claims_after == claims_before, "the ledger's claims changed in the restart"

        # The pending pods are still scheduled once there is room.
        asyncio.run(_add_nodes(stack.url, 5))
        asyncio.run(_settled(stack.url, bound=200, pending=0))
        print(
            f"\nin-memory: settled in {settled - started:.1f} s, stop + restart {restarted - settled:.1f} s, "
            f"the last 40 bound {time.monotonic() - restarted:.1f} s after the restart"
        )
    finally:
        stack.stop()


async def _add_nodes(url: str, count: int) -> None:
    client = await BusClient.connect(url)
    try:
        reply = await client.apply(ApplyRequest(nodes=tuple(gpu_nodes(count, prefix="extra"))))
        assert reply.ok, reply.error
    finally:
        await client.close()


# --- the Kubernetes source ------------------------------------------------------------------------------
KUBE_PODS = 20
"""One-GPU pods on 2 simulated nodes of 8 GPUs: 16 bound, 4 pending."""


def _api_pods(stack: Stack) -> dict[str, tuple[str, str | None]]:
    """Pod name -> (phase, node) as the API server has them."""
    items: list[dict[str, Any]] = json.loads(kubectl(stack, "get", "pods", "-o", "json"))["items"]
    return {
        p["metadata"]["name"]: (p.get("status", {}).get("phase", ""), p["spec"].get("nodeName"))
        for p in items
    }


@pytest.mark.timeout(600)
def test_a_restart_of_every_service_and_nats_keeps_every_pod_of_the_kubernetes_source(tmp_path: Path) -> None:
    with kubesim_stack(tmp_path / "stack", nodes=2, gpus_per_node=8) as stack:
        api_process = stack.processes[KUBESIM]
        apply(stack, *(manifests.pod(f"p-{i:03d}", gpus="1") for i in range(KUBE_PODS)))
        before, claims_before = asyncio.run(_settled(stack.url, bound=16, pending=4))
        api_before = _api_pods(stack)
        assert sum(1 for _, node in api_before.values() if node) == 16

        _restart_everything(stack)
        assert stack.processes[KUBESIM] is api_process
        assert api_process.poll() is None, "the simulated API server stopped with the services"

        after, claims_after = asyncio.run(_settled(stack.url, bound=16, pending=4))
        _same(before, after)
        assert claims_after == claims_before, "the ledger's claims changed in the restart"
        assert _api_pods(stack) == api_before, "the API server's pods changed in the restart"

        # Room for the pending pods: four bound ones go, and the four pending are bound in their place.
        gone = sorted(name for name, (_, node) in api_before.items() if node)[:4]
        kubectl(stack, "delete", "pod", *gone, "--wait=false")
        asyncio.run(_settled(stack.url, bound=16, pending=0))
        now = _api_pods(stack)
        assert sorted(now) == sorted(set(api_before) - set(gone))
        assert all(node for _, node in now.values()), f"pods still pending: {now}"
