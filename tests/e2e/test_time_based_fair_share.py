"""Time-based fair share through the whole stack and the real kubectl: with a `usageDBConfig` on KAI's default
SchedulingShard, a queue that held the cluster for the last hour gets a smaller over-quota share than its
idle sibling, and `kairos status` and the queue-fair-share events show the numbers.

No hour goes by: the past hour is written into the shard's usage ledger (KV `kairos_usage`) as a previous
queue leader would have left it, and the queue leader is restarted so that it reads it (a new leader reads
the record at take-over); from there the services run on the wall clock.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import pytest

from shared.bus.client import BusClient
from shared.bus.connection import connect
from shared.contracts import subjects as s
from shared.contracts.events import QueueFairShare
from shared.contracts.messages import UsageRecord, encode
from shared.core.usage import UsageLedger, UsageParams, record_interval
from shared.kube.keys import QUEUE_LABEL
from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES, GPUS = 4, 8
HOUR = 3600.0
WINDOW = 24 * HOUR
PODS_PER_QUEUE = 20
"""1-GPU pods per queue: 40 asked of 32 GPUs, so the over-quota division decides who gets what."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("usage"), nodes=NODES, gpus_per_node=GPUS) as started:
        yield started


async def seed_last_hour(stack: Stack) -> None:
    """`busy` held every GPU of the cluster for the last hour (term 0: any leader may go on with it)."""
    capacity = (float(NODES * GPUS), 0.0, 0.0)
    now = time.time()
    ledger = record_interval(
        UsageLedger(), now - HOUR, now, {"busy": capacity}, capacity, UsageParams(window=WINDOW)
    )
    bus = await connect(stack.url, "usage-seed")
    try:
        await bus.usage.put(
            s.usage_key(s.DEFAULT_SHARD), encode(UsageRecord(shard="default", term=0, ledger=ledger))
        )
    finally:
        await bus.close()


async def fair_share_events(stack: Stack) -> dict[str, QueueFairShare]:
    client = await BusClient.connect(stack.url)
    try:
        events = await client.last_events("queue-fair-share")
    finally:
        await client.nc.close()
    return {e.queue: e for e in events if isinstance(e, QueueFairShare)}


def status_row(text: str, queue: str) -> list[str]:
    """The cells of `queue`'s row in the queues table of `kairos status`."""
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] == queue:
            return cells
    return []


def test_a_queue_that_used_the_cluster_lately_gets_less_than_its_idle_sibling(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # every column of `kairos status` on one line
    apply(stack, manifests.queue("busy", gpu_quota=0), manifests.queue("idle", gpu_quota=0))
    asyncio.run(seed_last_hour(stack))
    usage_db = '{"spec":{"usageDBConfig":{"clientType":"prometheus","usageParams":{"windowSize":"24h"}}}}'
    kubectl(stack, "patch", "schedulingshard", "default", "--type=merge", "-p", usage_db)
    wait_for(
        "the usage parameters in force",
        lambda: "KV kairos_usage" in (text := kairos(stack, "status")) and text,
    )
    # A new leader reads the seeded record when it takes over.
    leader = stack.processes["queue-0"]
    leader.terminate()
    leader.wait(timeout=15)
    stack.restart("queue-0")

    pods = []
    for queue in ("busy", "idle"):
        for i in range(PODS_PER_QUEUE):
            pod = manifests.pod(f"{queue}-{i}", gpus="1")
            pod["metadata"]["labels"][QUEUE_LABEL] = queue
            pods.append(pod)
    apply(stack, *pods)

    def shares() -> dict[str, QueueFairShare] | None:
        got = asyncio.run(fair_share_events(stack))
        ready = "busy" in got and "idle" in got and got["busy"].usage and got["idle"].fair_share["gpu"] > 0
        return got if ready else None

    events = wait_for("queue-fair-share events with usage", shares)
    busy, idle = events["busy"], events["idle"]
    print("DEBUG", busy.usage, busy.fair_share, idle.usage, idle.fair_share)
    # busy's usage is ~1 (the whole cluster for the one observed hour; live samples add a little time);
    # its over-quota weight max(0, 1/2 + 1 * (1/2 - ~1)) is ~0, so idle gets its whole request first.
    assert busy.usage["gpu"] == pytest.approx(1.0, abs=0.05)
    assert idle.usage["gpu"] == pytest.approx(0.0, abs=0.05)
    assert idle.fair_share["gpu"] == pytest.approx(PODS_PER_QUEUE)
    assert busy.fair_share["gpu"] == pytest.approx(NODES * GPUS - PODS_PER_QUEUE)

    text = kairos(stack, "status")
    print(text)
    busy_row, idle_row = status_row(text, "busy"), status_row(text, "idle")
    assert busy_row, text
    assert idle_row, text
    # queue, parent, priority, quota, limit, weight, fair share, allocated, usage
    assert float(busy_row[-1]) == pytest.approx(1.0, abs=0.05)
    assert float(idle_row[-1]) == pytest.approx(0.0, abs=0.05)
    assert float(busy_row[6]) < float(idle_row[6])
