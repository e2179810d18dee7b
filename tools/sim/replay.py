"""Replay a captured snapshot offline: the core's cycles over it, with what-if changes, and what changed.

Called by `kairos simulate` (`tools.cli.simulate`). No NATS, no clock: `replay(captured, whatif, cycles)`
starts from the snapshot's scheduling view (`CapturedSnapshot.scheduling_view`: the cluster with the
binders' reservations counted), makes the what-if changes (`tools.sim.whatif`), then runs `cycles` cycles,
each one `schedule` per shard over the shard's node pool with the policy its SchedulingShard resolves to,
at the capture's time plus `interval` seconds per cycle. Between cycles the decisions take effect as the
in-memory cluster applies them (`services.state.sources.sim_source`): a bound pod runs, an evicted pod is pending
again at once (its controller recreates it), and the podgroups take the cycle's stale, last-start and
last-eviction stamps.

The answer (`Replay`) sets the captured state beside the simulated one: each podgroup's phase and nodes
before and after with what happened to it (starts, evicted and why, stays pending and why, in the words
of `shared.explain`), and each queue's settings, fair share and allocation before (the captured state
under the captured configuration) and after (the simulated state under the changed configuration).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from shared.contracts.subjects import DEFAULT_SHARD
from shared.core.node_pool import in_pool
from shared.core.policy import Policy
from shared.core.queue_plan import QueueShare, plan_queues
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.core.stamps import latest, merged_stamps
from shared.explain import failed_scheduling_message, plain_eviction
from shared.model import Pod, PodGroup, PodStatus, Queue, Snapshot
from shared.model.status import ACTIVE_ALLOCATED, podgroup_phase
from shared.snapshot_file import CapturedSnapshot, Header, ShardCapture
from tools.sim.whatif import WhatIf

__all__ = ["GroupOutcome", "QueueOutcome", "Replay", "replay"]

DEFAULT_CYCLES = 3
"""Enough for a reclaim to finish: the cycle that evicts, the one that binds the reclaimer, one to settle."""
DEFAULT_INTERVAL = 1.0
"""Seconds between two simulated cycles (the queue leader's default cycle period)."""

STARTS = "starts"
EVICTED = "evicted"
STAYS_PENDING = "stays pending"
KEEPS_RUNNING = "keeps running"
UNCHANGED = "unchanged"
DISPLACED = "displaced"


@dataclass(frozen=True)
class GroupOutcome:
    """One podgroup, captured and simulated."""

    podgroup: str
    queue: str
    shard: str
    before: str
    """Its phase in the snapshot: Running, Starting, Pending, Succeeded, Failed, Empty."""
    after: str
    placed_before: int
    placed_after: int
    pods: int
    nodes_before: tuple[str, ...]
    nodes_after: tuple[str, ...]
    change: str
    """`STARTS`, `EVICTED`, `STAYS_PENDING`, `KEEPS_RUNNING`, `DISPLACED` (a removed node's pods, not
    placed again) or `UNCHANGED`."""
    why: str = ""
    """Why it was evicted or stays pending (`shared.explain`'s words); empty otherwise."""
    evicted: tuple[str, ...] = ()
    """Its pods the replay evicted."""


@dataclass(frozen=True)
class QueueOutcome:
    """One queue of one shard: its settings, fair share and allocation, captured and simulated (GPUs, CPU
    millicores, memory bytes; -1 for unlimited)."""

    queue: str
    shard: str
    parent: str | None
    settings_before: Mapping[str, Mapping[str, float]]
    """quota, limit, weight per resource."""
    settings_after: Mapping[str, Mapping[str, float]]
    fair_share_before: Mapping[str, float]
    fair_share_after: Mapping[str, float]
    allocated_before: Mapping[str, float]
    allocated_after: Mapping[str, float]


@dataclass(frozen=True)
class Replay:
    header: Header
    changes: tuple[str, ...]
    """The what-if changes, one line each, as the flags gave them."""
    cycles: int
    start: float
    interval: float
    shards: tuple[str, ...]
    groups: tuple[GroupOutcome, ...]
    queues: tuple[QueueOutcome, ...]
    binds: int
    evictions: int
    nodes_before: int
    nodes_after: int
    final: Snapshot = field(repr=False)

    @property
    def starting(self) -> tuple[GroupOutcome, ...]:
        return tuple(g for g in self.groups if g.change == STARTS)

    @property
    def evicted(self) -> tuple[GroupOutcome, ...]:
        return tuple(g for g in self.groups if g.evicted)

    @property
    def pending(self) -> tuple[GroupOutcome, ...]:
        return tuple(g for g in self.groups if g.change in (STAYS_PENDING, DISPLACED))

    def as_json(self) -> dict[str, object]:
        """The replay as JSON-ready data (`kairos simulate --json`)."""
        return {
            "snapshot": msgspec.to_builtins(self.header),
            "changes": list(self.changes),
            "cycles": self.cycles,
            "start": self.start,
            "interval": self.interval,
            "shards": list(self.shards),
            "nodes": {"captured": self.nodes_before, "simulated": self.nodes_after},
            "binds": self.binds,
            "evictions": self.evictions,
            "starting": [g.podgroup for g in self.starting],
            "evicted": [g.podgroup for g in self.evicted],
            "pending": [g.podgroup for g in self.pending],
            "podgroups": [
                {
                    "podgroup": g.podgroup,
                    "queue": g.queue,
                    "shard": g.shard,
                    "captured": {"phase": g.before, "placed": g.placed_before, "nodes": list(g.nodes_before)},
                    "simulated": {"phase": g.after, "placed": g.placed_after, "nodes": list(g.nodes_after)},
                    "pods": g.pods,
                    "change": g.change,
                    "why": g.why,
                    "evicted_pods": list(g.evicted),
                }
                for g in self.groups
            ],
            "queues": [
                {
                    "queue": q.queue,
                    "shard": q.shard,
                    "parent": q.parent,
                    "captured": {
                        "settings": q.settings_before,
                        "fair_share": q.fair_share_before,
                        "allocated": q.allocated_before,
                    },
                    "simulated": {
                        "settings": q.settings_after,
                        "fair_share": q.fair_share_after,
                        "allocated": q.allocated_after,
                    },
                }
                for q in self.queues
            ],
        }


def replay(
    captured: CapturedSnapshot,
    whatif: WhatIf | None = None,
    cycles: int = DEFAULT_CYCLES,
    interval: float = DEFAULT_INTERVAL,
) -> Replay:
    """Run `cycles` cycles of the core over `captured` with the changes of `whatif` (module docstring)."""
    whatif = whatif or WhatIf()
    start = captured.header.captured_at
    before = captured.scheduling_view()
    cluster, shards = whatif.apply(captured, before, start)
    start_cluster = cluster
    evictions: dict[str, str] = {}
    pending_why: dict[str, str] = {}
    binds = evicted = 0
    for cycle in range(cycles):
        now = start + cycle * interval
        for shard in shards:
            view = in_pool(cluster, shard.pool)
            if not view.podgroups and not view.pods:
                continue
            result = schedule(view, now, shard.policy)
            keys = {g.key for g in view.podgroups}
            cluster = _applied(cluster, result, keys)
            binds += sum(len(p.bindings) for p in result.binds)
            evicted += len(result.evictions)
            for order in result.evictions:
                evictions[order.pod] = order.message
            for key in keys:
                pending_why.pop(key, None)
            for explanation in result.pending:
                pending_why[explanation.podgroup] = explanation.message
    groups = _group_outcomes(captured, before, start_cluster, cluster, evictions, pending_why, shards)
    queues = _queue_outcomes(captured, before, cluster, shards, start, start + max(cycles - 1, 0) * interval)
    return Replay(
        header=captured.header,
        changes=tuple(whatif.describe()),
        cycles=cycles,
        start=start,
        interval=interval,
        shards=tuple(s.shard for s in shards),
        groups=groups,
        queues=queues,
        binds=binds,
        evictions=evicted,
        nodes_before=len(before.nodes),
        nodes_after=len(cluster.nodes),
        final=cluster,
    )


def _applied(cluster: Snapshot, result: CycleResult, scheduled: set[str]) -> Snapshot:
    """The cluster after the binder and the cluster carried out `result`, a cycle over the podgroups
    `scheduled` (module docstring). A whole cycle speaks for each of its podgroups' stale stamp (absent:
    no longer stale), as the simulator's `step` has it."""
    bound = {b.pod: b for proposal in result.binds for b in proposal.bindings}
    evicted = {order.pod for order in result.evictions}
    pods: list[Pod] = []
    for pod in cluster.pods:
        binding = bound.get(pod.key)
        if pod.key in evicted and pod.node is not None:
            pods.append(msgspec.structs.replace(pod, status=PodStatus.PENDING, node=None, gpu_groups=()))
        elif binding is not None and pod.node is None:
            pods.append(
                msgspec.structs.replace(
                    pod, status=PodStatus.RUNNING, node=binding.node, gpu_groups=binding.gpu_groups
                )
            )
        else:
            pods.append(pod)
    groups = tuple(
        _stamped(group, result) if group.key in scheduled else group for group in cluster.podgroups
    )
    return msgspec.structs.replace(cluster, pods=tuple(pods), podgroups=groups)


def _stamped(group: PodGroup, result: CycleResult) -> PodGroup:
    stale, last = merged_stamps(
        group.stale_since,
        group.last_start_time,
        new_stale_since=result.stale_since.get(group.key),
        new_last_start=result.last_start.get(group.key),
    )
    return msgspec.structs.replace(
        group,
        stale_since=stale,
        last_start_time=last,
        last_eviction_time=latest(group.last_eviction_time, result.last_eviction.get(group.key)),
    )


def _placed(pods: Iterable[Pod]) -> list[Pod]:
    return [p for p in pods if p.status in ACTIVE_ALLOCATED and p.status != PodStatus.PIPELINED and p.node]


def _min_member(group: PodGroup) -> int:
    return max(1, sum(ps.min_available for ps in group.root.all_pod_sets()))


def _by_group(pods: Iterable[Pod]) -> dict[str, list[Pod]]:
    out: dict[str, list[Pod]] = {}
    for pod in pods:
        out.setdefault(pod.podgroup, []).append(pod)
    return out


def _shard_of(group: PodGroup, shards: tuple[ShardCapture, ...]) -> str:
    for shard in shards:
        if shard.shard != DEFAULT_SHARD and shard.pool.selects(group.labels):
            return shard.shard
    default = next((s for s in shards if s.shard == DEFAULT_SHARD), None)
    return DEFAULT_SHARD if default is not None and default.pool.selects(group.labels) else ""


def _group_outcomes(
    captured: CapturedSnapshot,
    before: Snapshot,
    start: Snapshot,
    after: Snapshot,
    evictions: Mapping[str, str],
    pending_why: Mapping[str, str],
    shards: tuple[ShardCapture, ...],
) -> tuple[GroupOutcome, ...]:
    del captured
    pods_before, pods_start, pods_after = _by_group(before.pods), _by_group(start.pods), _by_group(after.pods)
    nodes = len(after.nodes)
    out: list[GroupOutcome] = []
    for group in after.podgroups:
        members_before = pods_before.get(group.key, [])
        members_after = pods_after.get(group.key, [])
        need = _min_member(group)
        was = podgroup_phase((p.status for p in members_before), need)
        now = podgroup_phase((p.status for p in members_after), need)
        placed_before, placed_after = _placed(members_before), _placed(members_after)
        placed_at_start = _placed(pods_start.get(group.key, []))
        gone = tuple(sorted(p.key for p in members_after if p.key in evictions))
        why = ""
        if gone:
            change = EVICTED
            why = plain_eviction(evictions[gone[0]])
        elif now == "Running" and was != "Running":
            change = STARTS
        elif now in ("Pending", "Starting") or (
            len(placed_after) < len(members_after) and now not in ("Succeeded", "Failed")
        ):
            change = (
                DISPLACED
                if len(placed_at_start) < len(placed_before) and not pending_why.get(group.key)
                else STAYS_PENDING
            )
            message = pending_why.get(group.key, "")
            why = failed_scheduling_message(message, nodes) if message else ""
            if change == DISPLACED and not why:
                why = "its node was removed"
        elif now == "Running" and len(placed_after) > len(placed_before):
            change = STARTS
        elif now == "Running":
            change = KEEPS_RUNNING
        else:
            change = UNCHANGED
        out.append(
            GroupOutcome(
                podgroup=group.key,
                queue=group.queue,
                shard=_shard_of(group, shards),
                before=was,
                after=now,
                placed_before=len(placed_before),
                placed_after=len(placed_after),
                pods=len(members_after),
                nodes_before=tuple(sorted({p.node for p in placed_before if p.node})),
                nodes_after=tuple(sorted({p.node for p in placed_after if p.node})),
                change=change,
                why=why,
                evicted=gone,
            )
        )
    return tuple(out)


def _settings(queue: Queue | None) -> dict[str, dict[str, float]]:
    if queue is None:
        return {}
    return {
        name: {"quota": r.quota, "limit": r.limit, "weight": r.over_quota_weight}
        for name, r in (("gpu", queue.gpu), ("cpu", queue.cpu), ("memory", queue.memory))
    }


def _vector(values: tuple[float, float, float] | None) -> dict[str, float]:
    if values is None:
        return {}
    return {"gpu": values[0], "cpu": values[1], "memory": values[2]}


def _plan(cluster: Snapshot, shard: ShardCapture, now: float, policy: Policy) -> dict[str, QueueShare]:
    view = in_pool(cluster, shard.pool)
    if not view.queues:
        return {}
    return {share.queue: share for share in plan_queues(view, now, policy).shares}


def _queue_outcomes(
    captured: CapturedSnapshot,
    before: Snapshot,
    after: Snapshot,
    shards: tuple[ShardCapture, ...],
    start: float,
    end: float,
) -> tuple[QueueOutcome, ...]:
    captured_policy = {s.shard: s for s in captured.shards}
    queues_before = {q.name: q for q in before.queues}
    queues_after = {q.name: q for q in after.queues}
    out: list[QueueOutcome] = []
    for shard in shards:
        original = captured_policy.get(shard.shard, shard)
        policy_before = msgspec.structs.replace(original.policy, queue_usage=captured.queue_usage)
        plan_before = _plan(before, original, start, policy_before)
        plan_after = _plan(after, shard, end, shard.policy)
        for name in sorted(plan_before.keys() | plan_after.keys()):
            was, now = plan_before.get(name), plan_after.get(name)
            parent = (was or now).parent if (was or now) is not None else None  # type: ignore[union-attr]
            out.append(
                QueueOutcome(
                    queue=name,
                    shard=shard.shard,
                    parent=parent,
                    settings_before=_settings(queues_before.get(name)),
                    settings_after=_settings(queues_after.get(name)),
                    fair_share_before=_vector(was.fair_share if was else None),
                    fair_share_after=_vector(now.fair_share if now else None),
                    allocated_before=_vector(was.allocated if was else None),
                    allocated_after=_vector(now.allocated if now else None),
                )
            )
    return tuple(out)
