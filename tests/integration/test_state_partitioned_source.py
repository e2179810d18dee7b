"""Two state replicas with `partitions=4` on kubesim and a real nats-server (`services.state.sources.partitioned_source`):
both mirror the cluster, each writes the keys of its own partitions, no key is written twice in a row with
the same record; one crashes (its leases left to expire), the other takes its partitions and writes what was
created meanwhile; the cluster partition's owner runs the controllers."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict

import pytest

from services.state.sources.partitioned_source import PartitionedKube
from services.state.sources.partitions import CLUSTER, key_partition, owners, partitions
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodBound
from shared.kubeapi.paths import create_object
from tests.integration.test_state_fencing import (  # noqa: F401 -- `world` is a fixture
    OPTIONS,
    World,
    create_pod,
    until,
    world,
)
from tests.integration.test_state_partitioned_writer import pair_that_spreads

pytestmark = pytest.mark.slow

COUNT = 4
TAKEOVER = 120.0
"""Generous: a takeover waits for the dead replica's presence and leases to expire."""


async def bind(world: World, pods: list[str]) -> None:  # noqa: F811 -- `world` is an argument here
    """What a binder publishes once it bound `pods`: a pod-bound event each."""
    for pod in pods:
        event = PodBound(
            time=1.0, namespace="default", pod=pod, podgroup=f"pg-{pod}", queue="q", node="node-0"
        )
        await world.bus.js.publish(s.event("pod-bound", f"default/{pod}"), EVENT_ENCODER.encode(event))


async def create_ungrouped(world: World, name: str) -> None:  # noqa: F811 -- `world` is an argument here
    """A pod of kai-scheduler that names no PodGroup: the pod-grouper's work."""
    await create_object(
        world.kube,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"kai.scheduler/queue": "default-queue"},
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {"cpu": "1"}}}],
            },
        },
    )


async def scheduled(world: World) -> Counter[str]:  # noqa: F811 -- `world` is an argument here
    """How many Scheduled Events each pod has."""
    body = json.loads(await world.kube.call("list events", world.kube.core.list_namespaced_event, "default"))
    return Counter(
        item["involvedObject"]["name"] for item in body["items"] if item.get("reason") == "Scheduled"
    )


async def start(world: World, name: str) -> PartitionedKube:  # noqa: F811 -- `world` is an argument here
    replica = await world.replica(name)
    source = PartitionedKube(replica.ctx, replica.replica, world.kubeconfig, OPTIONS, COUNT)
    await source.prepare()
    source.start()
    world.stack.push_async_callback(source.stop)
    return source


async def test_two_replicas_write_their_own_partitions_and_one_crashed_has_its_taken_over(
    world: World,  # noqa: F811 -- the fixture imported above
) -> None:
    # Every put of the state bucket, as a watcher of the stream sees it.
    puts: dict[str, list[bytes]] = defaultdict(list)

    async def seen(msg: object) -> None:
        subject: str = msg.subject  # type: ignore[attr-defined]
        puts[subject.removeprefix(f"$KV.{s.STATE_BUCKET}.")].append(msg.data)  # type: ignore[attr-defined]

    sub = await world.bus.nc.subscribe(f"$KV.{s.STATE_BUCKET}.>", cb=seen)
    names = pair_that_spreads()
    table = {p: who or "" for p, who in owners(COUNT, names).items()}
    replicas = {name: await start(world, name) for name in names}

    async def spread() -> bool:
        # The cluster partition's controllers start after its writer: waited for too.
        return all(
            r.writer is not None
            and {p for p in partitions(COUNT) if table[p] == name} == r.writer.owned()
            and (r.owner is not None) == (table[CLUSTER] == name)
            for name, r in replicas.items()
        )

    await until("each replica owning the table's partitions", spread)
    pods = [f"job-{i}" for i in range(12)]
    for pod in pods:
        await create_pod(world.kube, pod)

    async def all_in_kv() -> bool:
        return all(s.pod_key("default", pod) in world.observer.records for pod in pods)

    await until("every pod in KV", all_in_kv)
    for name, r in replicas.items():
        assert r.ctx.counters["state_writes"] > 0, f"{name} wrote its partitions"
        assert r.ctx.detail.startswith("source=kube (partitions ")
    # The cluster controllers run where the cluster partition is owned, and there only.
    assert [name for name, r in replicas.items() if r.owner is not None] == [table[CLUSTER]]

    # Pods naming no PodGroup are grouped by their partitions' owners, each once.
    loose = [f"loose-{i}" for i in range(12)]
    for pod in loose:
        await create_ungrouped(world, pod)

    async def grouped() -> bool:
        records = world.observer.objects().pods
        return all(any(p.name == pod and p.podgroup for p in records) for pod in loose)

    await until("every loose pod grouped", grouped)
    for name, r in replicas.items():
        assert r.ctx.counters["pods_grouped"] > 0, f"{name} grouped its partitions' pods"
    assert sum(r.ctx.counters["pods_grouped"] for r in replicas.values()) == len(loose)
    # Their pod-bound events are written back by their partitions' owners, once each.
    await bind(world, pods)

    async def events_written() -> bool:
        return set((await scheduled(world)).keys()) >= set(pods)

    await until("a Scheduled Event on every pod", events_written)
    assert all(n == 1 for n in (await scheduled(world)).values())
    for name, r in replicas.items():
        assert r.ctx.counters["kube_events"] > 0, f"{name} wrote back its partitions' events"
    doubled = [key for key, values in puts.items() if any(a == b for a, b in itertools.pairwise(values))]
    assert all(puts[s.pod_key("default", pod)] for pod in pods), "the watcher saw the pods' puts"
    assert doubled == [], "a record written twice in a row"

    # The replica that does not own the cluster partition crashes: it writes nothing more, its leases and
    # presence are left to expire.
    victim_name = next(name for name in names if name != table[CLUSTER])
    victim, survivor = replicas[victim_name], replicas[table[CLUSTER]]
    assert victim.partitions is not None
    assert victim.source is not None
    await victim.partitions.stop(graceful=False)
    await victim.source.stop()
    later = [f"late-{i}" for i in range(12)]
    for pod in later:
        await create_pod(world.kube, pod)
    orphaned = [pod for pod in later if table[key_partition(s.pod_key("default", pod), COUNT)] == victim_name]
    assert orphaned, "some of the later pods are in the crashed replica's partitions"

    await bind(world, later)

    async def taken_over() -> bool:
        assert survivor.writer is not None
        events = await scheduled(world)
        return (
            survivor.writer.owned() == frozenset(partitions(COUNT))
            and all(s.pod_key("default", pod) in world.observer.records for pod in later)
            and all(events[pod] for pod in later)
        )

    # The victim's presence and leases expire first (`LEASE_TTL_S` each after its last beat), then the
    # survivor contends for its partitions once they stayed free (`TAKEOVER_DELAY_S`): about 11 s on a quiet
    # machine, several times that on a loaded one.
    await until(
        "the survivor owning everything, every later pod in KV with its Event", taken_over, within=TAKEOVER
    )
    assert all(n == 1 for n in (await scheduled(world)).values()), "no Event written twice"
    await sub.unsubscribe()
