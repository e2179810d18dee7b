"""The stack on a 3-server JetStream cluster (`start_stack(nats_cluster=3)`, `kairos up --nats-cluster 3`),
as deploy/ runs NATS: every stream and KV bucket has 3 replicas, and SIGKILL of one server while kubectl's
pods wait to be scheduled loses nothing. The services hold every server's URL and move to another; the
supervisor starts the killed server again on its ports and store. Every pod ends bound exactly once.

Two servers are killed in turn: one that leads no replica of the work stream (a follower's death), and
the leader of KAIROS_WORK (publishes stop until a leader is elected; the restarted server, whose log is
complete, may win that election back, so which server leads afterwards is not specified).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from shared.bus.connection import connect
from shared.contracts import subjects as s
from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubesim_stack
from tests.e2e.supervised import bound_once, running_pods, supervised

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PODS = 16
SERVERS = 3


async def replicas_and_leader(url: str) -> tuple[dict[str, int], str, dict[str, bool]]:
    """Each stream's replica count (KV buckets are streams `KV_<bucket>`), who leads KAIROS_WORK, and
    whether each of its other peers is online and caught up with the leader."""
    bus = await connect(url, "nats-cluster-test")
    try:
        counts: dict[str, int] = {}
        for info in await bus.js.streams_info():
            counts[str(info.config.name)] = info.config.num_replicas or 1
        work = await bus.js.stream_info(s.WORK_STREAM)
        assert work.cluster is not None
        assert work.cluster.leader, work.cluster
        peers = {str(p.name): bool(p.current) and not p.offline for p in work.cluster.replicas or []}
        return counts, work.cluster.leader, peers
    finally:
        await bus.close()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("victim", ["follower", "leader"])
def test_a_nats_server_killed_under_load_loses_no_pod(tmp_path: Path, victim: str) -> None:
    lines: list[str] = []
    with kubesim_stack(tmp_path / "kairos", nodes=4, gpus_per_node=8, nats_cluster=SERVERS) as stack:
        counts, leader, _ = asyncio.run(replicas_and_leader(stack.url))
        streams = {s.WORK_STREAM, s.PROPOSAL_STREAM, s.EVENTS_STREAM, s.OUTCOME_STREAM}
        streams |= {f"KV_{b}" for b in (s.STATE_BUCKET, s.LEDGER_BUCKET, s.LEASE_BUCKET, s.USAGE_BUCKET)}
        assert {name: counts.get(name) for name in streams} == dict.fromkeys(streams, SERVERS)

        names = [f"kairos-{i}" for i in range(SERVERS)]  # NatsCluster's server_name per node
        index = names.index(leader) if victim == "leader" else (names.index(leader) + 1) % SERVERS
        with supervised(stack, lines) as supervisor:
            half = PODS // 2
            apply(stack, *(manifests.pod(f"load-{i:02d}", gpus="1") for i in range(half)))
            stack.nats_nodes[f"nats-{index}"].process.send_signal(signal.SIGKILL)
            # The rest arrive while the server is down or coming back.
            apply(stack, *(manifests.pod(f"load-{i:02d}", gpus="1") for i in range(half, PODS)))

            deadline = time.monotonic() + 180
            while len(placed := running_pods(stack)) < PODS:
                assert time.monotonic() < deadline, f"{len(placed)} of {PODS} pods running; {lines}"
                time.sleep(1)

            statuses = bound_once(stack, PODS, "nats-cluster-test")
            assert sum(statuses.values()) == PODS
            while supervisor.records[f"nats-{index}"].count < 1:
                assert time.monotonic() < deadline, lines
                time.sleep(0.5)
        record = supervisor.records[f"nats-{index}"]
        assert (record.count, record.last_exit) == (1, -signal.SIGKILL), lines
        others = [f"nats-{i}" for i in range(SERVERS) if i != index]
        assert all(supervisor.records[name].count == 0 for name in others), lines
        # The restarted server rejoined: the streams still have 3 replicas, the work stream a leader and
        # two peers online and caught up with it.
        rejoined = time.monotonic() + 60
        while True:
            counts, now_leads, peers = asyncio.run(replicas_and_leader(stack.url))
            assert {name: counts.get(name) for name in streams} == dict.fromkeys(streams, SERVERS)
            if len(peers) == SERVERS - 1 and all(peers.values()):
                break
            assert time.monotonic() < rejoined, f"KAIROS_WORK led by {now_leads}, peers {peers}"
            time.sleep(1)
        assert {now_leads, *peers} == set(names)
