"""The state replicas' admission webhook behind a Service, end to end: `kairos up --replicas state=2` on
kubesim registers one pod webhook naming the Service `kai-scheduler/kairos-state-webhook`, whose
EndpointSlices list both replicas, so each pod's admission review reaches one replica (the replicas in
turn), and pods created while one replica is stopped are still gated by the other, as behind a cluster's
Service. The reviews are counted from each replica's `admission_reviews` counter (its health answer)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from shared.bus.connection import connect
from shared.bus.health import wait_ready
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS
from tests.e2e import manifests
from tests.e2e.kubectl import kubectl, kubesim_stack
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GATE = "kairos.io/after"
REPLICAS = ("state-0", "state-1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(
        tmp_path_factory.mktemp("webhook-service"), nodes=1, gpus_per_node=1, replicas={"state": 2}
    ) as started:
        yield started


def reviews(stack: Stack, replicas: tuple[str, ...] = REPLICAS) -> dict[str, int]:
    """Each replica's count of admission reviews received, from its health answer."""

    async def ask() -> dict[str, int]:
        bus = await connect(stack.url, "webhook-service-e2e")
        try:
            found: dict[str, int] = {}
            for replica in replicas:
                msg = await bus.nc.request(s.health("state", replica), b"", timeout=10.0)
                beat = HEARTBEATS.decode(msg.subject, msg.data)
                found[replica] = int(beat.counters.get("admission_reviews", 0))
            return found
        finally:
            await bus.close()

    return asyncio.run(ask())


def create_gated(stack: Stack, prefix: str, count: int) -> list[dict[str, Any]]:
    """Create `count` pods that wait for a stage that never comes; the pods as the API server stored them."""
    pods = [manifests.pod(f"{prefix}-{i}", annotations={GATE: "never"}, cpu="1") for i in range(count)]
    out = kubectl(stack, "create", "-f", "-", "-o", "json", stdin=manifests.documents(*pods))
    # kubectl writes one JSON document per object created.
    decoder = json.JSONDecoder()
    items: list[dict[str, Any]] = []
    text, at = out.strip(), 0
    while at < len(text):
        item, at = decoder.raw_decode(text, at)
        items.append(item)
        at = len(text) - len(text[at:].lstrip())
    return items


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or ()]


def test_the_configuration_names_one_webhook_behind_the_service(stack: Stack) -> None:
    config = json.loads(
        kubectl(stack, "get", "mutatingwebhookconfiguration", "kairos-after-gate", "-o", "json")
    )
    [hook] = config["webhooks"]
    assert hook["clientConfig"]["service"]["name"] == "kairos-state-webhook"
    slices = json.loads(
        kubectl(
            stack,
            "get",
            "endpointslices",
            "-n",
            "kai-scheduler",
            "-l",
            "kubernetes.io/service-name=kairos-state-webhook",
            "-o",
            "json",
        )
    )["items"]
    assert len(slices) == len(REPLICAS)


def test_each_pods_review_reaches_one_replica_and_the_replicas_share_them(stack: Stack) -> None:
    before = reviews(stack)
    pods = create_gated(stack, "shared", 6)
    after = reviews(stack)

    assert all(GATE in gates(p) for p in pods)
    received = {r: after[r] - before[r] for r in REPLICAS}
    assert sum(received.values()) == len(pods), received
    assert all(n > 0 for n in received.values()), received


def test_pods_created_while_a_replica_is_stopped_are_gated_by_the_other(stack: Stack) -> None:
    stopped = stack.processes["state-1"]
    stopped.send_signal(signal.SIGTERM)
    stopped.wait(timeout=30)
    try:
        before = reviews(stack, ("state-0",))
        pods = create_gated(stack, "alone", 4)
        after = reviews(stack, ("state-0",))

        assert all(GATE in gates(p) for p in pods), [gates(p) for p in pods]
        assert after["state-0"] - before["state-0"] == len(pods)
    finally:
        stack.restart("state-1")
        asyncio.run(wait_ready(stack.url, {"state-1"}, 60.0))
