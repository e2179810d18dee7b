"""Spec: state replicas that divide the partitions between them write, together, exactly what one replica
writes: the same state records and the same binders' ledger, for any split of the partitions over the
replicas, any order of changes, partitions handed from one replica to another between two flushes, and
partitions left with no owner for a while (their owner killed, the lease not yet taken over) while their
pods end, are deleted or move node: the replica that gains one releases what those pods held (`services.state.sources.partitioned_writer`, over in-memory buckets; the leases and fences are
tests/integration/test_state_partition_owners.py's)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.sources.kv_objects import Change, Obj, key_of
from services.state.sources.kv_writer import StateWriter, reservation_of
from services.state.sources.partitioned_writer import PartitionedWriter
from services.state.sources.partitions import key_partition, partitions
from shared.bus.kv import Entry
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, STATE_RECORDS, NodeLedger, PodClaim, encode
from shared.errors import ConflictError
from shared.model import Node, Pod, PodStatus

COUNT = 4
NODES = ("n0", "n1")
PODS = tuple((f"ns-{i % 2}", f"pod-{i}") for i in range(8))


class MemoryBucket:
    """A KV bucket's calls the writer makes, in memory: revisions, compare-and-set, listing."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self.seq = 0
        self.raw = self
        self.writes = 0

    async def get(self, key: str) -> Entry | None:
        found = self.data.get(key)
        return None if found is None else Entry(key=key, value=found[0], revision=found[1], deleted=False)

    async def put(self, key: str, value: bytes) -> int:
        self.seq += 1
        self.writes += 1
        self.data[key] = (value, self.seq)
        return self.seq

    async def update(self, key: str, value: bytes, last: int) -> int:
        current = self.data[key][1] if key in self.data else 0
        if current != last:
            raise ConflictError(key, last, current)
        return await self.put(key, value)

    async def delete(self, key: str, last: int | None = None) -> None:
        current = self.data[key][1] if key in self.data else 0
        if last is not None and current != last:
            raise ConflictError(key, last, current)
        self.seq += 1
        self.writes += 1
        self.data.pop(key, None)

    async def keys(self) -> list[str]:
        return sorted(self.data)

    async def status(self) -> Any:
        return SimpleNamespace(stream_info=SimpleNamespace(state=SimpleNamespace(last_seq=self.seq)))


@dataclass
class Buckets:
    state: MemoryBucket = field(default_factory=MemoryBucket)
    ledger: MemoryBucket = field(default_factory=MemoryBucket)

    def records(self) -> dict[str, bytes]:
        return {key: value for key, (value, _) in self.state.data.items()}

    def ledger_records(self) -> dict[str, object]:
        """The ledger decoded (a node's reservations compare as a mapping, whatever order wrote them)."""
        found: dict[str, object] = {}
        for key, (value, _) in self.ledger.data.items():
            record = LEDGER_RECORDS.decode(key, value)
            found[key] = record.pods if isinstance(record, NodeLedger) else record
        return found


class Replica:
    """What a `PartitionedWriter` reads of its replica: the buckets' records, caught up at once."""

    def __init__(self, buckets: Buckets) -> None:
        self.bus = buckets
        self.buckets = buckets

    @property
    def records(self) -> dict[str, Any]:
        return {key: STATE_RECORDS.decode(key, value) for key, value in self.buckets.records().items()}

    @property
    def revision(self) -> int:
        return self.buckets.state.seq

    async def wait_for(self, revision: int) -> None:  # noqa: ARG002 -- caught up at once
        return None

    def _ledger_records(self) -> dict[str, tuple[object, int]]:
        data = self.buckets.ledger.data
        return {key: (LEDGER_RECORDS.decode(key, value), revision) for key, (value, revision) in data.items()}

    @property
    def ledger(self) -> dict[str, NodeLedger]:
        return {k: r for k, (r, _) in self._ledger_records().items() if isinstance(r, NodeLedger)}

    @property
    def claims(self) -> dict[str, PodClaim]:
        return {k: r for k, (r, _) in self._ledger_records().items() if isinstance(r, PodClaim)}

    @property
    def key_revisions(self) -> dict[str, int]:
        return {k: revision for k, (_, revision) in self._ledger_records().items()}

    def node_ledger(self, node: str) -> tuple[NodeLedger | None, int]:
        """The watched copy of a node's ledger, caught up (the writer's first try starts from it)."""
        found = self.buckets.ledger.data.get(s.ledger_node_key(node))
        if found is None:
            return None, 0
        record = LEDGER_RECORDS.decode(s.ledger_node_key(node), found[0])
        return (record if isinstance(record, NodeLedger) else None), found[1]


ACTIONS = ("create", "bind-n0", "bind-n1", "run", "finish", "delete")


def step(cluster: dict[str, Obj], pod: tuple[str, str], action: str) -> Change | None:
    """The change `action` makes to `pod` in `cluster` (None: it does not apply)."""
    namespace, name = pod
    key = key_of(Pod(name=name, namespace=namespace, podgroup=f"pg-{name}"))
    before = cluster.get(key)
    after: Pod | None
    if action == "create":
        if before is not None:
            return None
        after = Pod(name=name, namespace=namespace, podgroup=f"pg-{name}", status=PodStatus.PENDING)
    elif not isinstance(before, Pod):
        return None
    elif action.startswith("bind-"):
        after = Pod(**{**_fields(before), "status": PodStatus.BOUND, "node": action.removeprefix("bind-")})
    elif action == "run":
        after = Pod(**{**_fields(before), "status": PodStatus.RUNNING})
    elif action == "finish":
        after = Pod(**{**_fields(before), "status": PodStatus.SUCCEEDED})
    else:
        after = None
    if after is None:
        cluster.pop(key)
    else:
        cluster[key] = after
    return Change(key, before, after)


async def binder_claims(buckets: Buckets, change: Change) -> None:
    """What a binder writes before a pod shows bound: its claim, and its reservation on the node."""
    pod = change.after
    if not isinstance(pod, Pod) or pod.status != PodStatus.BOUND or pod.node is None:
        return
    if isinstance(change.before, Pod) and change.before.node == pod.node:
        return
    await buckets.ledger.put(
        s.ledger_claim_key(pod.key), encode(PodClaim(pod=pod.key, node=pod.node, proposal="p"))
    )
    key = s.ledger_node_key(pod.node)
    found = buckets.ledger.data.get(key)
    ledger = LEDGER_RECORDS.decode(key, found[0]) if found else NodeLedger(node=pod.node, pods={})
    assert isinstance(ledger, NodeLedger)
    pods = {**ledger.pods, pod.key: reservation_of(pod)}
    await buckets.ledger.put(key, encode(NodeLedger(node=pod.node, pods=pods)))


def flushed(steps: list[Change]) -> list[Change]:
    """One change per key, as the mirror's flush gives them: the first `before`, the last `after`."""
    first: dict[str, Change] = {}
    last: dict[str, Change] = {}
    for change in steps:
        first.setdefault(change.key, change)
        last[change.key] = change
    merged = [Change(key, first[key].before, last[key].after) for key in first]
    return [c for c in merged if c.before != c.after]


def _fields(pod: Pod) -> dict[str, Any]:
    return {f: getattr(pod, f) for f in pod.__struct_fields__}


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("batch"), st.lists(st.tuples(st.sampled_from(PODS), st.sampled_from(ACTIONS)), max_size=6)
        ),
        st.tuples(st.just("move"), st.tuples(st.sampled_from(partitions(COUNT)), st.integers(0, 2))),
        st.tuples(st.just("orphan"), st.tuples(st.sampled_from(partitions(COUNT)), st.just(0))),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    split=st.lists(st.integers(0, 2), min_size=COUNT + 1, max_size=COUNT + 1),
    replicas=st.integers(1, 3),
    ops=operations,
)
def test_replicas_dividing_the_partitions_write_what_one_replica_writes(
    split: list[int], replicas: int, ops: list[tuple[str, Any]]
) -> None:
    asyncio.run(_divided_equals_single(split, replicas, ops))


async def _divided_equals_single(split: list[int], replicas: int, ops: list[tuple[str, Any]]) -> None:
    cluster: dict[str, Obj] = {
        key_of(n): n
        for n in (Node(name=name, cpu_millis=8000.0, memory_bytes=float(2**34)) for name in NODES)
    }
    one, shared = Buckets(), Buckets()
    single = StateWriter(one, Counters(), source="kube")  # type: ignore[arg-type]
    await single.sync(dict(cluster))
    writers = [
        PartitionedWriter(Replica(shared), Counters(), COUNT, lambda: cluster)  # type: ignore[arg-type]
        for _ in range(replicas)
    ]
    owner = {p: split[i] % replicas for i, p in enumerate(partitions(COUNT))}
    for p, r in owner.items():
        await writers[r].gain(p, None, 0)  # type: ignore[arg-type]
    ownerless: set[str] = set()
    stretches = 0
    for kind, what in ops:
        if kind == "orphan":  # its owner killed: no one writes it until a replica gains it ("move")
            p = what[0]
            await writers[owner[p]].lose(p)
            ownerless.add(p)
            stretches += 1
            continue
        if kind == "move":
            p, to = what[0], what[1] % replicas
            await writers[owner[p]].lose(p)
            ownerless.discard(p)
            owner[p] = to
            await writers[to].gain(p, None, 0)  # type: ignore[arg-type]
            continue
        changes = flushed([c for c in (step(cluster, pod, action) for pod, action in what) if c is not None])
        for change in changes:  # the binder reserved the node and claimed the pod before it bound it
            await binder_claims(one, change)
            await binder_claims(shared, change)
        await single.write(changes)
        for writer in writers:  # every replica sees every change; each writes its own partitions'
            await writer.write(changes)
    for p in sorted(ownerless):  # the lease taken over at last
        await writers[owner[p]].gain(p, None, 0)  # type: ignore[arg-type]
    assert shared.records() == one.records()
    if stretches:  # a record changed twice while no one wrote it is written once, by the gain's sync
        assert shared.state.writes <= one.state.writes
    else:
        assert shared.state.writes == one.state.writes, "every record written once, by its partition's owner"
    assert shared.ledger_records() == one.ledger_records()
    owned = [p for w in writers for p in w.owned()]
    assert sorted(owned) == sorted(partitions(COUNT)), "every partition owned once"


@pytest.mark.parametrize("end", ["finish", "delete", "bind-n1"], ids=["finished", "deleted", "moved node"])
@pytest.mark.parametrize("made_in_the_stretch", [False, True], ids=["recorded before", "made meanwhile"])
def test_a_pod_that_ends_while_its_partition_has_no_owner_has_what_it_held_released_at_the_gain(
    end: str, made_in_the_stretch: bool
) -> None:
    pod = PODS[0]
    partition = key_partition(s.pod_key(*pod), COUNT)
    made = ("batch", [(pod, "create"), (pod, "bind-n0")])
    orphan = ("orphan", (partition, 0))
    ops: list[tuple[str, Any]] = [
        *([orphan, made] if made_in_the_stretch else [made, orphan]),
        ("batch", [(pod, end)]),
        ("move", (partition, 1)),
    ]
    asyncio.run(_divided_equals_single([0] * (COUNT + 1), 2, ops))
