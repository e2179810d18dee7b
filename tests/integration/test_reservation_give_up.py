"""A fractional bind whose device never comes gives up, says why, and lets go of the node, against the
simulated API server (through the real kubernetes-asyncio client) and, for the recovery scan, a real
nats-server.

The reservation pod's image cannot be pulled (kubesim: a registry host ending in ``.invalid``), so its
container waits ``ErrImagePull`` and it never reports a device. Each try waits `reservation_timeout` (short
here), deletes the reservation and says why; after `attempts` tries in a row the bind is refused: a
Warning Event ``GPUReservationFailed`` on the pod names the reservation pod and the container's waiting
reason, and the binder releases the pod's claim and reservation, so it goes back to the scheduler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable
from typing import Any

import msgspec
import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.commit import Committer
from services.binder.gpu_sharing_step import ReservationFailed
from services.binder.ledger import commit_ledger
from services.binder.recovery_binds import RecoveryBinds
from shared.bus.connection import Bus
from shared.bus.kv import Entry
from shared.contracts import subjects as s
from shared.contracts.messages import Binding
from shared.kube import gpu_sharing as gs
from shared.kubeapi.client import Kube
from shared.model import Pod, PodStatus
from tests.integration.test_binder import node_pods, proposal
from tests.integration.test_binder_recovery_races import ledger_view
from tests.integration.test_binder_reservations import (
    NODES,
    bind_of,
    binder,
    create,
    pod,
    reservations,
    sharer_manifest,
    until,
    warnings,
)
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

UNPULLABLE = "registry.kairos.invalid/kairos:1.0"
RESERVATION = gs.reservation_pod_name("n0", "g1")

__all__ = ["NODES"]  # what the `sim` fixture starts with (tests/integration/conftest.py)


async def test_a_reservation_whose_image_cannot_be_pulled_gives_up_after_its_tries_and_says_why(
    kube: Kube, sim: KubeSim
) -> None:
    await create(kube, sharer_manifest("a"))
    client = binder(kube, image=UNPULLABLE, timeout=0.3, attempts=2)
    binding = bind_of("a", "n0", ("g1",), 0.5)

    with pytest.raises(ReservationFailed) as first:
        await client.bind(binding)
    # Why, in the first try's words: the reservation pod, and what its container waits for.
    assert f"{gs.RESERVATION_NAMESPACE}/{RESERVATION}" in str(first.value)
    assert "its container resource-reservation is waiting: ErrImagePull" in str(first.value)
    assert "lookup registry.kairos.invalid: no such host" in str(first.value)
    assert reservations(sim) == []
    assert warnings(sim, "a") == []

    with pytest.raises(ClusterRefused) as given_up:
        await client.bind(binding)
    assert "gave up after 2 tries" in str(given_up.value)
    [event] = warnings(sim, "a")
    assert event["reason"] == "GPUReservationFailed"
    assert f"{gs.RESERVATION_NAMESPACE}/{RESERVATION}" in event["message"]
    assert "ErrImagePull" in event["message"]
    assert "not bound to n0" in event["message"]
    assert reservations(sim) == []
    assert "nodeName" not in pod(sim, "a")["spec"]
    assert client.counters["reservation_binds_given_up"] == 1
    assert client.sharing.tries == {}

    # Placed again (on the same node or another), the pod's bind has its tries afresh.
    with pytest.raises(ReservationFailed):
        await client.bind(binding)


async def test_a_try_that_succeeds_starts_the_count_again(kube: Kube, sim: KubeSim) -> None:
    await create(kube, sharer_manifest("a"))
    failing = binder(kube, image=UNPULLABLE, timeout=0.3, attempts=2)
    binding = bind_of("a", "n0", ("g1",), 0.5)
    with pytest.raises(ReservationFailed):
        await failing.bind(binding)
    assert failing.sharing.tries == {("default/a", "n0"): 1}
    failing.sharing.settings = dataclasses.replace(failing.sharing.settings, image="kairos", timeout=10.0)
    await failing.bind(binding)
    assert pod(sim, "a")["spec"]["nodeName"] == "n0"
    assert failing.sharing.tries == {}


async def test_a_pod_given_up_no_longer_keeps_the_reservations_of_its_groups(
    kube: Kube, sim: KubeSim
) -> None:
    """A two-device pod: its first group's reservation is there (another sharer made it), its second never
    gets a device. Given up, the pod loses its group labels, so the sync deletes the first reservation too
    instead of keeping it (and its device) for as long as the pod waits to be placed again."""
    await create(kube, sharer_manifest("b"))
    await binder(kube).bind(bind_of("b", "n0", ("g1",), 0.5))
    await kube.call("delete pod b", kube.core.delete_namespaced_pod, "b", "default")
    await create(
        kube, sharer_manifest("a", annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})
    )
    client = binder(kube, image=UNPULLABLE, timeout=0.3, attempts=1, grace=0.0)

    with pytest.raises(ClusterRefused, match="gave up after 1 tries"):
        await client.bind(bind_of("a", "n0", ("g1", "g2"), 1.0))

    metadata = pod(sim, "a")["metadata"]
    assert not [k for k in metadata["labels"] if k.startswith("runai-gpu-group") or k == gs.SHARING_LABEL]
    assert "kairos.io/gpu-groups" not in metadata["annotations"]
    deleted = await client.sharing.sync(time.time())
    assert [r.metadata.name for r in deleted] == [RESERVATION]
    assert reservations(sim) == []


# --- in the recovery scan -----------------------------------------------------------------------------------
def plain_pod(name: str) -> dict[str, Any]:
    manifest = sharer_manifest(name, admitted=False)
    del manifest["metadata"]["annotations"]
    return manifest


def claimed(bus: Bus, pod_key: str) -> Awaitable[Entry | None]:
    return bus.ledger.get(s.ledger_claim_key(pod_key))


async def test_recovery_gives_a_stuck_fractional_bind_up_without_holding_back_any_other(
    bus: Bus, kube: Kube, sim: KubeSim
) -> None:
    """Two proposals committed, then their binder died before binding: a fractional pod whose reservation
    never gets its device, and an ordinary pod. One scan starts both binds; the ordinary pod is bound
    while the other bind still waits, later scans leave that one alone while it runs, and after its tries
    it is given up and its claim and reservation released."""
    await create(kube, sharer_manifest("a"))
    await create(kube, plain_pod("w"))
    client = binder(kube, image=UNPULLABLE, timeout=3.0, attempts=2)
    committer = Committer(bus, client, rebinds=RecoveryBinds(wait=0.5))
    stuck = proposal("pa", (bind_of("a", "n0", ("g1",), 0.5),))
    ordinary = proposal(
        "pw", (Binding(pod="default/w", namespace="default", name="w", podgroup="g", node="n1"),)
    )
    for p in (stuck, ordinary):
        await commit_ledger(bus.ledger, p)
    pods = {
        key: Pod(name=key.split("/")[1], namespace="default", podgroup="g", status=PodStatus.PENDING)
        for key in ("default/a", "default/w")
    }
    try:
        await committer.recover(*await ledger_view(bus), pods, now=100.0, grace=0.0)
        await until(sim, lambda: pod(sim, "w")["spec"].get("nodeName") == "n1", "the ordinary pod is bound")
        assert "pa" in committer.rebinds  # still waiting for its device meanwhile
        assert "pw" not in committer.rebinds
        pods["default/w"] = msgspec.structs.replace(pods["default/w"], status=PodStatus.BOUND, node="n1")

        # A scan while it waits does not start a second bind of it.
        await committer.recover(*await ledger_view(bus), pods, now=101.0, grace=0.0)
        assert client.counters["reservations_created"] == 1

        await asyncio.wait_for(committer.rebinds.running["pa"], 10)
        assert await claimed(bus, "default/a") is not None  # one try: deferred, the claim kept
        await committer.recover(*await ledger_view(bus), pods, now=102.0, grace=0.0)
        await asyncio.wait_for(committer.rebinds.running["pa"], 10)
    finally:
        await committer.close()

    assert await claimed(bus, "default/a") is None  # given up: claim and reservation released
    assert "default/a" not in await node_pods(bus, "n0")
    assert committer.counters["released"] == 1
    [event] = warnings(sim, "a")
    assert event["reason"] == "GPUReservationFailed"
    assert "ErrImagePull" in event["message"]
    assert "nodeName" not in pod(sim, "a")["spec"]
