"""How many writes the write-back makes for a PodGroup's status, against the simulated API server
(`services.state.controllers.writeback`): a podgroup-state event writes the phase and counts together with
the ``resourcesStatus`` recount it calls for, in one status patch; the recount that follows finds nothing
left to write; what the mirror had not seen when the event came, that recount writes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.state.controllers.writeback import WriteBack, WriteBackOptions
from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import PODGROUPS, PODS
from shared.bus.middleware import Counters
from shared.bus.service import ServiceContext
from shared.bus.tasks import stop_tasks
from shared.contracts.events import PodGroupState, PodUnschedulable
from shared.errors import TemporaryError
from shared.kubeapi.client import MERGE_PATCH, Kube, connect
from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

STORED = 1_764_921_600_123_456_789
RUNNING = PodGroupState(
    time=1.0, namespace="default", podgroup="pg", queue="q", phase="Running", running=1, pending=0
)


def delivery() -> Any:
    return SimpleNamespace(reply=f"$JS.ACK.KAIROS_EVENTS.state-writeback.1.41.7.{STORED}.0")


def pod(node: str | None) -> dict[str, Any]:
    """Pod p-0 of podgroup pg asking 2 CPUs and 1Gi, bound to `node` (PodScheduled True) or pending."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p-0",
            "namespace": "default",
            "uid": "uid-p-0",
            "annotations": {"pod-group-name": "pg"},
            "labels": {"kai.scheduler/queue": "q"},
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
        },
        "status": {"phase": "Pending"},
    }
    if node is not None:
        doc["spec"]["nodeName"] = node
        doc["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    return doc


async def podgroup_in(kube: Kube, mirror: Mirror) -> bytes:
    """PodGroup pg created in the cluster and shown by the mirror; as created."""
    body = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "default"},
        "spec": {"minMember": 1, "queue": "q"},
    }
    created = await kube.call(
        "create podgroup",
        kube.custom.create_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        body,
    )
    mirror.change(PODGROUPS, "ADDED", created)
    return created


async def shown(kube: Kube, mirror: Mirror) -> dict[str, Any]:
    """The PodGroup as the cluster has it, given to the mirror as its watch would."""
    data = await kube.call(
        "read podgroup",
        kube.custom.get_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        "pg",
    )
    mirror.change(PODGROUPS, "MODIFIED", data)
    status: dict[str, Any] = json.loads(data).get("status", {})
    return status


def status_patches(sim: KubeSim) -> int:
    return sum(
        row["count"]
        for row in sim.request_counts()
        if (row["verb"], row["resource"]) == ("patch", "podgroups/status")
    )


@pytest.mark.parametrize("watch_caught_up", [True, False], ids=["its write seen", "its write not seen yet"])
async def test_a_podgroup_state_event_writes_phase_and_resources_in_one_patch_and_the_recount_adds_none(
    tmp_path: Path, watch_caught_up: bool
) -> None:
    async with running_kubesim(tmp_path) as sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            counters = Counters()
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=counters)), kube, mirror, WriteBackOptions()
            )
            await podgroup_in(kube, mirror)
            mirror.change(PODS, "ADDED", json.dumps(pod("node-0")).encode())
            before = status_patches(sim)

            await writeback._on_event(RUNNING, delivery())
            if watch_caught_up:
                status = await shown(kube, mirror)
            await writeback._write_resources("default/pg")  # the recount the event called for

            status = await shown(kube, mirror)
            assert status["phase"] == "Running"
            assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
            assert status["resourcesStatus"]["requested"] == {"cpu": "2", "memory": "1Gi"}
            assert status_patches(sim) - before == 1
            assert counters["kube_status_patches"] == 1
        finally:
            await kube.close()


async def test_what_the_mirror_had_not_seen_at_the_event_the_recount_writes(tmp_path: Path) -> None:
    async with running_kubesim(tmp_path) as sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=Counters())), kube, mirror, WriteBackOptions()
            )
            await podgroup_in(kube, mirror)
            mirror.change(PODS, "ADDED", json.dumps(pod(None)).encode())  # the bind not seen yet
            before = status_patches(sim)

            await writeback._on_event(RUNNING, delivery())
            status = await shown(kube, mirror)
            assert status["phase"] == "Running"
            assert not status["resourcesStatus"].get("allocated")

            mirror.change(PODS, "MODIFIED", json.dumps(pod("node-0")).encode())  # the watch catches up
            await writeback._write_resources("default/pg")
            status = await shown(kube, mirror)
            assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
            assert status_patches(sim) - before == 2
        finally:
            await kube.close()


@pytest.mark.parametrize(
    "pending_shown", [True, False], ids=["its pending pod shown", "its pod shown placed already (a race)"]
)
async def test_an_unschedulable_report_writes_its_condition_and_the_resources_in_one_patch(
    tmp_path: Path, pending_shown: bool
) -> None:
    async with running_kubesim(tmp_path) as sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=Counters())), kube, mirror, WriteBackOptions()
            )
            await podgroup_in(kube, mirror)
            mirror.change(PODS, "ADDED", json.dumps(pod(None if pending_shown else "node-0")).encode())
            before = status_patches(sim)

            event = PodUnschedulable(
                time=1.0, namespace="default", podgroup="pg", queue="q", message="queue q is over its limit"
            )
            await writeback._on_event(event, delivery())

            status = await shown(kube, mirror)
            # The event's condition stands even where the recount alone would have removed it as stale.
            [condition] = status["schedulingConditions"]
            assert (condition["type"], condition["message"]) == (
                "UnschedulableOnNodePool",
                "queue q is over its limit",
            )
            assert status["resourcesStatus"]["requested"] == {"cpu": "2", "memory": "1Gi"}
            assert status_patches(sim) - before == 1
        finally:
            await kube.close()


async def test_a_coalesced_write_refused_for_a_moment_leaves_its_event_to_be_delivered_again(
    tmp_path: Path,
) -> None:
    # The phase and the recount go in one write inside the event's handler, before its ack: an API server
    # that fails the write makes the handler ask for the event again (TemporaryError: nak), and the event
    # delivered again writes both; nothing was remembered as written meanwhile.
    async with running_kubesim(tmp_path) as sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=Counters())), kube, mirror, WriteBackOptions()
            )
            await podgroup_in(kube, mirror)
            mirror.change(PODS, "ADDED", json.dumps(pod("node-0")).encode())

            sim.faults.set_plan(
                FaultPlan(rules=(FaultRule(verb="patch", resource="podgroups/status", status=503),))
            )
            with pytest.raises(TemporaryError):
                await writeback._on_event(RUNNING, delivery())
            assert "phase" not in await shown(kube, mirror)

            sim.faults.set_plan(FaultPlan())
            await writeback._on_event(RUNNING, delivery())  # delivered again
            status = await shown(kube, mirror)
            assert status["phase"] == "Running"
            assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        finally:
            await kube.close()


async def test_a_version_of_the_group_from_before_the_write_is_not_written_again_within_the_watch_lag(
    tmp_path: Path,
) -> None:
    async with running_kubesim(tmp_path) as sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            options = WriteBackOptions(watch_lag=5.0)
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=Counters())), kube, mirror, options
            )
            created = await podgroup_in(kube, mirror)
            mirror.change(PODS, "ADDED", json.dumps(pod("node-0")).encode())
            before = status_patches(sim)
            await writeback._on_event(RUNNING, delivery())

            # The watch tells of an older version first (another write, the stamps' annotations, came first).
            mirror.change(PODGROUPS, "MODIFIED", created)
            await writeback._write_resources("default/pg")
            assert status_patches(sim) - before == 1

            # Past the lag, a group that still shows other amounts (someone wrote them) is written again.
            writeback.options = WriteBackOptions(watch_lag=0.0)
            await kube.request(
                "overwrite",
                "PATCH",
                "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg/status",
                {"status": {"resourcesStatus": {"allocated": {"cpu": "9"}}}},
                content_type=MERGE_PATCH,
            )
            await shown(kube, mirror)
            await writeback._write_resources("default/pg")
            status = await shown(kube, mirror)
            assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        finally:
            await kube.close()


async def test_the_periodic_recount_runs_while_events_keep_waking_the_write_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pod that starts without any Kairos event is recounted by the sweep alone; a steady stream of events
    # about other podgroups, each recount of theirs a write that lets the next event in, must not put the
    # sweep off for ever.
    async with running_kubesim(tmp_path):
        kube = await connect(str(tmp_path / "kubeconfig"))
        options = WriteBackOptions(resources_period=0.3, resources_settle=0.01)
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=Counters())), kube, mirror, options
            )
            await podgroup_in(kube, mirror)
            mirror.change(PODS, "ADDED", json.dumps(pod("node-0")).encode())
            recount = writeback._write_resources

            async def written(name: str) -> None:
                if name == "default/another":
                    await asyncio.sleep(0.005)  # its status patch's round trip
                else:
                    await recount(name)

            monkeypatch.setattr(writeback, "_write_resources", written)
            counting = asyncio.create_task(writeback._count_resources())

            async def events_elsewhere() -> None:
                while True:
                    writeback._resources_dirty.add("default/another")
                    writeback._resources_wake.set()
                    await asyncio.sleep(0.002)

            waking = asyncio.create_task(events_elsewhere())
            status: dict[str, Any] = {}
            try:
                for _ in range(200):  # 10 s at most; a sweep is due every 0.3 s
                    status = await shown(kube, mirror)
                    if status.get("resourcesStatus"):
                        break
                    await asyncio.sleep(0.05)
            finally:
                await stop_tasks([counting, waking])
            assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        finally:
            await kube.close()
