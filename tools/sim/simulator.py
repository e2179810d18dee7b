"""The in-process simulator: the core deciding over the state service's simulated cluster, without NATS.

Used by `kairos demo` and by the core's property specs. Each `step(now)` fires the cluster's due timers
(a pod with a run time succeeds that long after it started), takes a snapshot, calls `schedule`, and hands
the result to the cluster the way the binder does over the bus: binds, then evictions, then the
podgroups' stale and last-start stamps. The pod lifecycle is `services.state.sources.sim_source.SimulatedCluster`'s,
the very rules the state service applies with `--set source=sim`, so the simulator, `kairos up --memory`
and conformance over the bus share one pod lifecycle (binds complete at once, evicted pods are pending
again at once).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from services.state.sources.sim_source import SimulatedCluster
from shared.clusterfile import RUN_SECONDS_LABEL
from shared.contracts.messages import ApplyRequest, PodGroupStamps
from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.model import Node, Pod, PodGroup, Queue, Snapshot


class Simulator:
    """A cluster of `nodes` and `queues` scheduled by `policy`, one `step` per cycle."""

    def __init__(self, nodes: Iterable[Node], queues: Iterable[Queue], policy: Policy | None = None) -> None:
        self.policy = policy if policy is not None else Policy()
        self.cluster = SimulatedCluster()
        self.cluster.apply(ApplyRequest(nodes=tuple(nodes), queues=tuple(queues)), 0.0)

    def submit(self, podgroup: PodGroup, pods: list[Pod], run_time: float | None = None) -> None:
        """Add a workload; with `run_time` its pods succeed that many seconds after they start (the
        cluster's `kairos.io/run-seconds` label)."""
        if run_time is not None:
            pods = [
                msgspec.structs.replace(p, labels={**p.labels, RUN_SECONDS_LABEL: str(run_time)})
                for p in pods
            ]
        self.cluster.apply(ApplyRequest(podgroups=(podgroup,), pods=tuple(pods)), 0.0)

    def snapshot(self) -> Snapshot:
        return self.cluster.snapshot()

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.snapshot().nodes

    @property
    def queues(self) -> tuple[Queue, ...]:
        return self.snapshot().queues

    @property
    def pods(self) -> dict[str, Pod]:
        """Every pod by its key, as the cluster holds it now."""
        return {p.key: p for p in self.snapshot().pods}

    @property
    def podgroups(self) -> dict[str, PodGroup]:
        return {pg.key: pg for pg in self.snapshot().podgroups}

    def step(self, now: float) -> CycleResult:
        self.cluster.fire(now)
        snapshot = self.cluster.snapshot()
        result = schedule(snapshot, now, self.policy)
        for proposal in result.binds:
            for binding in proposal.bindings:
                self.cluster.bind(binding, now)
        for eviction in result.evictions:
            self.cluster.evict(eviction, now)
        # A whole cycle speaks for every podgroup's stale stamp: absent means no longer stale (None clears).
        stamps = PodGroupStamps(
            shard="",
            stale_since={pg.key: result.stale_since.get(pg.key) for pg in snapshot.podgroups},
            last_start=dict(result.last_start),
            last_eviction=dict(result.last_eviction),
        )
        self.cluster.stamp(stamps, now)
        return result
