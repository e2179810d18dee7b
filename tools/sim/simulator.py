"""A simulated cluster driven by the core: submit workloads, run cycles, apply the decisions.

Each `step(now)` takes a snapshot, calls `schedule`, and applies the result the way a cluster would:
bound pods start running (and finish after their run time), evicted pods return to pending, pipelined
pods wait for the next cycle. Used by `kairos demo` and tests; the services will use the same rules for
their simulated cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.model import Node, Pod, PodGroup, PodStatus, Queue, Snapshot


@dataclass
class Simulator:
    nodes: list[Node]
    queues: list[Queue]
    policy: Policy = field(default_factory=Policy)
    pods: dict[str, Pod] = field(default_factory=dict)
    podgroups: dict[str, PodGroup] = field(default_factory=dict)
    run_time: dict[str, float] = field(default_factory=dict)
    finish_at: dict[str, float] = field(default_factory=dict)

    def submit(self, podgroup: PodGroup, pods: list[Pod], run_time: float | None = None) -> None:
        """Add a workload; with `run_time` its pods succeed that many seconds after they start."""
        self.podgroups[podgroup.key] = podgroup
        for pod in pods:
            self.pods[pod.key] = pod
            if run_time is not None:
                self.run_time[pod.key] = run_time

    def snapshot(self) -> Snapshot:
        return Snapshot(
            nodes=tuple(self.nodes),
            pods=tuple(self.pods.values()),
            podgroups=tuple(self.podgroups.values()),
            queues=tuple(self.queues),
        )

    def step(self, now: float) -> CycleResult:
        self._finish(now)
        result = schedule(self.snapshot(), now, self.policy)
        for proposal in result.binds:
            for b in proposal.bindings:
                key = b.pod
                self.pods[key] = msgspec.structs.replace(
                    self.pods[key], status=PodStatus.RUNNING, node=b.node, gpu_groups=b.gpu_groups
                )
                if key in self.run_time:
                    self.finish_at[key] = now + self.run_time[key]
        for ev in result.evictions:
            key = ev.pod
            self.pods[key] = msgspec.structs.replace(self.pods[key], status=PodStatus.PENDING, node=None)
            self.finish_at.pop(key, None)
        for key, pg in list(self.podgroups.items()):
            updates: dict[str, float | None] = {
                "stale_since": result.stale_since.get(key),
                "last_start_time": result.last_start.get(key, pg.last_start_time),
            }
            self.podgroups[key] = msgspec.structs.replace(pg, **updates)
        return result

    def _finish(self, now: float) -> None:
        for key, at in list(self.finish_at.items()):
            if at <= now:
                self.pods[key] = msgspec.structs.replace(self.pods[key], status=PodStatus.SUCCEEDED)
                del self.finish_at[key]
