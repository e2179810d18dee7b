"""A cycle's decisions over a replica snapshot, pure: the plan, the quota verdicts worth publishing, the
shard's policy.

Called by `services.queue.dispatcher.Dispatcher` every cycle (`plan_cycle` in a thread, `admission_changed`
per verdict, `shard_policy` for every work item) and by `tools.bench.fair_share`. `plan_cycle` is the core's
`shared.core.queue_plan.plan_queues` (fair shares, the pending podgroups in allocate's order, the quota
gate's verdicts) with the fair shares turned into `QueueFairShare` events; no I/O, no clock (`now` is an
argument), so the plan is tested without NATS. How the pending podgroups become work items is
`services.queue.batching`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from shared.contracts.events import QueueFairShare
from shared.contracts.messages import ShardRecord
from shared.core.builtin_plugins import SessionRegistry
from shared.core.policy import Policy
from shared.core.queue_plan import Resources, plan_queues
from shared.core.quota_gate import QuotaVerdict
from shared.errors import KairosError
from shared.kube.scheduling_shard import policy_of
from shared.model import Snapshot

log = logging.getLogger("kairos.queue.planning")

NO_RESOURCES = Resources(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Plan:
    """What one cycle found in a snapshot."""

    fair_shares: tuple[QueueFairShare, ...]
    pending: tuple[str, ...]
    """Podgroups with pods to place, in the order the core's allocate action takes them."""
    stale: bool
    """Some gang is below its min member (or still marked stale): stale-gang eviction has something to do."""
    guarded: frozenset[str] = frozenset()
    """Pending podgroups whose placement is bounded by a queue total (a limit, or quota for non-preemptible
    work) somewhere up their queue chain. Placement checks such totals on its own replica and the binder's
    per-node compare-and-set cannot see them, so two of these must never be placed concurrently."""
    admissions: tuple[QuotaVerdict, ...] = ()
    """The quota gate's verdicts on the podgroups with gated pods (`shared.core.quota_gate`)."""
    total: Resources = NO_RESOURCES
    """The cluster's capacity as the fair-share division saw it (the usage ledger samples it)."""


def _resources(v: Resources) -> dict[str, float]:
    return dict(v._asdict())


USAGE_DIGITS = 4
"""Usage in the events is rounded to this many decimals: it moves a little every cycle, and an event goes
out only when a queue's numbers change."""


def plan_cycle(
    snapshot: Snapshot, now: float, policy: Policy, registry: SessionRegistry | None = None
) -> Plan:
    """The core's plan of `snapshot` under `policy` (`shared.core.queue_plan`) with the plugins of
    `registry` (KAI's when None), fair shares as events (with the policy's queue usage, time-based fair
    share)."""
    plan = plan_queues(snapshot, now, policy, registry)
    usage = {
        u.queue: {
            "gpu": round(u.gpu, USAGE_DIGITS),
            "cpu": round(u.cpu, USAGE_DIGITS),
            "memory": round(u.memory, USAGE_DIGITS),
        }
        for u in policy.queue_usage
    }
    zero = dict.fromkeys(Resources._fields, 0.0) if policy.queue_usage else {}
    shares = tuple(
        QueueFairShare(
            time=now,
            queue=q.queue,
            parent=q.parent,
            fair_share=_resources(q.fair_share),
            allocated=_resources(q.allocated),
            requested=_resources(q.requested),
            deserved=_resources(q.deserved),
            allocated_non_preemptible=_resources(q.allocated_non_preemptible),
            usage=usage.get(q.queue, zero),
        )
        for q in plan.shares
    )
    return Plan(shares, plan.pending, plan.stale, plan.guarded, plan.admissions, plan.total)


def admission_changed(last: QuotaVerdict | None, verdict: QuotaVerdict) -> bool:
    """Whether `verdict` is news after `last` (the podgroup's verdict last published): another reason or
    message for what it holds, or pods let in that `last` did not let in (pods created since, or room
    freed). Fewer gated pods is no news."""
    if last is None or (last.reason, last.message) != (verdict.reason, verdict.message):
        return True
    return not set(verdict.admitted) <= set(last.admitted)


def shard_policy(base: Policy, record: ShardRecord | None) -> Policy:
    """`base` under the shard's configuration (`policy_of`), its actions those of `base` the shard enables,
    in the shard's order; `base` itself without a record, or with one the base cannot take (logged: the
    record was checked against KAI's defaults when it was written)."""
    if record is None:
        return base
    try:
        policy = policy_of(record.config, base=base)
        return msgspec.structs.replace(policy, actions=tuple(a for a in policy.actions if a in base.actions))
    except (msgspec.ValidationError, KairosError) as exc:
        log.warning("SchedulingShard %s not applied to the policy: %s", record.shard, exc)
        return base
