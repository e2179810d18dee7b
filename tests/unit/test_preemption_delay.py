"""Preemption delay (KAI v0.17, ``spec.preemptionDelay``, re-armed by ``kai.scheduler/last-eviction-timestamp``):
a pending workload inside its delay makes no one be evicted, through preempt, reclaim or consolidation, and
says so (``PreemptionDelayNotElapsed``); it still takes free capacity, and it can itself be a victim."""

from __future__ import annotations

import msgspec
import pytest

from shared.contracts.events import PodUnschedulable
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.core.stamps import latest
from shared.explain import Facts, explain
from shared.kube import keys, translate, wire
from shared.model import PodStatus, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from tools.sim.simulator import Simulator

NOW = 10_000.0
PREEMPT = Policy(actions=("allocate", "preempt"))


def cluster(
    urgent_delay: float | None, *, created: float = NOW - 60, evicted_at: float | None = None, free: int = 0
) -> Snapshot:
    """Two 8-GPU nodes full of low-priority work but `free` GPUs; an urgent one-GPU job waits."""
    nodes = gpu_nodes(2, gpus=8)
    low, low_pods = gang(
        "low",
        "team",
        16 - free,
        priority=10,
        status=PodStatus.RUNNING,
        nodes=[nodes[0].name] * 8 + [nodes[1].name] * (8 - free),
    )
    urgent, urgent_pods = gang("urgent", "team", 1, priority=80, created=created)
    urgent = msgspec.structs.replace(urgent, preemption_delay=urgent_delay, last_eviction_time=evicted_at)
    return Snapshot(
        nodes=tuple(nodes),
        queues=tuple(flat_queues(["team"])),
        podgroups=(low, urgent),
        pods=(*low_pods, *urgent_pods),
    )


def decide(snapshot: Snapshot) -> tuple[int, int, str]:
    result = schedule(snapshot, NOW, PREEMPT)
    bound = sum(len(p.bindings) for p in result.binds)
    why = next((p.message for p in result.pending if p.podgroup.endswith("urgent")), "")
    return bound, len(result.evictions), why


@pytest.mark.parametrize(
    ("delay", "created", "evicted_at", "evicts"),
    [
        pytest.param(None, NOW - 60, None, True, id="no delay: it preempts at once"),
        pytest.param(600.0, NOW - 60, None, False, id="within 600 s of its creation: no eviction"),
        pytest.param(30.0, NOW - 60, None, True, id="its 30 s have elapsed: it preempts"),
        pytest.param(30.0, NOW - 60, NOW - 10, False, id="re-armed by its last eviction 10 s ago"),
        pytest.param(0.0, NOW - 60, None, True, id="a delay of 0 is none"),
    ],
)
def test_a_workload_within_its_preemption_delay_makes_no_one_be_evicted(
    delay: float | None, created: float, evicted_at: float | None, evicts: bool
) -> None:
    _, evictions, why = decide(cluster(delay, created=created, evicted_at=evicted_at))
    assert (evictions > 0) == evicts
    if not evicts:
        assert "preemption delay" in why


def test_within_its_delay_it_still_takes_free_capacity() -> None:
    bound, evictions, _ = decide(cluster(600.0, free=1))
    assert (bound, evictions) == (1, 0)


def test_a_podgroup_s_delay_and_last_eviction_are_read_from_kubernetes() -> None:
    pg = wire.convert(
        wire.PodGroup,
        {
            "metadata": {
                "name": "urgent",
                "namespace": "team",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {keys.LAST_EVICTION_ANNOTATION: "2026-01-01T00:05:00Z"},
            },
            "spec": {"minMember": 1, "queue": "team", "preemptionDelay": "10m0s"},
        },
    )
    model = translate.podgroup_of(pg, priority_classes={})
    assert model.preemption_delay == 600.0
    assert model.preemption_delay_end() == model.last_eviction_time + 600.0  # type: ignore[operator]


def test_a_cycle_that_evicts_a_podgroup_s_pods_reports_when() -> None:
    result = schedule(cluster(None), NOW, PREEMPT)
    victims = {e.podgroup for e in result.evictions}
    assert victims
    assert result.last_eviction == dict.fromkeys(victims, NOW)


def test_an_evicted_workload_s_own_delay_is_re_armed_from_its_eviction() -> None:
    """The simulator stores the cycle's stamps as the state service does: the evicted podgroup's last
    eviction is the cycle's time, so its own delay counts again from there and, back to pending, it does
    not preempt its preemptor at once."""
    snapshot = cluster(None)
    low = next(pg for pg in snapshot.podgroups if pg.name == "low")
    low = msgspec.structs.replace(low, preemption_delay=300.0)
    sim = Simulator(snapshot.nodes, snapshot.queues, PREEMPT)
    for pg in (low, *(pg for pg in snapshot.podgroups if pg.name != "low")):
        sim.submit(pg, [p for p in snapshot.pods if p.podgroup == pg.name])
    sim.step(NOW)
    stored = next(pg for pg in sim.snapshot().podgroups if pg.name == "low")
    assert stored.last_eviction_time == NOW
    assert stored.preemption_delay_end() == NOW + 300.0


def test_the_last_eviction_reaches_the_podgroup_s_annotation_and_only_moves_forward() -> None:
    pg = wire.convert(
        wire.PodGroup,
        {
            "metadata": {
                "name": "low",
                "namespace": "team",
                "annotations": {keys.LAST_EVICTION_ANNOTATION: "2026-01-01T00:05:00Z"},
            },
            "spec": {"minMember": 1, "queue": "team"},
        },
    )
    stored = translate.podgroup_of(pg, priority_classes={}).last_eviction_time
    assert stored is not None
    patch = translate.podgroup_annotations_patch(
        pg, last_start_time=None, stale_since=None, last_eviction_time=stored + 60
    )
    assert patch == {"metadata": {"annotations": {keys.LAST_EVICTION_ANNOTATION: "2026-01-01T00:06:00Z"}}}
    unchanged = translate.podgroup_annotations_patch(
        pg, last_start_time=None, stale_since=None, last_eviction_time=stored
    )
    assert unchanged is None
    assert latest(stored, stored - 60) == stored


def test_kairos_explain_says_the_workload_is_within_its_preemption_delay() -> None:
    """What the cycle reports for a delayed workload reaches `kairos explain` with KAI's reason named,
    even when node reasons come with it (those alone would read as "no room")."""
    snapshot = cluster(600.0)
    result = schedule(snapshot, NOW, PREEMPT)
    status = result.podgroups[next(pg.key for pg in snapshot.podgroups if pg.name == "urgent")]
    assert "PreemptionDelayNotElapsed" in status.reasons
    urgent = next(pg for pg in snapshot.podgroups if pg.name == "urgent")
    pod = next(p for p in snapshot.pods if p.podgroup == urgent.name)
    event = PodUnschedulable(
        time=NOW,
        namespace=urgent.namespace,
        podgroup=urgent.name,
        queue=urgent.queue,
        message=status.fit_error or "",
        reasons=list(status.reasons),
    )
    facts = Facts(
        namespace=pod.namespace,
        name=pod.name,
        pod=pod,
        podgroup=urgent,
        members=[pod],
        queue=snapshot.queues[0],
        nodes=len(snapshot.nodes),
        unschedulable=event,
    )
    answer = " ".join(explain(facts).reasons)
    assert "preemption delay" in answer
    assert "PreemptionDelayNotElapsed" in answer
