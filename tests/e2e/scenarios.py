"""The scenarios the end-to-end tests play through the bus against a stack's in-memory cluster, built once
from `shared.model.builders`.

`team_queues(teams, gpu_quota)`: an unbounded `org` queue over one queue per team with a GPU quota.
`reclaim(client, settle)`: on one node of 4 GPUs, team-a borrows the whole node with four one-pod jobs
(a-0 ... a-3) beyond its quota of 2; once they run, team-b, under its own quota of 2, submits the two-pod
gang b-job, which binds only once two of team-a's pods are evicted (the authenticated stack's test, the
tracing test). `wait_running(client, prefix, count, settle)` waits until that many pods named `prefix...`
run, as the state service's snapshot shows them. `apply(client, request)` applies and asserts it was taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shared.bus.client import BusClient
from shared.contracts.messages import ApplyRequest
from shared.model import PodStatus, Queue, QueueResource
from shared.model.builders import gang, gpu_nodes
from tests.builders import UNBOUNDED

BORROWER = "team-a"
RECLAIMER = "team-b"
RECLAIMING_JOB = "b-job"
"""The reclaimer's gang: 2 pods of one GPU each."""
POLL = 0.3


def team_queues(teams: Sequence[str], gpu_quota: float, parent: str = "org") -> tuple[Queue, ...]:
    """`parent`, unbounded, over one queue per team (in this order) with `gpu_quota` GPUs deserved."""
    return (
        Queue(name=parent, gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED),
        *(
            Queue(
                name=team,
                parent=parent,
                creation_index=i,
                gpu=QueueResource(quota=gpu_quota),
                cpu=UNBOUNDED,
                memory=UNBOUNDED,
            )
            for i, team in enumerate(teams)
        ),
    )


async def apply(client: BusClient, request: ApplyRequest) -> None:
    reply = await client.apply(request)
    assert reply.ok, reply.error


async def wait_running(client: BusClient, prefix: str, count: int, settle: float) -> None:
    """Until `count` pods named `prefix...` run (at most `settle` seconds)."""
    async with asyncio.timeout(settle):
        while True:
            reply = await client.snapshot()
            pods = [p for p in reply.pods if p.name.startswith(prefix) and p.status == PodStatus.RUNNING]
            if len(pods) >= count:
                return
            await asyncio.sleep(POLL)


async def reclaim(client: BusClient, settle: float) -> None:
    """team-a fills the node beyond its quota, then team-b's b-job asks for its 2 GPUs back (submitted,
    not yet bound, when this returns)."""
    borrowed = [gang(f"a-{i}", BORROWER, 1, 1.0, created=float(i)) for i in range(4)]
    await apply(
        client,
        ApplyRequest(
            nodes=tuple(gpu_nodes(1, gpus=4)),
            queues=team_queues([BORROWER, RECLAIMER], gpu_quota=2),
            podgroups=tuple(pg for pg, _ in borrowed),
            pods=tuple(p for _, pods in borrowed for p in pods),
        ),
    )
    await wait_running(client, "a-", 4, settle)
    group, pods = gang(RECLAIMING_JOB, RECLAIMER, 2, 1.0, created=10.0)
    await apply(client, ApplyRequest(podgroups=(group,), pods=tuple(pods)))
