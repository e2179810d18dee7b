"""The queue service's logic without NATS: the lease state machine over an in-memory KV with expiry, and
the dispatch plan (fair shares, queue order, how pending podgroups become work items)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from services.queue.dispatcher import (
    ALL_ACTIONS,
    PLACE_ACTIONS,
    STALE_ACTION,
    Batch,
    Plan,
    QueueSettings,
    batches,
    plan_cycle,
)
from shared.bus.lease import RENEW_INTERVAL_S, RETRY_INTERVAL_S, SAFETY_MARGIN_S, LeaseKeeper
from shared.contracts import subjects as s
from shared.contracts.messages import LEASES
from shared.core.policy import Policy
from shared.errors import ConfigError, ConflictError
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import PodSet, SubGroupSet


# --- an in-memory lease bucket with the TTL semantics of a JetStream KV bucket ---------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes | None
    revision: int
    written: float


class FakeBucket:
    """Entries expire `ttl` after their last write; create/update/delete are compare-and-set."""

    def __init__(self, clock: Clock, ttl: float = s.LEASE_TTL_S) -> None:
        self.clock = clock
        self.ttl = ttl
        self.entries: dict[str, Entry] = {}
        self.seq = 0
        self.fail = False

    def _live(self, key: str) -> Entry | None:
        entry = self.entries.get(key)
        if entry is not None and self.clock() - entry.written >= self.ttl:
            del self.entries[key]
            return None
        return entry

    def _write(self, key: str, value: bytes) -> int:
        if self.fail:
            raise RuntimeError("nats: timeout")
        self.seq += 1
        self.entries[key] = Entry(key, value, self.seq, self.clock())
        return self.seq

    async def get(self, key: str) -> Entry | None:
        if self.fail:
            raise RuntimeError("nats: timeout")
        return self._live(key)

    async def create(self, key: str, value: bytes) -> int:
        if self._live(key) is not None:
            raise ConflictError(key, 0, -1)
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        live = self._live(key)
        if live is None or live.revision != last:
            raise ConflictError(key, last, -1)
        return self._write(key, value)

    async def delete(self, key: str, last: int | None = None) -> None:
        live = self._live(key)
        if live is not None and last is not None and live.revision != last:
            raise ConflictError(key, last, -1)
        self.entries.pop(key, None)


def keeper(bucket: FakeBucket, holder: str) -> LeaseKeeper:
    return LeaseKeeper(bucket, "default", holder, bucket.clock)


def stored_term(bucket: FakeBucket) -> tuple[str, int]:
    entry = bucket.entries[s.lease_key("default")]
    lease = LEASES.decode("lease", entry.value or b"")
    return lease.holder, lease.term


# --- the lease ------------------------------------------------------------------------------------------
async def test_exactly_one_contender_leads_and_the_other_learns_the_term() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    assert await a.step() is True
    assert await b.step() is False
    assert (a.term, a.describe(), b.describe()) == (1, "leader term 1", "standby")
    assert (b.last_term, b.current_holder) == (1, "a")
    assert stored_term(bucket) == ("a", 1)


async def test_renewals_keep_the_term_and_the_lease_alive() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    for _ in range(10):
        clock.t += a.interval()
        assert await a.step() is True
        clock.t += 0.01
        assert await b.step() is False
    assert stored_term(bucket) == ("a", 1)
    assert a.valid()


async def test_a_standby_takes_over_after_the_ttl_with_the_next_term() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    await b.step()
    # a dies: b keeps polling every retry interval and leads once the entry has expired (a TTL after a's
    # last write).
    polls = 0
    while not await b.step():
        clock.t += b.interval()
        polls += 1
    assert polls == math.ceil(s.LEASE_TTL_S / RETRY_INTERVAL_S)
    assert (b.term, stored_term(bucket)) == (2, ("b", 2))


async def test_a_paused_leader_stops_dispatching_then_steps_down_on_its_failed_renewal() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    await b.step()
    # a is paused (SIGSTOP): before the key expires it already refuses to dispatch, and says so.
    clock.t += s.LEASE_TTL_S - SAFETY_MARGIN_S + 0.1
    assert a.leading
    assert not a.valid()
    assert a.describe() == "lapsed term 1"
    clock.t += SAFETY_MARGIN_S
    assert await b.step() is True
    assert await a.step() is False
    assert a.last_term == 1
    assert b.term == 2
    assert await a.step() is False  # and it stays a standby while b renews
    assert a.last_term == 2
    assert a.current_holder == "b"


async def test_a_leader_survives_renewals_that_run_late_by_less_than_the_margin() -> None:
    """A starved event loop delays renewals; up to TTL - margin between two good writes costs nothing."""
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    late = s.LEASE_TTL_S - SAFETY_MARGIN_S - 0.1
    for _ in range(3):
        clock.t += late
        assert a.valid()
        assert await a.step() is True
        assert await b.step() is False
    assert a.term == 1
    assert a.longest_gap == pytest.approx(late)
    assert late >= RENEW_INTERVAL_S * 3  # the slack the timing was chosen for (measured: see lease.py)


async def test_a_leader_that_cannot_reach_the_bucket_steps_down_before_the_lease_can_expire() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a = keeper(bucket, "a")
    await a.step()
    bucket.fail = True
    deadline = s.LEASE_TTL_S - SAFETY_MARGIN_S
    steps = 0
    while clock.t + RENEW_INTERVAL_S < 100.0 + deadline:
        clock.t += RENEW_INTERVAL_S
        assert await a.step() is True  # failed renewals, still inside the TTL less the margin
        steps += 1
    assert steps >= 3
    clock.t += RENEW_INTERVAL_S
    assert await a.step() is False
    bucket.fail = False
    clock.t = 100.0 + s.LEASE_TTL_S  # the key has expired
    assert await a.step() is True
    assert a.term == 2


async def test_release_hands_over_at_once() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    await b.step()
    await a.release()
    assert not a.leading
    assert await b.step() is True
    assert b.term == 2


async def test_a_restarted_replica_takes_its_own_lease_back_under_a_new_term() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    await keeper(bucket, "a").step()
    again = keeper(bucket, "a")
    assert await again.step() is True
    assert stored_term(bucket) == ("a", 2)


async def test_an_unreadable_lease_is_left_to_expire() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    await bucket.create(s.lease_key("default"), b"\x00garbage")
    a = keeper(bucket, "a")
    assert await a.step() is False
    clock.t += s.LEASE_TTL_S
    assert await a.step() is True


# --- the dispatch plan ---------------------------------------------------------------------------------------
def _gang(
    name: str, queue: str, pods: int, gpus: int, status: PodStatus, created: float
) -> tuple[PodGroup, tuple[Pod, ...]]:
    group = PodGroup(
        name=name,
        namespace="ns",
        queue=queue,
        creation_time=created,
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", pods),)),
    )
    members = tuple(
        Pod(
            name=f"{name}-{i}",
            namespace="ns",
            podgroup=name,
            status=status,
            node="n1" if status == PodStatus.RUNNING else None,
            cpu_millis=100,
            gpu=GpuRequest(devices=gpus),
            creation_time=created,
        )
        for i in range(pods)
    )
    return group, members


def _snapshot() -> Snapshot:
    queues = (
        Queue(name="a", gpu=QueueResource(quota=2)),
        Queue(name="b", gpu=QueueResource(quota=2), creation_index=1),
    )
    running, running_pods = _gang("running", "a", 2, 1, PodStatus.RUNNING, 1.0)
    a2, a2_pods = _gang("a-pending", "a", 1, 1, PodStatus.PENDING, 2.0)
    b1, b1_pods = _gang("b-pending", "b", 1, 1, PodStatus.PENDING, 3.0)
    return Snapshot(
        nodes=(Node(name="n1", cpu_millis=8000, memory_bytes=1e10, gpus=4),),
        pods=(*running_pods, *a2_pods, *b1_pods),
        podgroups=(running, a2, b1),
        queues=queues,
    )


def test_plan_has_every_queues_fair_share_and_pending_podgroups_in_queue_order() -> None:
    plan = plan_cycle(_snapshot(), 1000.0, Policy())
    shares = {e.queue: e for e in plan.fair_shares}
    assert set(shares) == {"a", "b"}
    assert shares["a"].allocated["gpu"] == 2.0
    assert shares["a"].requested["gpu"] == 3.0
    assert shares["b"].deserved["gpu"] == 2.0
    assert shares["a"].fair_share["gpu"] + shares["b"].fair_share["gpu"] == pytest.approx(4.0)
    assert set(shares["a"].fair_share) == {"gpu", "cpu", "memory"}
    # Queue b holds nothing while a is at its quota: b's podgroup comes first, as allocate would take it.
    assert plan.pending == ("b-pending", "a-pending")
    assert plan.stale is False


def test_plan_of_an_idle_cluster_has_nothing_pending() -> None:
    snap = _snapshot()
    running = tuple(p for p in snap.pods if p.podgroup == "running")
    plan = plan_cycle(
        Snapshot(nodes=snap.nodes, pods=running, podgroups=snap.podgroups, queues=snap.queues), 0.0, Policy()
    )
    assert plan.pending == ()


PLAN = Plan(fair_shares=(), pending=("p1", "p2", "p3", "p4", "p5"), stale=False)


def _batches(
    plan: Plan,
    batch: int | None,
    *,
    busy: frozenset[str] = frozenset(),
    whole_busy: bool = False,
    stale_busy: bool = False,
    room: int = 64,
) -> tuple[list[Batch], bool]:
    return batches(plan, batch, busy=busy, whole_busy=whole_busy, stale_busy=stale_busy, room=room)


def test_batch_all_sends_one_whole_cycle_and_nothing_while_one_is_in_flight() -> None:
    assert _batches(PLAN, None) == ([Batch((), ALL_ACTIONS)], False)
    assert _batches(PLAN, None, whole_busy=True) == ([], True)
    assert _batches(PLAN, None, busy=frozenset({"p1"})) == ([], True)
    assert _batches(Plan((), (), False), None) == ([], False)
    assert _batches(Plan((), (), True), None) == ([Batch((), ALL_ACTIONS)], False)


def test_batch_n_splits_in_order_and_holds_back_what_is_in_flight() -> None:
    out, held = _batches(PLAN, 2)
    assert [b.podgroups for b in out] == [("p1", "p2"), ("p3", "p4"), ("p5",)]
    assert all(b.actions == PLACE_ACTIONS for b in out)
    assert not held
    out, held = _batches(PLAN, 2, busy=frozenset({"p2", "p3"}))
    assert [b.podgroups for b in out] == [("p1", "p4"), ("p5",)]
    assert held
    out, held = _batches(PLAN, 2, room=1)
    assert [b.podgroups for b in out] == [("p1", "p2")]
    assert held
    assert _batches(PLAN, 2, whole_busy=True) == ([], True)


def test_only_one_item_in_flight_carries_stale_gang_eviction() -> None:
    stale = Plan((), ("p1", "p2", "p3"), True)
    out, _ = _batches(stale, 2)
    assert [b.actions for b in out] == [ALL_ACTIONS, PLACE_ACTIONS]
    out, held = _batches(stale, 2, stale_busy=True)
    assert [b.actions for b in out] == [PLACE_ACTIONS, PLACE_ACTIONS]
    assert held
    assert _batches(Plan((), (), True), 2) == ([Batch((), (STALE_ACTION,))], False)


def test_settings_parse_options_and_name_the_bad_one() -> None:
    assert QueueSettings.from_options({}).batch is None
    settings = QueueSettings.from_options({"batch": "8", "period": "0.5", "cycles": "admin"})
    assert (settings.batch, settings.period, settings.cycles) == (8, 0.5, "admin")
    for bad, name in (
        ({"batch": "some"}, "batch"),
        ({"batch": "0"}, "batch"),
        ({"period": "-1"}, "period"),
        ({"cycles": "never"}, "cycles"),
        ({"colour": "red"}, "colour"),
        ({"window": "0"}, "window"),
    ):
        with pytest.raises(ConfigError, match=name):
            QueueSettings.from_options(bad)


def test_podgroups_bounded_by_queue_totals_go_one_item_at_a_time() -> None:
    plan = Plan((), ("p1", "g1", "p2", "g2", "g3"), False, frozenset({"g1", "g2", "g3"}))
    out, held = batches(plan, 2, busy=frozenset(), whole_busy=False, stale_busy=False, room=10)
    assert [b.podgroups for b in out] == [("g1", "g2"), ("p1", "p2")]
    assert held  # g3 waits for the guarded item in flight
    out, held = batches(
        plan, 2, busy=frozenset(), whole_busy=False, stale_busy=False, room=10, guarded_busy=True
    )
    assert [b.podgroups for b in out] == [("p1", "p2")]
    assert held
