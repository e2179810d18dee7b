"""Invalid Queues, PodGroups and pods against the simulated API server: each is held back with a Warning
Event and a condition naming the object and the field, everything else keeps being mirrored, and the
condition is set back once the object is fixed. Garbage on the subjects only the Kubernetes owner listens
to (why, GPU inventories, stamps, the public events its write-back follows) is counted and dropped.

Drives the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`) with a real
nats-server and `tools.kubesim`, applying objects through the kubernetes-asyncio client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodUnschedulable
from shared.contracts.messages import WHY_REPLIES, PodRecord, WhyRequest, encode
from shared.kube import keys
from shared.kubeapi.client import Kube, connect
from shared.model import Node
from tests.admitted_pods import admitted
from tests.builders import pod_manifest, podgroup_manifest, queue_manifest
from tools.kubesim.cluster import SimOptions
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""


@dataclass
class Stack:
    kube: Kube
    owner: KubeOwner
    replica: StateReplica
    ctx: ServiceContext
    kubeconfig: str
    options: KubeSourceOptions
    sim: KubeSim


@pytest.fixture
async def stack(bus: Bus, tmp_path: Path) -> AsyncIterator[Stack]:
    sim = KubeSim(SimOptions(run_delay=0.0, seed=7))
    sim.load_manifests(REPO / "deploy" / "crds")
    sim.load_manifests(REPO / "examples" / "kai" / "queues.yaml")
    sim.add_nodes(Node(name=f"n{i}", cpu_millis=64_000, memory_bytes=512e9, gpus=8) for i in range(2))
    await sim.start()
    sim.write_kubeconfig(tmp_path / "kubeconfig")
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    kube = await connect(str(tmp_path / "kubeconfig"))
    options = KubeSourceOptions(debounce=0.01, problem_settle=0.5)
    owner = KubeOwner(ctx, replica, str(tmp_path / "kubeconfig"), options)
    await owner.start()
    stack = Stack(kube, owner, replica, ctx, str(tmp_path / "kubeconfig"), options, sim)
    try:
        yield stack
    finally:
        await stack.owner.stop()
        await kube.close()
        await replica.stop()
        await sim.stop()


def queue(name: str, *, parent: str = "default-parent-queue", gpu_quota: float = -1) -> dict[str, Any]:
    return queue_manifest(name, parent, gpu_quota=gpu_quota, weight=1)


def podgroup(name: str, min_member: int, queue_name: str = "default-queue") -> dict[str, Any]:
    return podgroup_manifest(name, min_member, queue_name)


def pod(name: str, group: str, annotations: dict[str, str] | None = None, gpus: int = 0) -> dict[str, Any]:
    limits = {"cpu": "1"} | ({keys.NVIDIA_GPU: str(gpus)} if gpus else {})
    return pod_manifest(
        name,
        labels={keys.QUEUE_LABEL: "default-queue"},
        annotations={keys.PODGROUP_ANNOTATION: group} | (annotations or {}),
        limits=limits,
    )


async def create_queue(kube: Kube, body: dict[str, Any]) -> None:
    await kube.call(
        "create queue", kube.custom.create_cluster_custom_object, "scheduling.run.ai", "v2", "queues", body
    )


async def read_queue(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call(
        "read queue", kube.custom.get_cluster_custom_object, "scheduling.run.ai", "v2", "queues", name
    )
    return json.loads(raw)  # type: ignore[no-any-return]


async def patch_queue(kube: Kube, name: str, patch: dict[str, Any]) -> None:
    await kube.call(
        "patch queue",
        kube.custom.patch_cluster_custom_object,
        "scheduling.run.ai",
        "v2",
        "queues",
        name,
        patch,
        _content_type="application/merge-patch+json",
    )


async def create_podgroup(kube: Kube, body: dict[str, Any]) -> None:
    await kube.call(
        "create podgroup",
        kube.custom.create_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        body,
    )


async def read_podgroup(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call(
        "read podgroup",
        kube.custom.get_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        name,
    )
    return json.loads(raw)  # type: ignore[no-any-return]


async def create_pod(kube: Kube, body: dict[str, Any]) -> None:
    await kube.call("create pod", kube.core.create_namespaced_pod, "default", body)


async def read_pod(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call("read pod", kube.core.read_namespaced_pod, name, "default")
    return json.loads(raw)  # type: ignore[no-any-return]


async def events(kube: Kube) -> list[dict[str, Any]]:
    raw = await kube.call("list events", kube.core.list_namespaced_event, "default")
    return json.loads(raw)["items"]  # type: ignore[no-any-return]


async def eventually(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll `check` until it returns something truthy; fails naming `what` after `WAIT` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            pytest.fail(f"not within {WAIT:.0f} s: {what}")
        await asyncio.sleep(0.1)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


async def warning(kube: Kube, name: str, reason: str, words: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The newest Warning Event `reason` on `name` whose message has every one of `words`."""
    found = [
        e
        for e in await events(kube)
        if e["involvedObject"]["name"] == name
        and e["reason"] == reason
        and e["type"] == "Warning"
        and all(word in e["message"] for word in words)
    ]
    return found[-1] if found else None


def mirrored(replica: StateReplica, name: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return isinstance(replica.records.get(s.pod_key("default", name)), PodRecord)

    return check


async def test_each_invalid_object_gets_an_event_and_a_condition_naming_the_field(stack: Stack) -> None:
    kube = stack.kube
    await create_queue(kube, queue("negative", gpu_quota=-5))
    await create_queue(kube, queue("loop-a", parent="loop-b"))
    await create_queue(kube, queue("loop-b", parent="loop-a"))
    await create_queue(kube, queue("orphan", parent="nowhere"))
    await create_podgroup(kube, podgroup("work", 1))
    await create_podgroup(kube, podgroup("gang", 3))
    await create_pod(kube, pod("fraction-abc", "work", {"gpu-fraction": "abc"}))
    await create_pod(kube, pod("fraction-big", "work", {"gpu-fraction": "1.5"}))
    await create_pod(kube, pod("gang-0", "gang", gpus=1))
    await create_pod(kube, pod("fine", "work", gpus=1))

    expected = {
        ("negative", "InvalidQueue"): ["Queue 'negative'", "spec.resources.gpu.quota", "-5"],
        ("loop-a", "InvalidQueue"): ["spec.parentQueue", "cycle of parent queues loop-a -> loop-b -> loop-a"],
        ("loop-b", "InvalidQueue"): ["spec.parentQueue", "cycle of parent queues loop-b -> loop-a -> loop-b"],
        ("orphan", "InvalidQueue"): ["spec.parentQueue", "parent queue 'nowhere' does not exist"],
        ("fraction-abc", "InvalidPod"): ["Pod 'default/fraction-abc'", "annotations[gpu-fraction]", "'abc'"],
        ("fraction-big", "InvalidPod"): ["annotations[gpu-fraction]", "'1.5'", "gpu-fraction-num-devices"],
        ("gang", "WaitingForMinMember"): ["PodGroup 'default/gang'", "spec.minMember", "1 of 3 pods"],
    }
    for (name, reason), words in expected.items():
        await eventually(
            f"a {reason} event on {name} saying {words}",
            lambda n=name, r=reason, w=tuple(words): warning(kube, n, r, w),
        )

    for name in ("negative", "loop-a", "orphan"):
        accepted = condition(await read_queue(kube, name), "Accepted")
        assert accepted is not None, name
        assert (accepted["status"], accepted["reason"]) == ("False", "InvalidQueue")
        assert f"'{name}'" in accepted["message"]
    gang = condition(await read_podgroup(kube, "gang"), "Accepted")
    assert gang is not None
    assert (gang["status"], gang["reason"]) == ("False", "WaitingForMinMember")
    assert "waiting for min member" in gang["message"]
    for name in ("fraction-abc", "fraction-big"):
        scheduled = condition(await read_pod(kube, name), "PodScheduled")
        assert scheduled is not None, name
        assert (scheduled["status"], scheduled["reason"]) == ("False", "InvalidPod")
        assert "gpu-fraction" in scheduled["message"]

    # Held back, the rest goes on: the valid pod next to the invalid ones reached KV, the invalid ones not.
    await eventually("the valid pod in KV", mirrored(stack.replica, "fine"))
    assert s.pod_key("default", "fraction-abc") not in stack.replica.records
    assert s.queue_key("negative") not in stack.replica.records
    assert stack.owner.source is not None
    assert all(not task.done() for task in stack.owner.source._tasks)

    # One Event per distinct problem, however many flushes pass (a queue of a cycle may have said first
    # that its parent did not exist yet: that was another problem).
    await create_pod(kube, pod("later", "work", gpus=1))
    await eventually("a later valid pod in KV", mirrored(stack.replica, "later"))
    await asyncio.sleep(1.0)
    warnings = [
        (e["involvedObject"]["name"], e["reason"], e["message"])
        for e in await events(kube)
        if e["type"] == "Warning"
    ]
    assert len(warnings) == len(set(warnings)), warnings
    assert {(name, reason) for name, reason, _ in warnings} == set(expected)


async def test_a_fixed_object_has_its_condition_set_back_and_is_mirrored(stack: Stack) -> None:
    kube = stack.kube
    await create_queue(kube, queue("negative", gpu_quota=-5))
    await create_podgroup(kube, podgroup("work", 1))
    await create_pod(kube, admitted(pod("fraction", "work", {"gpu-fraction": "abc"})))
    await eventually("the queue's Event", lambda: warning(kube, "negative", "InvalidQueue"))
    await eventually("the pod's Event", lambda: warning(kube, "fraction", "InvalidPod"))

    await patch_queue(kube, "negative", {"spec": {"resources": {"gpu": {"quota": 5}}}})

    async def accepted_again() -> bool:
        accepted = condition(await read_queue(kube, "negative"), "Accepted")
        return accepted is not None and accepted["status"] == "True"

    await eventually("Accepted=True on the fixed queue", accepted_again)
    await eventually("the fixed queue in KV", lambda: _present(stack.replica, s.queue_key("negative")))

    # A pod's annotations may change in place; the fixed pod loses the condition and reaches KV.
    await kube.call(
        "fix pod",
        kube.core.patch_namespaced_pod,
        "fraction",
        "default",
        {"metadata": {"annotations": {"gpu-fraction": "0.5"}}},
        _content_type="application/merge-patch+json",
    )

    async def condition_gone() -> bool:
        return condition(await read_pod(kube, "fraction"), "PodScheduled") is None

    await eventually("PodScheduled=False removed from the fixed pod", condition_gone)
    await eventually("the fixed pod in KV", mirrored(stack.replica, "fraction"))


async def test_a_new_owner_sets_back_what_was_fixed_meanwhile_and_repeats_no_event(stack: Stack) -> None:
    kube = stack.kube
    await create_queue(kube, queue("negative", gpu_quota=-5))
    await create_queue(kube, queue("orphan", parent="nowhere"))
    await eventually("the negative queue's Event", lambda: warning(kube, "negative", "InvalidQueue"))
    await eventually("the orphan's Event", lambda: warning(kube, "orphan", "InvalidQueue"))

    async def accepted(name: str, status: str) -> bool:
        shown = condition(await read_queue(kube, name), "Accepted")
        return shown is not None and shown["status"] == status

    await eventually("Accepted=False on the orphan", lambda: accepted("orphan", "False"))
    await stack.owner.stop()
    await patch_queue(kube, "negative", {"spec": {"resources": {"gpu": {"quota": 5}}}})
    stack.owner = KubeOwner(stack.ctx, stack.replica, stack.kubeconfig, stack.options)
    await stack.owner.start()

    await eventually(
        "Accepted=True on the queue fixed while no owner ran", lambda: accepted("negative", "True")
    )
    await asyncio.sleep(1.0)
    orphans = [e for e in await events(kube) if e["involvedObject"]["name"] == "orphan"]
    assert len(orphans) == 1, orphans
    assert await accepted("orphan", "False")


async def _present(replica: StateReplica, key: str) -> bool:
    return key in replica.records


GARBAGE = (b"", b"\xc1\xff\x00not msgpack", b"\x81\xa4kind\xa4nope", b'{"type": "pod-bound", "v": 1}')


async def test_garbage_on_the_owners_subjects_is_counted_and_dropped(stack: Stack, bus: Bus) -> None:
    kube = stack.kube
    await create_queue(kube, queue("negative", gpu_quota=-5))
    counters = stack.ctx.counters
    before = counters["malformed"]
    subjects = (s.STATE_WHY, s.gpu_inventory("n0"), s.stamps(s.DEFAULT_SHARD))
    for subject in subjects:
        for payload in GARBAGE:
            await bus.nc.publish(subject, payload)
    for payload in GARBAGE:
        await bus.js.publish(s.event("pod-bound", "garbage"), payload)
    await bus.nc.flush()

    async def all_counted() -> bool:
        return counters["malformed"] - before >= len(GARBAGE) * (len(subjects) + 1)

    await eventually("every garbage message counted as malformed", all_counted)
    families = {family for outcome, family in counters.by_subject if outcome == "malformed"}
    assert len(families) >= len(subjects) + 1, families

    # Still answering: `kairos explain`'s question about the held-back queue gets the reason.
    async def why() -> str:
        reply = await bus.nc.request(
            s.STATE_WHY, encode(WhyRequest(what="queue", name="negative")), timeout=5
        )
        return WHY_REPLIES.decode(s.STATE_WHY, reply.data).reason

    reason = await eventually("a reason for the held-back queue", why)
    assert "spec.resources.gpu.quota" in reason


async def test_an_unschedulable_report_refused_with_429_is_written_when_redelivered(
    stack: Stack, bus: Bus
) -> None:
    """The write-back reports a pending podgroup once per message; when the API server answers 429 the event
    comes again, and that redelivery must be written, not taken for a repeat (the chaos run left pods
    pending without a word)."""
    await create_podgroup(stack.kube, podgroup("huge", 1))
    await create_pod(stack.kube, pod("huge-0", "huge", gpus=16))
    await eventually("the pod is mirrored", lambda: _mirrored(stack, "huge-0"))
    stack.sim.faults.set_plan(
        FaultPlan(rules=(FaultRule(verb="create", resource="events", status=429, limit=2),))
    )
    report = PodUnschedulable(
        time=0.0,
        namespace="default",
        podgroup="huge",
        queue="default-queue",
        message="0/2 nodes are available: 2 node(s) didn't have enough resources: GPUs",
    )
    await bus.js.publish(s.event("pod-unschedulable", "default/huge"), EVENT_ENCODER.encode(report))

    async def reported() -> bool:
        return any(
            e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "huge-0"
            for e in await events(stack.kube)
        )

    await eventually("FailedScheduling on huge-0 after two 429s", reported)
    assert stack.sim.faults.injected.get("429", 0) == 2, "the API server refused the first two tries"


async def _mirrored(stack: Stack, name: str) -> bool:
    return any(isinstance(r, PodRecord) and r.pod.name == name for r in stack.replica.records.values())
