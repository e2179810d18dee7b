"""What the fault tests share: loading a stack with single-GPU jobs, watching its heartbeats, and the
independent check of what was scheduled (read from the state and ledger KV, not from any service).

Used by tests/e2e/test_leader_safety.py, test_restart_durability.py and test_shutdown.py. The check is
the horizontal-scaling test's: every Running pod is on a node, no node holds more GPUs than it has, and
every bound pod has exactly one claim, naming the node it runs on.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from shared.bus.client import BusClient
from shared.bus.connection import Bus, connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS, ApplyRequest, PodRecord
from shared.errors import MalformedMessage
from shared.model import Pod, PodStatus
from shared.model.builders import gang, gpu_nodes
from tests.e2e.scenarios import apply, team_queues

BOUND = (PodStatus.BOUND, PodStatus.RUNNING, PodStatus.BINDING, PodStatus.ALLOCATED)


async def load(url: str, nodes: int, pods: int, first: int = 0, apply_nodes: bool = True) -> None:
    """`nodes` 8-GPU nodes, an `org` queue with four teams, and `pods` one-GPU single-pod jobs
    (`job-<first>` on), sent in chunks well under NATS's payload limit."""
    client = await BusClient.connect(url)
    try:
        if apply_nodes:
            queues = team_queues([f"team-{i}" for i in range(4)], gpu_quota=1000)
            await apply(client, ApplyRequest(nodes=tuple(gpu_nodes(nodes)), queues=queues))
        for start in range(first, first + pods, 250):
            groups, members = [], []
            for j in range(start, min(start + 250, first + pods)):
                pg, ps = gang(f"job-{j:05d}", f"team-{j % 4}", 1, 1.0, created=float(j))
                groups.append(pg)
                members.extend(ps)
            await apply(client, ApplyRequest(podgroups=tuple(groups), pods=tuple(members)))
    finally:
        await client.close()


@dataclass
class Beat:
    ready: bool
    detail: str
    counters: dict[str, int]
    at: float
    """When the test received it (time.monotonic)."""


@dataclass
class Observer:
    """A test's own view of a stack: a state replica and every replica's latest heartbeat."""

    bus: Bus
    replica: StateReplica
    beats: dict[str, Beat] = field(default_factory=dict)
    history: dict[str, list[Beat]] = field(default_factory=dict)
    """Every heartbeat received, per replica, in order."""

    @classmethod
    async def open(cls, url: str, name: str) -> Observer:
        bus = await connect(url, name)
        replica = StateReplica(bus)
        await replica.start(timeout=30.0)
        observer = cls(bus, replica)

        async def on_beat(msg: object) -> None:
            try:
                beat = HEARTBEATS.decode(getattr(msg, "subject", ""), getattr(msg, "data", b""))
            except MalformedMessage:
                return
            got = Beat(beat.ready, beat.detail, dict(beat.counters), time.monotonic())
            observer.beats[beat.replica] = got
            observer.history.setdefault(beat.replica, []).append(got)

        await bus.nc.subscribe(s.HEALTH_WILDCARD, cb=on_beat)
        return observer

    async def close(self) -> None:
        await self.replica.stop()
        await self.bus.close()

    def pods(self) -> list[Pod]:
        return [r.pod for r in self.replica.records.values() if isinstance(r, PodRecord)]

    def count(self, *statuses: PodStatus) -> int:
        return sum(1 for p in self.pods() if p.status in statuses)

    def total(self, prefix: str, counter: str) -> int:
        """A counter summed over the replicas whose id starts with `prefix` (their latest heartbeats)."""
        return sum(b.counters.get(counter, 0) for r, b in self.beats.items() if r.startswith(prefix))

    async def until(self, what: str, condition: object, timeout: float, every: float = 0.5) -> None:
        """Poll `condition()` until true; fail naming `what` after `timeout` seconds (generous: the
        machine is shared)."""
        assert callable(condition)
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            await asyncio.sleep(every)

    async def beat_after(self, replica: str, since: float, timeout: float = 30.0) -> Beat:
        """The first heartbeat of `replica` received after `since` (time.monotonic)."""
        await self.until(
            f"a heartbeat from {replica}",
            lambda: replica in self.beats and self.beats[replica].at > since,
            timeout,
            every=0.1,
        )
        return self.beats[replica]

    def check(self) -> dict[str, int]:
        """The independent check: no GPU over-committed, every bound pod on a node with exactly one claim
        naming that node, no claim for a pod that is not bound there. Returns pods per status."""
        snapshot = self.replica.snapshot()
        pods = self.pods()
        capacity = {n.name: n.gpus for n in snapshot.nodes}
        used: Counter[str] = Counter()
        for p in pods:
            if p.status in BOUND:
                assert p.node is not None, f"pod {p.key} is {p.status} without a node"
                used[p.node] += p.gpu.devices
        over = {n: u for n, u in used.items() if u > capacity.get(n, 0)}
        assert not over, f"over-committed nodes (GPUs used > capacity): {over}"
        claims: dict[str, list[str]] = {}
        for claim in self.replica.claims.values():
            claims.setdefault(claim.pod, []).append(claim.node)
        twice = {pod: nodes for pod, nodes in claims.items() if len(nodes) > 1}
        assert not twice, f"pods claimed more than once: {twice}"
        on_node = {p.key: p.node for p in pods if p.status in BOUND}
        for key, node in on_node.items():
            assert key in claims, f"bound pod {key} has no claim in the ledger"
            assert claims[key] == [node], f"pod {key} runs on {node} but its claim names {claims[key]}"
        return dict(Counter(p.status.value for p in pods))
