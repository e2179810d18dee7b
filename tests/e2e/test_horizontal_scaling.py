"""Horizontal scaling, proven: 3 placement and 2 binder replicas schedule 2,500 pods concurrently.

Placement workers take batches of podgroups in parallel, each on its own replica of the state, so they
propose overlapping placements; the binders (in resource-fit mode: a moved node is re-checked for room)
commit a proposal only if every node it uses still has room, and the queue re-dispatches the losers. Afterwards no GPU is over-committed, every pod is bound
exactly once (one claim, on the node it runs on), and the number of conflicts is reported. The nodes are
filled as full as at 5,000 pods on 700 (nine tenths of their GPUs), so the replicas meet as often; the
scaling curve of `kairos bench` over placement replicas (1, 2 and 4, the binders in resource-fit mode)
runs the same layout at 1,000 nodes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from shared.bus.connection import connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS
from shared.errors import MalformedMessage
from shared.model import PodStatus
from tests.e2e.invariants import load
from tools.stack.supervisor import start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PODS = 2500
NODES = 350


async def _load(url: str) -> None:
    await load(url, NODES, PODS)


async def _wait_and_check(url: str, timeout: float) -> dict[str, int]:
    bus = await connect(url, "scaling-test")
    replica = StateReplica(bus)
    await replica.start()
    counters: dict[str, dict[str, int]] = {}

    async def on_beat(msg: object) -> None:
        try:
            beat = HEARTBEATS.decode(getattr(msg, "subject", ""), getattr(msg, "data", b""))
        except MalformedMessage:
            return
        counters[beat.replica] = beat.counters

    sub = await bus.nc.subscribe(s.HEALTH_WILDCARD, cb=on_beat)
    try:
        deadline = time.monotonic() + timeout
        while True:
            pods = replica.snapshot().pods
            running = sum(1 for p in pods if p.status == PodStatus.RUNNING)
            if running == PODS or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        snap = replica.snapshot()
        raw_pods = [r.pod for r in replica.records.values() if hasattr(r, "pod")]
        assert sum(1 for p in raw_pods if p.status == PodStatus.RUNNING) == PODS, "not every pod was bound"
        gpus_per_node: Counter[str] = Counter()
        for p in raw_pods:
            assert p.node is not None
            gpus_per_node[p.node] += p.gpu.devices
        capacity = {n.name: n.gpus for n in snap.nodes}
        over = {n: used for n, used in gpus_per_node.items() if used > capacity[n]}
        assert not over, f"over-committed nodes: {over}"
        claims = replica.claims
        assert len(claims) == PODS, f"{len(claims)} claims for {PODS} pods"
        on_node = {p.key: p.node for p in raw_pods}
        assert all(c.node == on_node[c.pod] for c in claims.values()), (
            "a claim names another node than the pod's"
        )
        await asyncio.sleep(1.5)  # one more heartbeat round, so the counters are final
        totals: Counter[str] = Counter()
        for name, values in counters.items():
            if name.startswith("binder"):
                totals.update(values)
        return dict(totals)
    finally:
        await sub.unsubscribe()
        await replica.stop()
        await bus.close()


@pytest.mark.timeout(900)
def test_three_placements_and_two_binders_bind_2500_pods_once(tmp_path: Path) -> None:
    stack = start_stack(
        tmp_path / "stack",
        replicas={"state": 1, "queue": 1, "placement": 3, "binder": 2},
        options={
            "state": {"source": "sim"},
            "queue": {"batch": "100", "period": "0.5"},
            "binder": {"conflicts": "fit"},
        },
    )
    try:
        started = time.monotonic()
        asyncio.run(_load(stack.url))
        totals = asyncio.run(_wait_and_check(stack.url, timeout=600))
        elapsed = time.monotonic() - started
    finally:
        stack.stop()
    print(
        f"\n{PODS:,} pods bound by 3 placement + 2 binder replicas in {elapsed:.1f} s; "
        f"binder commits {totals.get('committed', 0)}, conflicts {totals.get('conflicts', 0)}"
    )
    assert totals.get("committed", 0) > 0
