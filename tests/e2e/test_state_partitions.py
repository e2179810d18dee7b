"""The state service active-active (`--set partitions=N`), end to end on kubesim with the real kubectl: two
`source=kube` state replicas divide the partitions; one is killed with SIGKILL while pods are being
applied; every pod is bound exactly once, gets exactly one Scheduled Event, its record in KV says where it
runs, and every PodGroup's status is written.

`kairos up --replicas state=2` starts the state replicas beyond the first as read replicas (`source=none`),
so the second partitioned replica is started here with the first one's command line (and no webhook port of
its own). The stack runs without NATS authentication until the state identity may use the work stream
(`services.state.sources.partitions.WORK_STREAM`)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from services.state.sources.partitions import partitions
from shared.bus.connection import connect
from shared.bus.health import wait_ready
from shared.contracts import subjects as s
from shared.contracts.messages import LEASES, STATE_RECORDS, PodRecord
from tests.e2e import manifests
from tests.e2e.kubectl import QUEUE_PERIOD, RUN_DELAY, apply, kubectl, wait_for
from tools.stack.supervisor import DEFAULT_REPLICAS, ClusterChoice, Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COUNT = 8
PODS = 48
SECOND = "state-1"


def second_replica(stack: Stack) -> subprocess.Popen[bytes]:
    """A second partitioned state replica: the first one's command line under another id, no webhook."""
    first = stack.commands["state-0"]
    command = [*first[: first.index("--replica")], "--replica", SECOND]
    options = first[first.index("--replica") + 2 :]
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if not value.startswith("webhook_port="):
            command += [flag, value]
    with (stack.state_dir / "logs" / f"{SECOND}.log").open("ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=stack.env, start_new_session=True
        )
    stack.processes[SECOND] = proc
    stack.services[SECOND] = "state"
    stack.commands[SECOND] = command
    asyncio.run(wait_ready(stack.url, {SECOND}, 60.0))
    return proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = start_stack(
        tmp_path_factory.mktemp("partitions"),
        replicas=dict(DEFAULT_REPLICAS),
        cluster=ClusterChoice(kind="kubesim", nodes=8, gpus_per_node=8, run_delay=RUN_DELAY),
        options={"queue": {"period": QUEUE_PERIOD}, "state": {"partitions": str(COUNT)}},
        auth=False,
    )
    try:
        yield started
    finally:
        started.stop()


def holders(stack: Stack) -> dict[str, str]:
    """Each partition's lease holder (partitions nobody holds left out)."""

    async def read() -> dict[str, str]:
        bus = await connect(stack.url, "partitions-e2e")
        try:
            found: dict[str, str] = {}
            for p in partitions(COUNT):
                entry = await bus.leases.get(s.state_lease_key(f"partition-{p}"))
                if entry is not None and entry.value:
                    found[p] = LEASES.decode(entry.key, entry.value).holder
            return found
        finally:
            await bus.close()

    return asyncio.run(read())


def kv_nodes(stack: Stack, names: list[str]) -> dict[str, str]:
    """Where KV says each pod runs (pods without a node left out)."""

    async def read() -> dict[str, str]:
        bus = await connect(stack.url, "partitions-e2e")
        try:
            found: dict[str, str] = {}
            for name in names:
                entry = await bus.state.get(s.pod_key("default", name))
                if entry is None or not entry.value:
                    continue
                record = STATE_RECORDS.decode(entry.key, entry.value)
                if isinstance(record, PodRecord) and record.pod.node:
                    found[name] = record.pod.node
            return found
        finally:
            await bus.close()

    return asyncio.run(read())


def items(stack: Stack, kind: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads(kubectl(stack, "get", kind, "-o", "json"))["items"]
    return listed


def test_a_state_replica_killed_mid_load_loses_nothing_and_writes_nothing_twice(stack: Stack) -> None:
    victim = second_replica(stack)
    wait_for(
        "both state replicas owning partitions",
        lambda: set(holders(stack).values()) == {"state-0", SECOND},
        lambda: json.dumps(holders(stack)),
    )
    names = [f"load-{i}" for i in range(PODS)]
    half = PODS // 2
    apply(stack, *(manifests.pod(name, cpu="100m") for name in names[:half]))
    wait_for(
        "some pods bound before the kill",
        lambda: sum(1 for p in items(stack, "pods") if p["spec"].get("nodeName")) >= 4,
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    del stack.processes[SECOND]
    apply(stack, *(manifests.pod(name, cpu="100m") for name in names[half:]))

    def all_bound() -> dict[str, str] | None:
        nodes = {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in items(stack, "pods")
            if p["spec"].get("nodeName")
        }
        return nodes if set(names) <= set(nodes) else None

    bound = wait_for("every pod bound", all_bound, lambda: kubectl(stack, "get", "pods", "-o", "wide"))
    wait_for(
        "the survivor owning every partition",
        lambda: set(holders(stack).values()) == {"state-0"} and len(holders(stack)) == len(partitions(COUNT)),
        lambda: json.dumps(holders(stack)),
    )

    def scheduled() -> Counter[str] | None:
        events = Counter(
            e["involvedObject"]["name"] for e in items(stack, "events") if e.get("reason") == "Scheduled"
        )
        return events if all(events[name] for name in names) else None

    events = wait_for("a Scheduled Event on every pod", scheduled, lambda: kubectl(stack, "get", "events"))
    assert {name: n for name, n in events.items() if n != 1} == {}, "a Scheduled Event written twice"

    def recorded() -> dict[str, str] | None:
        found = kv_nodes(stack, names)
        return found if len(found) == len(names) else None

    in_kv = wait_for("every pod's record in KV on its node", recorded)
    assert in_kv == {name: bound[name] for name in names}

    def statuses() -> list[str] | None:
        groups = items(stack, "podgroups")
        missing = [g["metadata"]["name"] for g in groups if not g.get("status", {}).get("phase")]
        return None if missing or len(groups) < PODS else ["ok"]

    wait_for(
        "every PodGroup's status written", statuses, lambda: kubectl(stack, "get", "podgroups", "-o", "yaml")
    )
