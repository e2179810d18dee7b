"""Spec: the state replica's snapshots kept up to date from the keys each write changed
(`shared.ledger_view.KeptView`, `StateReplica.snapshot` and `shard_snapshot`) are the ones computed afresh
(`scheduling_view` of `objects()`, `in_pool` of that), whatever pods, podgroups, nodes, queues, shards and
ledger entries (reservations added, moved between nodes, held twice, holding DRA devices, removed) were
written and deleted before; and a call after which nothing changed hands back the very same tuples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import (
    NodeLedger,
    NodeRecord,
    PodGroupRecord,
    PodRecord,
    QueueRecord,
    Reservation,
    ShardRecord,
    encode,
)
from shared.core.node_pool import in_pool
from shared.kube.scheduling_shard import ShardConfig
from shared.ledger_view import live_pools, scheduling_view
from shared.model import PodStatus, Snapshot
from shared.model.dra import ClaimHold, DeviceResult
from tests.builders import node, pod, podgroup, queue

POOL_LABEL = "kai.scheduler/node-pool"
NODES = ("n1", "n2", "n3")
PODS = ("a", "b", "c", "d")
GROUPS = ("g1", "g2")
SHARDS = ("default", "blue")
labels = st.sampled_from([{}, {POOL_LABEL: "blue"}])

pod_put = st.builds(
    lambda name, uid, group, status, where: (
        "state",
        s.pod_key("ns", name),
        PodRecord(
            pod=pod(
                name,
                group,
                namespace="ns",
                uid=f"{name}-{uid}",
                status=status,
                node=where if status != PodStatus.PENDING else None,
            )
        ),
    ),
    st.sampled_from(PODS),
    st.sampled_from(["1", "2"]),
    st.sampled_from(GROUPS),
    st.sampled_from([PodStatus.PENDING, PodStatus.RUNNING]),
    st.sampled_from(NODES),
)
group_put = st.builds(
    lambda name, lab: (
        "state",
        s.podgroup_key("ns", name),
        PodGroupRecord(podgroup=podgroup(name, "team", namespace="ns", labels=lab)),
    ),
    st.sampled_from(GROUPS),
    labels,
)
node_put = st.builds(
    lambda name, lab: ("state", s.node_key(name), NodeRecord(node=node(name, labels=lab))),
    st.sampled_from(NODES),
    labels,
)
queue_put = st.builds(
    lambda name, lab: ("state", s.queue_key(name), QueueRecord(queue=queue(name, labels=lab))),
    st.sampled_from(["team", "dept"]),
    labels,
)
shard_put = st.builds(
    lambda name, value: (
        "state",
        s.shard_key(name),
        ShardRecord(shard=name, config=ShardConfig(name=name, partition_label_value=value)),
    ),
    st.sampled_from(SHARDS),
    st.sampled_from(["", "blue"]),
)
DEVICES = (ClaimHold(claim="ns/c", devices=(DeviceResult(request="r", driver="d", pool="p", device="x"),)),)
reservation = st.builds(
    lambda name, uid, groups, devices: Reservation(
        pod=f"{name}-{uid}", podgroup="g1", gpu_groups=groups, devices=DEVICES if devices else ()
    ),
    st.sampled_from(PODS),
    st.sampled_from(["1", "2"]),
    st.sampled_from([(), ("0",)]),
    st.booleans() | st.just(False),
)
ledger_put = st.builds(
    lambda name, held: (
        "ledger",
        s.ledger_node_key(name),
        NodeLedger(node=name, pods={r.pod: r for r in held}),
    ),
    st.sampled_from(NODES),
    st.lists(reservation, max_size=3),
)
state_keys = (
    [s.pod_key("ns", p) for p in PODS]
    + [s.podgroup_key("ns", g) for g in GROUPS]
    + [s.node_key(n) for n in NODES]
    + [s.shard_key(n) for n in SHARDS]
)
delete = st.one_of(
    st.tuples(st.just("state"), st.sampled_from(state_keys), st.none()),
    st.tuples(st.just("ledger"), st.sampled_from([s.ledger_node_key(n) for n in NODES]), st.none()),
)
writes = st.lists(
    st.one_of(pod_put, pod_put, group_put, node_put, queue_put, shard_put, ledger_put, ledger_put, delete),
    max_size=40,
)
"""(bucket, key, record): put the record under the key; record None: delete the key."""


def fresh(replica: StateReplica) -> Snapshot:
    return scheduling_view(
        replica.objects(),
        replica.ledger.values(),
        live_pools(replica.pools.values(), replica.claims.values()),
    )


def apply(replica: StateReplica, step: int, write: tuple[str, str, object]) -> None:
    which, key, record = write
    if record is None:
        replica._apply(which, key, None, step, "DEL")
    else:
        replica._apply(which, key, encode(record), step, "PUT")  # type: ignore[arg-type]


@settings(max_examples=300)
@given(writes)
def test_the_kept_snapshots_are_the_ones_computed_afresh_after_every_write(
    steps: list[tuple[str, str, object]],
) -> None:
    replica = StateReplica(None)  # type: ignore[arg-type]
    for step, write in enumerate(steps, 1):
        apply(replica, step, write)
        view = fresh(replica)
        assert replica.snapshot() == view
        for shard in SHARDS:
            pool = replica.pool(shard)
            assert replica.shard_snapshot(shard) == (Snapshot() if pool is None else in_pool(view, pool))


@given(writes)
def test_a_snapshot_after_which_nothing_changed_hands_back_the_same_tuples(
    steps: list[tuple[str, str, object]],
) -> None:
    replica = StateReplica(None)  # type: ignore[arg-type]
    for step, write in enumerate(steps, 1):
        apply(replica, step, write)
        held = [(pod, r) for e in replica.ledger.values() for pod, r in e.pods.items()]
        if any(r.devices for _, r in held) or len({pod for pod, _ in held}) < len(held):
            continue  # DRA holds, a pod reserved twice: the whole computation, each call anew
        before = replica.snapshot()
        assert replica.snapshot().pods is before.pods
        for shard in SHARDS:
            shard_before = replica.shard_snapshot(shard)
            shard_again = replica.shard_snapshot(shard)
            for kind in ("nodes", "pods", "podgroups", "queues"):
                assert getattr(shard_again, kind) is getattr(shard_before, kind)


def test_a_pod_the_ledger_reserves_shows_bound_on_its_node_until_the_reservation_moves() -> None:
    replica = StateReplica(None)  # type: ignore[arg-type]
    apply(
        replica, 1, ("state", s.pod_key("ns", "a"), PodRecord(pod=pod("a", "g1", namespace="ns", uid="a-1")))
    )
    apply(
        replica, 2, ("ledger", s.ledger_node_key("n1"), NodeLedger(node="n1", pods={"a-1": reserved("a-1")}))
    )
    assert [(p.status, p.node) for p in replica.snapshot().pods] == [(PodStatus.BOUND, "n1")]
    apply(replica, 3, ("ledger", s.ledger_node_key("n1"), None))
    apply(
        replica, 4, ("ledger", s.ledger_node_key("n2"), NodeLedger(node="n2", pods={"a-1": reserved("a-1")}))
    )
    assert [(p.status, p.node) for p in replica.snapshot().pods] == [(PodStatus.BOUND, "n2")]
    assert replica.snapshot() == fresh(replica)


def reserved(uid: str) -> Reservation:
    return Reservation(pod=uid, podgroup="g1")
