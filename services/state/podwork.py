"""A loop that works on the pods the mirror lists, woken after each flush: the pod-grouper's and the gate
keeper's common shape.

Each round takes the mirror's current candidates (`candidates`), leaves out pods being worked on and pods
whose work was refused at their current resourceVersion (tried again once the pod changes; forgotten once
the pod is no longer a candidate, deleted or done by other means), and works on
the rest concurrently (at most `concurrency` API calls at once is the subclass's business). A round in
which some work failed for a temporary reason is followed by another after `RETRY_AFTER_TEMPORARY`
seconds, so a failing API server is not asked again in a tight loop. Run by the state service's
Kubernetes owner (`services.state.kube_source.KubeOwner`).
"""

from __future__ import annotations

import asyncio

from shared.kube import wire

RETRY_AFTER_TEMPORARY = 1.0


class PodWorkLoop:
    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self._busy: set[str] = set()
        self._refused: dict[str, str] = {}
        """Pod uid -> the resourceVersion whose work was refused."""
        self._task: asyncio.Task[None] | None = None

    # --- what a loop defines ------------------------------------------------------------------------------
    def candidates(self) -> list[wire.Pod]:
        """The pods to work on now (read from the mirror)."""
        raise NotImplementedError

    def begin_round(self) -> None:
        """Called before a round's work starts (drop what the last round cached)."""

    async def work(self, pod: wire.Pod) -> bool:
        """Do the work for one pod; True when it failed for a temporary reason (try again soon). Call
        `refuse(pod)` for a failure that only a change to the pod can cure."""
        raise NotImplementedError

    # --- the loop -----------------------------------------------------------------------------------------
    def refuse(self, pod: wire.Pod) -> None:
        self._refused[pod.metadata.uid] = pod.metadata.resource_version

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            candidates = self.candidates()
            if self._refused:
                present = {p.metadata.uid for p in candidates}
                for uid in self._refused.keys() - present:
                    del self._refused[uid]
            pods = [
                p
                for p in candidates
                if p.metadata.uid not in self._busy
                and self._refused.get(p.metadata.uid) != p.metadata.resource_version
            ]
            if not pods:
                continue
            self.begin_round()
            for pod in pods:
                self._busy.add(pod.metadata.uid)
            retry = await asyncio.gather(*(self._one(pod) for pod in pods))
            if any(retry):
                await asyncio.sleep(RETRY_AFTER_TEMPORARY)
                self._wake.set()

    async def _one(self, pod: wire.Pod) -> bool:
        try:
            return await self.work(pod)
        finally:
            self._busy.discard(pod.metadata.uid)
