"""Spec: the ledger's reconcile from a watched copy (`StateWriter(ledger_copy=...)`, the cluster partition's
owner's) never takes out the reservation of a pod that holds the node, nor a pending pod's (a bind in
flight), and keeps the reservation of every pod that holds a node, whatever the copy is behind by; it reads
no node's ledger where it has nothing to release nor keep (a reservation the copy has not seen yet is the
next reconcile's, or its pod's release's: `services.state.sources.kv_writer`)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.sources.kv_writer import LedgerCopy, StateWriter, holds, reservation_of
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, NodeLedger, PodClaim, encode
from shared.model import Pod, PodStatus
from tests.unit.test_state_partitions_split import Buckets, MemoryBucket

NODES = ("n0", "n1")
NAMES = tuple(f"pod-{i}" for i in range(6))
FATES = ("gone", "pending", "bound-n0", "bound-n1", "running-n0", "succeeded-n1")


class CountedBucket(MemoryBucket):
    """A bucket that counts the reads of its keys."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get(self, key: str) -> Any:
        self.reads += 1
        return await super().get(key)


def pod_of(name: str, fate: str) -> Pod | None:
    if fate == "gone":
        return None
    status, _, node = fate.partition("-")
    return Pod(
        name=name,
        namespace="ns",
        podgroup="g",
        status=PodStatus(status.capitalize()) if status != "bound" else PodStatus.BOUND,
        node=node or None,
    )


def ledger_of(node: str, names: list[str]) -> NodeLedger:
    pods = {f"ns/{n}": reservation_of(Pod(name=n, namespace="ns", podgroup="g", node=node)) for n in names}
    return NodeLedger(node=node, pods=pods)


def writer_over(buckets: Buckets, ledger_copy: LedgerCopy) -> StateWriter:
    """A Kubernetes source's writer over in-memory `buckets` whose watched copy (every ledger, and each
    node's) is `ledger_copy`."""

    def view(node: str) -> tuple[NodeLedger | None, int]:
        return ledger_copy()[0][s.ledger_node_key(node)]

    return StateWriter(
        buckets,  # type: ignore[arg-type]
        Counters(),
        source="kube",
        ledger_view=view,
        ledger_copy=ledger_copy,
    )


reservations = st.fixed_dictionaries({node: st.lists(st.sampled_from(NAMES), unique=True) for node in NODES})


@settings(max_examples=80)
@given(
    fates=st.fixed_dictionaries({name: st.sampled_from(FATES) for name in NAMES}),
    bucket=reservations,
    copy=reservations,
    copy_current=st.booleans(),
)
def test_a_reconcile_from_a_copy_never_removes_the_reservation_of_a_pod_that_holds_the_node(
    fates: dict[str, str], bucket: dict[str, list[str]], copy: dict[str, list[str]], copy_current: bool
) -> None:
    asyncio.run(_reconciled(fates, bucket, copy, copy_current))


async def _reconciled(
    fates: dict[str, str], bucket: dict[str, list[str]], copy: dict[str, list[str]], copy_current: bool
) -> None:
    buckets = Buckets(ledger=CountedBucket())
    for node, names in bucket.items():
        await buckets.ledger.put(s.ledger_node_key(node), encode(ledger_of(node, names)))
    # The copy: what the bucket held some time ago (any reservations), under the bucket's revisions when
    # it is current, under older ones when it is behind.
    copied = {
        s.ledger_node_key(node): (
            ledger_of(node, bucket[node] if copy_current else names),
            buckets.ledger.data[s.ledger_node_key(node)][1] if copy_current else 0,
        )
        for node, names in copy.items()
    }
    claims: dict[str, PodClaim] = {}

    def ledger_copy() -> tuple[dict[str, tuple[NodeLedger, int]], dict[str, PodClaim]]:
        return dict(copied), dict(claims)

    pods = [p for p in (pod_of(name, fate) for name, fate in fates.items()) if p is not None]
    await writer_over(buckets, ledger_copy).reconcile(pods)
    after = buckets.ledger_records()
    for pod in pods:
        node = holds(pod)
        if node is not None:
            assert pod.key in after[s.ledger_node_key(node)], f"{pod.key} holds {node}: its reservation stays"
        if pod.status == PodStatus.PENDING:
            for node, names in bucket.items():
                if pod.name in names:
                    assert pod.key in after[s.ledger_node_key(node)], "a bind in flight keeps its reservation"


def test_a_reconcile_from_a_copy_reads_only_the_node_ledgers_it_has_a_reservation_to_keep_on() -> None:
    # n1 has nothing to release nor keep: not read. n0 keeps the running pod's reservation, which a copy
    # behind may still show after it was taken out: read once to check.
    async def run() -> int:
        buckets = Buckets(ledger=CountedBucket())
        bound = Pod(name="p", namespace="ns", podgroup="g", status=PodStatus.RUNNING, node="n0")
        for node in NODES:
            await buckets.ledger.put(s.ledger_node_key(node), encode(ledger_of(node, [])))
        key = s.ledger_node_key("n0")
        await buckets.ledger.put(key, encode(NodeLedger(node="n0", pods={bound.key: reservation_of(bound)})))

        def ledger_copy() -> tuple[dict[str, tuple[NodeLedger, int]], dict[str, PodClaim]]:
            ledgers = {}
            for k, (value, revision) in buckets.ledger.data.items():
                record = LEDGER_RECORDS.decode(k, value)
                assert isinstance(record, NodeLedger)
                ledgers[k] = (record, revision)
            return ledgers, {}

        await writer_over(buckets, ledger_copy).reconcile([bound])
        ledger = buckets.ledger
        assert isinstance(ledger, CountedBucket)
        return ledger.reads

    assert asyncio.run(run()) == 1
