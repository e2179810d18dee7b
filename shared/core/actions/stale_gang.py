"""Stale-gang eviction: a gang that has fallen below its min member for longer than the grace period is
evicted whole, so its remaining pods stop holding resources the gang cannot use. The grace period is the
PodGroup's own (KAI v0.17: ``spec.stalenessGracePeriod`` or the ``kai.scheduler/staleness-grace-period``
annotation; negative: never evicted as stale, 0: at once), else the policy's. Called by the cycle runner
(`shared.core.cycle`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.statement import Statement
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.session import Session

STALE_MESSAGE = "Podgroup {name} is below its minimum member count and was evicted as stale"


def run(ssn: Session) -> None:
    default = ssn.policy.staleness_grace_period
    for job in ssn.jobs.values():
        # A job no statement has touched (its version unmoved) is as the session opened it: its
        # staleness is its records', worked out once and kept with the job (`JobState.stale_as_opened`).
        if not (job.stale_as_opened() if job.version == 0 else job.is_stale()):
            job.stale_since = None
            continue
        if job.stale_since is None:
            job.stale_since = ssn.now
        own = job.podgroup.staleness_grace_period
        grace = default if own is None else own
        if grace < 0 or ssn.now - job.stale_since < grace:
            continue
        stmt = Statement(ssn)
        for task in sorted(job.tasks.values(), key=lambda t: t.key):
            # A pod still naming a node the snapshot lacks (the node deleted before its pods were) holds no
            # room here and cannot be evicted from it: left, as KAI's statement refuses it and goes on. An
            # eviction raising would fail every cycle of the shard, for every tenant.
            if task.status in ACTIVE_ALLOCATED and task.node in ssn.cluster.nodes:
                stmt.evict(task, STALE_MESSAGE.format(name=job.name))
        stmt.commit()
