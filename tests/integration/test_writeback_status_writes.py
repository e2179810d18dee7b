"""How many writes the write-back makes for a PodGroup's status, against the simulated API server
(`services.state.controllers.writeback`): a podgroup-state event writes the phase and counts together with
the ``resourcesStatus`` recount it calls for, in one status patch, once the mirror shows the binds it
reports (the watch may show them after the event arrives); the recount that follows finds nothing left to
write; what the mirror did not show within `resources_settle`, that recount writes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

import msgspec
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


def pod(node: str | None, podgroup: str = "pg") -> bytes:
    """Pod p-0 of podgroup pg (another podgroup's: <podgroup>-0) asking 2 CPUs and 1Gi, bound to `node`
    (PodScheduled True) or pending; as its watch event carries it."""
    name = "p-0" if podgroup == "pg" else f"{podgroup}-0"
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {"pod-group-name": podgroup},
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
    return json.dumps(doc).encode()


async def podgroup_in(kube: Kube, mirror: Mirror, name: str = "pg") -> bytes:
    """PodGroup `name` created in the cluster and shown by the mirror; as created."""
    body = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
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


async def shown(kube: Kube, mirror: Mirror, name: str = "pg") -> dict[str, Any]:
    """The PodGroup `name` as the cluster has it, given to the mirror as its watch would."""
    data = await kube.call(
        "read podgroup",
        kube.custom.get_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        name,
    )
    mirror.change(PODGROUPS, "MODIFIED", data)
    status: dict[str, Any] = json.loads(data).get("status", {})
    return status


class Stage(NamedTuple):
    sim: KubeSim
    kube: Kube
    mirror: Mirror
    writeback: WriteBack


@contextlib.asynccontextmanager
async def stage(tmp_path: Path, options: WriteBackOptions | None = None) -> AsyncIterator[Stage]:
    """The simulated API server, a client of it, an empty mirror, and a write-back over both (its counters in
    `writeback.ctx.counters`); the client closed at the end."""
    async with running_kubesim(tmp_path) as sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            mirror = Mirror(scheduler_name="kai-scheduler")
            context = cast(ServiceContext, SimpleNamespace(counters=Counters()))
            writeback = WriteBack(context, kube, mirror, options or WriteBackOptions())
            yield Stage(sim, kube, mirror, writeback)
        finally:
            await kube.close()


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
    async with stage(tmp_path) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))
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
        assert writeback.ctx.counters["kube_status_patches"] == 1


async def test_what_the_mirror_did_not_show_within_the_settle_time_the_recount_writes(tmp_path: Path) -> None:
    async with stage(tmp_path, WriteBackOptions(resources_settle=0.05)) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod(None))  # the bind not seen yet, nor within the settle time
        before = status_patches(sim)

        await writeback._on_event(RUNNING, delivery())
        status = await shown(kube, mirror)
        assert status["phase"] == "Running"
        assert not status["resourcesStatus"].get("allocated")
        assert writeback.ctx.counters["writeback_binds_unseen"] == 1

        mirror.change(PODS, "MODIFIED", pod("node-0"))  # the watch catches up
        await writeback._write_resources("default/pg")
        status = await shown(kube, mirror)
        assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        assert status_patches(sim) - before == 2


async def test_a_podgroup_state_event_waits_for_the_watch_to_show_its_binds_and_writes_all_in_one_patch(
    tmp_path: Path,
) -> None:
    # The binder publishes the event once its binds are written; the watch may show them a moment after the
    # event arrives. Written at once, the event's patch counted the pod as unplaced and the recount wrote
    # the resources again a second later: two writes where one does.
    # A settle time far longer than the test: the wait ends when the watch shows the bind.
    async with stage(tmp_path, WriteBackOptions(resources_settle=60.0)) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod(None))
        before = status_patches(sim)

        handler = asyncio.create_task(writeback._on_event(RUNNING, delivery()))
        await asyncio.sleep(0.1)
        assert not handler.done()  # neither written nor acked yet
        assert status_patches(sim) == before
        mirror.change(PODS, "MODIFIED", pod("node-0"))  # the watch shows the bind
        await asyncio.wait_for(handler, 2.0)

        status = await shown(kube, mirror)
        assert status["phase"] == "Running"
        assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        await writeback._write_resources("default/pg")  # the recount the event called for
        assert status_patches(sim) - before == 1
        assert writeback.ctx.counters["writeback_binds_unseen"] == 0


async def test_a_podgroup_state_event_does_not_wait_for_binds_of_pods_deleted_since(tmp_path: Path) -> None:
    # Two pods bound, one deleted before the watch showed its bind: the mirror never shows it bound, and
    # waiting for it held the batch's acks and the next fetch for the whole settle time.
    async with stage(tmp_path, WriteBackOptions(resources_settle=60.0)) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))
        gone = json.loads(pod(None))
        gone["metadata"].update(name="p-1", uid="uid-p-1")
        mirror.change(PODS, "ADDED", json.dumps(gone).encode())
        mirror.change(PODS, "DELETED", json.dumps(gone).encode())
        both = msgspec.structs.replace(RUNNING, running=2)
        before = status_patches(sim)

        await asyncio.wait_for(writeback._on_event(both, delivery()), 2.0)

        status = await shown(kube, mirror)
        assert status["phase"] == "Running"
        assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        assert status_patches(sim) - before == 1
        assert writeback.ctx.counters["writeback_binds_unseen"] == 0


@pytest.mark.parametrize("event_comes", [True, False], ids=["its event comes", "no event comes"])
async def test_a_sweep_leaves_a_newly_bound_pod_to_its_event_once(tmp_path: Path, event_comes: bool) -> None:
    # Under load the write-back's events lag seconds behind the watch: a sweep between the bind shown and
    # the podgroup-state event wrote the resources, and the event the phase, two writes where one does
    # (a third of SchedulingBasic's podgroups). Without an event, the next sweep writes them.
    options = WriteBackOptions(resources_period=0.5)
    async with stage(tmp_path, options) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))  # bound, its event still on its way
        before = status_patches(sim)
        counting = asyncio.create_task(writeback._count_resources())
        try:
            await asyncio.sleep(0.75)  # a sweep at 0.5 s, the next at 1 s
            assert status_patches(sim) == before
            if event_comes:
                await writeback._on_event(RUNNING, delivery())
            for _ in range(100):
                status = await shown(kube, mirror)
                if status.get("resourcesStatus"):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.2)  # two sweeps more, and the recount the event called for
        finally:
            await stop_tasks([counting])
        status = await shown(kube, mirror)
        assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        assert ("phase" in status) is event_comes
        assert status_patches(sim) - before == 1


async def test_the_recount_loop_leaves_a_podgroup_to_the_event_being_written_about_it(
    tmp_path: Path,
) -> None:
    # A recount woken by an earlier event while this one waits for the watch would write the podgroup's
    # resources as the mirror shows them, without the bind: a write of its own before the event's.
    options = WriteBackOptions(resources_settle=1.0, resources_period=60.0)
    async with stage(tmp_path, options) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod(None))
        before = status_patches(sim)
        counting = asyncio.create_task(writeback._count_resources())
        try:
            writeback._resources_dirty.add("default/another")  # an earlier event's: recounted at 1 s
            writeback._resources_wake.set()
            await asyncio.sleep(0.5)
            handler = asyncio.create_task(writeback._on_event(RUNNING, delivery()))  # waits until 1.5 s
            await asyncio.sleep(0.75)  # the recount came meanwhile
            assert not handler.done()
            mirror.change(PODS, "MODIFIED", pod("node-0"))
            await asyncio.wait_for(handler, 2.0)
            await shown(kube, mirror)
        finally:
            await stop_tasks([counting])
        status = await shown(kube, mirror)
        assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        assert status_patches(sim) - before == 1
        assert writeback._resources_dirty == {"default/pg"}  # counted again after the event


async def test_an_event_waiting_for_its_binds_holds_up_the_next_event_of_its_podgroup_only(
    tmp_path: Path,
) -> None:
    # The events of a fetched batch are written side by side: another podgroup's is written while one waits
    # for the watch, and one about the same podgroup after it, in the order they came.
    async with stage(tmp_path, WriteBackOptions(resources_settle=60.0)) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        await podgroup_in(kube, mirror, "other")
        mirror.change(PODS, "ADDED", pod(None))
        mirror.change(PODS, "ADDED", pod("node-1", "other"))
        before = status_patches(sim)

        waiting = asyncio.create_task(writeback._on_event(RUNNING, delivery()))
        unschedulable = PodUnschedulable(
            time=2.0, namespace="default", podgroup="pg", queue="q", message="queue q is over its limit"
        )
        after_it = asyncio.create_task(writeback._on_event(unschedulable, delivery()))
        other = msgspec.structs.replace(RUNNING, podgroup="other")
        await asyncio.wait_for(writeback._on_event(other, delivery()), 2.0)
        assert (await shown(kube, mirror, "other"))["phase"] == "Running"
        assert status_patches(sim) - before == 1
        assert not waiting.done()
        assert not after_it.done()

        mirror.change(PODS, "MODIFIED", pod("node-0"))
        await asyncio.wait_for(asyncio.gather(waiting, after_it), 2.0)
        status = await shown(kube, mirror)
        assert status["phase"] == "Running"
        [condition] = status["schedulingConditions"]
        assert condition["message"] == "queue q is over its limit"


@pytest.mark.parametrize(
    "pending_shown", [True, False], ids=["its pending pod shown", "its pod shown placed already (a race)"]
)
async def test_an_unschedulable_report_writes_its_condition_and_the_resources_in_one_patch(
    tmp_path: Path, pending_shown: bool
) -> None:
    async with stage(tmp_path) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod(None if pending_shown else "node-0"))
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


async def test_a_coalesced_write_refused_for_a_moment_leaves_its_event_to_be_delivered_again(
    tmp_path: Path,
) -> None:
    # The phase and the recount go in one write inside the event's handler, before its ack: an API server
    # that fails the write makes the handler ask for the event again (TemporaryError: nak), and the event
    # delivered again writes both; nothing was remembered as written meanwhile.
    async with stage(tmp_path) as (sim, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))

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


async def test_a_version_of_the_group_from_before_the_write_is_not_written_again_within_the_watch_lag(
    tmp_path: Path,
) -> None:
    options = WriteBackOptions(watch_lag=5.0)
    async with stage(tmp_path, options) as (sim, kube, mirror, writeback):
        created = await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))
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


async def test_the_periodic_recount_runs_while_events_keep_waking_the_write_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pod that starts without any Kairos event is recounted by the sweep alone; a steady stream of events
    # about other podgroups, each recount of theirs a write that lets the next event in, must not put the
    # sweep off for ever.
    options = WriteBackOptions(resources_period=0.3, resources_settle=0.01)
    async with stage(tmp_path, options) as (_, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))
        recount = writeback._write_resources

        async def written(name: str, may_leave: bool = False) -> None:
            if name == "default/another":
                await asyncio.sleep(0.005)  # its status patch's round trip
            else:
                await recount(name, may_leave)

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


@contextlib.asynccontextmanager
async def sweeping(writeback: WriteBack, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[set[str]]]:
    """The write-back's recount loop running; the podgroups each of its passes recounted, pass by pass."""
    passes: list[set[str]] = [set()]
    recount = writeback._recount
    forget = writeback._forget_resources

    def counted(name: str, group: Any) -> Any:
        passes[-1].add(name)
        return recount(name, group)

    def next_pass() -> None:
        passes.append(set())
        forget()

    monkeypatch.setattr(writeback, "_recount", counted)
    monkeypatch.setattr(writeback, "_forget_resources", next_pass)
    counting = asyncio.create_task(writeback._count_resources())
    try:
        yield passes
    finally:
        await stop_tasks([counting])


async def test_a_sweep_recounts_the_podgroups_whose_pods_changed_and_leaves_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An idle cluster's sweep cost as much as a busy one's: every podgroup recounted every period.
    options = WriteBackOptions(resources_period=0.2, resources_resync=60.0)
    async with stage(tmp_path, options) as (_, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        await podgroup_in(kube, mirror, "other")
        mirror.change(PODS, "ADDED", pod(None))
        mirror.change(PODS, "ADDED", pod("node-0", "other"))
        async with sweeping(writeback, monkeypatch) as passes:
            await asyncio.sleep(0.3)  # the first sweep counts every podgroup
            assert {"default/pg", "default/other"} <= set().union(*passes)
            await shown(kube, mirror)
            await shown(kube, mirror, "other")  # their writes come back through the watch
            await asyncio.sleep(0.3)
            settled = len(passes) - 1
            passes[settled] = set()  # the pass to come, or the one under way: from here on
            mirror.change(PODS, "MODIFIED", pod("node-0"))  # p-0 bound, no Kairos event about it
            await asyncio.sleep(0.5)  # left once to the event that might come, then written
            after = set().union(*passes[settled:])
        assert "default/pg" in after
        assert "default/other" not in after
        assert (await shown(kube, mirror))["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}


async def test_every_podgroup_is_recounted_each_resync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = WriteBackOptions(resources_period=0.1, resources_resync=0.4)
    async with stage(tmp_path, options) as (_, kube, mirror, writeback):
        await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))
        async with sweeping(writeback, monkeypatch) as passes:
            await asyncio.sleep(0.15)
            await shown(kube, mirror)
            first = len(passes)
            await asyncio.sleep(0.6)  # a resync at 0.4 s
            later = passes[first:-1]  # the passes done since
        assert len(later) >= 3
        assert any("default/pg" in each for each in later)
        assert any("default/pg" not in each for each in later), "the sweeps between leave it"


async def test_a_sweep_looks_again_at_a_podgroup_whose_older_version_came_within_the_watch_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watch shows a version from before the write (another write came first): within the watch lag
    # that is not written again; past it, a group that still does not show the amounts is, at the next
    # sweep, though nothing touches it any more.
    options = WriteBackOptions(resources_period=0.1, resources_resync=60.0, watch_lag=1.0)
    async with stage(tmp_path, options) as (sim, kube, mirror, writeback):
        created = await podgroup_in(kube, mirror)
        mirror.change(PODS, "ADDED", pod("node-0"))
        async with sweeping(writeback, monkeypatch):
            for _ in range(40):  # the first sweep leaves it to an event, the second writes the amounts
                if status_patches(sim) == 1:
                    break
                await asyncio.sleep(0.05)
            assert status_patches(sim) == 1
            await kube.request(
                "overwrite",
                "PATCH",
                "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg/status",
                {"status": {"resourcesStatus": None}},
                content_type=MERGE_PATCH,
            )
            overwritten = status_patches(sim)
            mirror.change(PODGROUPS, "MODIFIED", created)
            await asyncio.sleep(0.3)
            assert status_patches(sim) == overwritten, "within the watch lag: not written again"
            for _ in range(60):
                if status_patches(sim) > overwritten:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
        status = await shown(kube, mirror)
        assert status["resourcesStatus"]["allocated"] == {"cpu": "2", "memory": "1Gi"}
        assert status_patches(sim) == overwritten + 1
