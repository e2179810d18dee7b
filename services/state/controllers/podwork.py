"""A loop that works on the pods the mirror lists, woken after each flush: the pod-grouper's and the gate
keeper's common shape.

Each round takes the mirror's current candidates (`candidates`), leaves out pods being worked on and pods
whose work was refused at their current resourceVersion (tried again once the pod changes; forgotten once
the pod is no longer a candidate, deleted or done by other means), and works on
the rest concurrently (at most `concurrency` API calls at once is the subclass's business). A round does
not wait for the one before to finish: pods that arrive while a large round is still at work start at the
next wake, beside it (the pods already being worked on are left out), so a burst of a thousand pods does
not hold back the next ones until its last is done. A round in
which some work failed for a temporary reason is followed by another after `RETRY_AFTER_TEMPORARY`
seconds, so a failing API server is not asked again in a tight loop. Run by the state service's
Kubernetes owner (`services.state.sources.kube_source.KubeOwner`); with state partitions by every replica, each on
the candidates of its own partitions (`scope`).

A refusal can say why (`refuse(pod, why)`): the reasons are kept in `refusals` by the pod's label, which the
mirror reports (`Mirror.refusal_sources`) as the pod's Warning Event and PodScheduled=False, until the pod is
worked on again or is no longer a candidate. Work that fails with an unforeseen exception (a bug one pod's
owner or labels reach) refuses that pod alone, saying so, and the loop goes on: no pod a tenant can
write stops the loop for the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shared.kube import wire
from shared.kube.translate.events import InvolvedObject
from shared.kube.values import shown

log = logging.getLogger("kairos.state.podwork")

RETRY_AFTER_TEMPORARY = 1.0


class PodWorkLoop:
    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self._busy: set[str] = set()
        self._refused: dict[str, tuple[str, str]] = {}
        """Pod uid -> (the resourceVersion whose work was refused, the pod's label)."""
        self._done: dict[str, str] = {}
        """Pod uid -> the resourceVersion whose work is done: not done again until the pod changes (the
        change the work made, an annotation or a gate lifted, arrives on the watch a moment later)."""
        self.refusals: dict[str, str] = {}
        """Pod label ("pod ns/name") -> why its work was refused, for the refusals that said why."""
        self.refusal_owners: dict[str, InvolvedObject] = {}
        """Pod label -> the owner whose fault the refusal names, which is told too (`refuse(owner=...)`)."""
        self.unforeseen = 0
        """Pods whose work failed with an unforeseen exception (each one refused and logged)."""
        self._task: asyncio.Task[None] | None = None
        self._rounds: set[asyncio.Task[None]] = set()
        self.scope: Callable[[wire.Pod], bool] | None = None
        """Which candidates this replica works on (None: every one): with state partitions, the pods of
        the partitions it owns (`services.state.sources.partitioned_source`)."""

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
    def refuse(self, pod: wire.Pod, why: str = "", owner: InvolvedObject | None = None) -> None:
        """Leave `pod` alone until it changes; `why`, when given, is reported on the pod, and on `owner`
        when the fault is that owner's."""
        label = _label(pod)
        self._refused[pod.metadata.uid] = (pod.metadata.resource_version, label)
        if why:
            self.refusals[label] = why
        if owner is not None:
            self.refusal_owners[label] = owner
        else:
            self.refusal_owners.pop(label, None)

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        tasks = [*self._rounds, *([self._task] if self._task is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._rounds.clear()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            task = asyncio.create_task(self._guarded_round())
            self._rounds.add(task)
            task.add_done_callback(self._rounds.discard)
            # Let the round take its pods (mark them busy) before the next wake looks at the candidates.
            await asyncio.sleep(0)

    async def _guarded_round(self) -> None:
        try:
            await self._round()
        except Exception:  # the loop outlives any one round; the next wake tries again
            log.exception("a round of pod work failed; waiting for the next flush")

    async def _round(self) -> None:
        candidates = self.candidates()
        if self.scope is not None:
            scope = self.scope
            candidates = [p for p in candidates if scope(p)]
        if self._refused or self._done:
            present = {p.metadata.uid for p in candidates}
            for uid in self._refused.keys() - present:
                _, label = self._refused.pop(uid)
                self.refusals.pop(label, None)
                self.refusal_owners.pop(label, None)
            for uid in self._done.keys() - present:
                del self._done[uid]
        pods = [
            p
            for p in candidates
            if p.metadata.uid not in self._busy
            and self._refused.get(p.metadata.uid, ("", ""))[0] != p.metadata.resource_version
            and self._done.get(p.metadata.uid) != p.metadata.resource_version
        ]
        if not pods:
            return
        self.begin_round()
        for pod in pods:
            self._busy.add(pod.metadata.uid)
        retry = await asyncio.gather(*(self._one(pod) for pod in pods))
        if any(retry):
            await asyncio.sleep(RETRY_AFTER_TEMPORARY)
            self._wake.set()

    async def _one(self, pod: wire.Pod) -> bool:
        label = _label(pod)
        try:
            retry = await self.work(pod)
        except Exception as exc:  # one pod's content must never stop the loop for the others
            self.unforeseen += 1
            log.exception("%s: its work failed unforeseen; it is left alone until it changes", label)
            why = f"could not be handled ({type(exc).__name__}: {shown(str(exc))})"
            self.refuse(pod, f"Pod {label.removeprefix('pod ')!r}: {why}")
            return False
        finally:
            self._busy.discard(pod.metadata.uid)
        if self._refused.get(pod.metadata.uid, ("", ""))[0] != pod.metadata.resource_version:
            self.refusals.pop(label, None)
            self.refusal_owners.pop(label, None)
            if not retry:
                self._done[pod.metadata.uid] = pod.metadata.resource_version
        return retry


def _label(pod: wire.Pod) -> str:
    return f"pod {pod.metadata.namespace}/{pod.metadata.name}"
