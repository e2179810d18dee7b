"""The pod-work loop (`services.state.controllers.podwork.PodWorkLoop`), the pod-grouper's and gate keeper's shape: a
pod whose work was refused waits for a change to the pod, and is forgotten once it is no longer a candidate."""

from __future__ import annotations

import asyncio

from services.state.controllers.podwork import PodWorkLoop
from shared.kube import wire
from tests.builders import pod_manifest, stored


def _pod(uid: str, version: str) -> wire.Pod:
    doc = stored(pod_manifest(f"pod-{uid}", "ns"), uid=uid, resource_version=version, created=None)
    return wire.convert(wire.Pod, doc)


class Refusing(PodWorkLoop):
    def __init__(self) -> None:
        super().__init__()
        self.pods: list[wire.Pod] = []
        self.worked: list[tuple[str, str]] = []
        self.rounds = asyncio.Queue[None]()

    def candidates(self) -> list[wire.Pod]:
        self.rounds.put_nowait(None)
        return list(self.pods)

    async def work(self, pod: wire.Pod) -> bool:
        self.worked.append((pod.metadata.uid, pod.metadata.resource_version))
        self.refuse(pod)
        return False


async def _round(loop: Refusing) -> None:
    loop.wake()
    await asyncio.wait_for(loop.rounds.get(), 5)
    for _ in range(3):  # let the round's work run
        await asyncio.sleep(0)


async def test_a_refused_pod_is_tried_again_only_when_it_changes() -> None:
    loop = Refusing()
    loop.pods = [_pod("a", "1")]
    loop.start()
    try:
        await _round(loop)
        await _round(loop)
        loop.pods = [_pod("a", "2")]
        await _round(loop)
    finally:
        await loop.stop()
    assert loop.worked == [("a", "1"), ("a", "2")]


async def test_a_refused_pod_that_is_no_longer_a_candidate_is_forgotten() -> None:
    loop = Refusing()
    loop.pods = [_pod(str(i), "1") for i in range(50)]
    loop.start()
    try:
        await _round(loop)
        assert len(loop._refused) == 50
        loop.pods = [_pod("7", "1")]  # the others were deleted
        await _round(loop)
    finally:
        await loop.stop()
    assert loop._refused == {"7": ("1", "pod ns/pod-7")}
    assert len(loop.worked) == 50


class Slow(PodWorkLoop):
    """Work that takes until the test releases it: pod "slow" blocks, every other pod is done at once."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: list[wire.Pod] = []
        self.worked: list[tuple[str, str]] = []
        self.release = asyncio.Event()
        self.rounds = asyncio.Queue[None]()

    def candidates(self) -> list[wire.Pod]:
        self.rounds.put_nowait(None)
        return list(self.pods)

    async def work(self, pod: wire.Pod) -> bool:
        self.worked.append((pod.metadata.uid, pod.metadata.resource_version))
        if pod.metadata.uid == "slow":
            await self.release.wait()
        return False


async def test_a_pod_that_arrives_during_a_long_round_is_worked_on_without_waiting_for_it() -> None:
    loop = Slow()
    loop.pods = [_pod("slow", "1")]
    loop.start()
    try:
        await _round(loop)
        loop.pods = [_pod("slow", "1"), _pod("new", "1")]
        await _round(loop)
        assert loop.worked == [("slow", "1"), ("new", "1")]
        loop.release.set()
    finally:
        await loop.stop()


async def test_a_pod_whose_work_is_done_is_not_worked_on_again_until_it_changes() -> None:
    loop = Slow()
    loop.release.set()
    loop.pods = [_pod("a", "1")]
    loop.start()
    try:
        await _round(loop)
        await _round(loop)  # the change the work made has not reached the mirror yet
        loop.pods = [_pod("a", "2")]
        await _round(loop)
    finally:
        await loop.stop()
    assert loop.worked == [("a", "1"), ("a", "2")]
