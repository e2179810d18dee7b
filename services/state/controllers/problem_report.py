"""The problem report: what users see, in Kubernetes, of the objects the state service holds back.

Run by the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`), woken after each flush
of the mirror. Objects the mirror holds back for a fault of their own (`Mirror.reportable`) get a Warning
Event `InvalidQueue`, `InvalidPodGroup` or `InvalidPod` naming the object and the field, and a condition
(Queue/PodGroup `Accepted=False`, pod `PodScheduled=False`), set back when the object is fixed; a stage held
for its dependencies gets its reason (`WaitingForDependencies`, a Normal Event, or `DependencyFailed`,
`DependencyCycle`), on the PodGroup and on the workload it was made for; a gang short of its min member gets
`WaitingForMinMember` once the shortage has lasted `settle` seconds. The problems, their reasons and the
condition patches are `services.state.mirror.problems`'; the Events' clock and the pod status patch are the
write-back's (`services.state.controllers.writeback`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.state.controllers.writeback import NOT_FOUND, event_time, patch_pod_status
from services.state.mirror import problems
from services.state.mirror.cache import Mirror
from services.state.mirror.problems import Problem
from services.state.mirror.raw_objects import PODGROUPS, PODS, QUEUES
from shared.bus.service import ServiceContext
from shared.kube import translate, wire
from shared.kubeapi.client import ApiError, Kube

log = logging.getLogger("kairos.state.writeback")


async def write_event(
    kube: Kube,
    ctx: ServiceContext,
    about: translate.InvolvedObject,
    problem: Problem,
    label: str,
    component: str,
) -> None:
    """The Event that tells users of `problem` on the object `about` (`label` names it in logs): Normal
    for the waiting reasons, else Warning. Also used by the shard watch for an invalid SchedulingShard."""
    body = translate.event(
        about,
        reason=problem.reason,
        message=problem.message,
        now=event_time(),
        type="Normal" if problem.reason in problems.NORMAL_REASONS else "Warning",
        component=component,
    )
    await kube.call(
        f"create event on {label}",
        kube.core.create_namespaced_event,
        about.namespace or "default",
        body,
    )
    ctx.counters["kube_events"] += 1


OWNERS_TOLD_KEPT = 10_000
"""The most (owner, problem) pairs remembered as told; the oldest is forgotten first (told again at worst)."""


@dataclass(frozen=True)
class ProblemReportOptions:
    component: str = "kai-scheduler"
    settle: float = 5.0
    """Seconds a gang must stay short of its min member before it is reported: a Job's pods arrive one by
    one, and each count on the way is not worth an Event."""
    interval: float = 0.5
    """Seconds at least between two rounds: flushes come many times a second under load, problems do not."""


class ProblemReport:
    """Shows the mirror's problems (`Mirror.reportable`) in Kubernetes: one Warning Event per distinct
    problem and the object's condition (`services.state.mirror.problems`), set back once the object is fixed.

    Woken after a flush (`wake`, at most every `interval` seconds) and every `settle` seconds; the API calls run on its own task, so a
    slow API server never delays KV. What was reported is remembered by (reason, message): the same problem
    is written once, a changed one again. An object whose condition already shows the problem (a restarted
    owner) gets no second Event. A temporary API failure leaves the problem for the next round.
    """

    def __init__(
        self, ctx: ServiceContext, kube: Kube, mirror: Mirror, options: ProblemReportOptions
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.options = options
        self._reported: dict[str, Problem] = {}
        self._owners_told: dict[tuple[str, str, str], None] = {}
        """(owner, reason, message) already told on the owner, oldest first."""
        self._since: dict[str, float] = {}
        """Label -> loop time its min-member shortage was first seen."""
        self._wake = asyncio.Event()
        self._swept = False
        self._task: asyncio.Task[None] | None = None
        self.scope: Callable[[Problem], bool] | None = None
        """Which objects' problems this replica reports (None: every object's): with state partitions, the
        objects of the partitions it owns. A problem out of scope is forgotten, not set back: its object's
        partition is another replica's now."""

    def resweep(self) -> None:
        """Look again, at the next round, for conditions an earlier owner left on objects fixed since (a
        partition was gained)."""
        self._swept = False
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.settle)
            # The first round after a flush (the mirror holds the whole cluster) also sets back conditions an
            # earlier owner left on objects fixed since.
            sweep = self._wake.is_set() and not self._swept
            self._wake.clear()
            try:
                await self.report(loop.time(), sweep=sweep)
                self._swept = self._swept or sweep
            except Exception:
                log.exception("reporting held-back objects failed; trying again next round")
            await asyncio.sleep(self.options.interval)

    async def report(self, now: float, *, sweep: bool = False) -> None:
        """One round: write what is new or changed, set back what was fixed (with `sweep`, also what an
        earlier owner reported and nobody set back)."""
        found = self.mirror.reportable()
        if self.scope is not None:
            scope = self.scope
            found = {label: problem for label, problem in found.items() if scope(problem)}
            self._reported = {label: p for label, p in self._reported.items() if scope(p)}
        if sweep:
            for problem in self._left_behind(found):
                if self.scope is None or self.scope(problem):
                    self._reported.setdefault(problem.label, problem)
        self._since = {label: self._since.get(label, now) for label in found}
        for label, problem in sorted(found.items()):
            if (
                problem.reason == problems.WAITING_FOR_MIN_MEMBER
                and now - self._since[label] < self.options.settle
            ):
                continue
            if self._reported.get(label) == problem:
                continue
            if await self._attempt(self._show, problem):
                self._reported[label] = problem
        for label, problem in sorted(self._reported.items()):
            if label not in found and await self._attempt(self._clear, problem):
                del self._reported[label]

    async def _attempt(self, call: Callable[[Problem], Awaitable[None]], problem: Problem) -> bool:
        """`call(problem)`; False (try again later) on a temporary API failure, True otherwise."""
        try:
            await call(problem)
        except ApiError as exc:
            if exc.temporary:
                return False
            if exc.status != NOT_FOUND:
                self.ctx.counters["writeback_refused"] += 1
                log.warning("could not report %s: %s", problem.label, exc)
        return True

    def _left_behind(self, found: dict[str, Problem]) -> list[Problem]:
        """Objects whose condition shows one of Kairos's problems that the mirror no longer finds."""
        left: list[Problem] = []
        kinds: tuple[tuple[problems.ProblemKind, str], ...] = (
            ("Queue", QUEUES),
            ("PodGroup", PODGROUPS),
            ("Pod", PODS),
        )
        for kind, plural in kinds:
            condition = problems.POD_SCHEDULED if kind == "Pod" else problems.ACCEPTED
            for raw in self.mirror.raw[plural].values():
                shown = next(
                    (
                        c
                        for c in raw.status.conditions
                        if c.type == condition and c.status == "False" and c.reason in problems.OWN_REASONS
                    ),
                    None,
                )
                if shown is None:
                    continue
                meta = raw.metadata
                problem = Problem(
                    kind=kind,
                    namespace=meta.namespace,
                    name=meta.name,
                    reason=shown.reason,
                    message=shown.message,
                )
                if problem.label not in found:
                    left.append(problem)
        return left

    def _raw(self, problem: Problem) -> Any:
        kind = {"Queue": QUEUES, "PodGroup": PODGROUPS, "Pod": PODS}[problem.kind]
        return self.mirror.raw[kind].get(wire.object_name(problem.namespace, problem.name))

    async def _show(self, problem: Problem) -> None:
        raw = self._raw(problem)
        conditions = raw.status.conditions if raw is not None else []
        if problems.shows(conditions, problem):
            return
        log.log(
            logging.INFO if problem.reason in problems.NORMAL_REASONS else logging.WARNING,
            "%s held back: %s",
            problem.label,
            problem.message,
        )
        about = (
            translate.involved_object(raw)
            if raw is not None
            else translate.InvolvedObject(
                api_version=problems.API_VERSIONS[problem.kind],
                kind=problem.kind,
                name=problem.name,
                namespace=problem.namespace,
            )
        )
        await self._event(about, problem, problem.label)
        self.ctx.counters["problems_reported"] += 1
        if problem.owner is not None:
            await self._tell_owner(problem.owner, problem)
        if (
            problem.reason in problems.STAGE_REASONS.values() or problem.reason == problems.INVALID_PODGROUP
        ) and raw is not None:
            await self._tell_workload(raw, problem)
        if problem.kind == "Pod" and raw is not None and raw.spec.node_name:
            return  # a pod already on its node keeps its PodScheduled; the Event says what is wrong
        await self._condition(problem, conditions, problem)

    async def _tell_workload(self, group: Any, problem: Problem) -> None:
        """A stage's wait, and a PodGroup's refusal (an annotation its top owner passed on), also go on the
        workload the user created (the PodGroup's owner: a Job, or the pod of a Deployment or a bare pod),
        where `kubectl describe` shows them."""
        refs = group.metadata.owner_references
        if not refs:
            return
        ref = refs[0]
        about = translate.InvolvedObject(
            api_version=ref.api_version,
            kind=ref.kind,
            name=ref.name,
            namespace=group.metadata.namespace,
            uid=ref.uid,
        )
        await self._event(about, problem, f"{ref.kind} {group.metadata.namespace}/{ref.name}")

    async def _tell_owner(self, owner: translate.InvolvedObject, problem: Problem) -> None:
        """The Warning Event on the owner whose fault held its pod back (a malformed worker group, a size of
        0), once per owner and message however many of its pods were refused for it."""
        key = (owner.uid or f"{owner.kind} {owner.namespace}/{owner.name}", problem.reason, problem.message)
        if key in self._owners_told:
            return
        await self._event(owner, problem, f"{owner.kind} {owner.namespace}/{owner.name}")
        self._owners_told[key] = None
        if len(self._owners_told) > OWNERS_TOLD_KEPT:
            del self._owners_told[next(iter(self._owners_told))]

    async def _event(self, about: translate.InvolvedObject, problem: Problem, label: str) -> None:
        await write_event(self.kube, self.ctx, about, problem, label, self.options.component)

    async def _clear(self, problem: Problem) -> None:
        raw = self._raw(problem)
        if raw is not None:
            log.info("%s no longer held back", problem.label)
            await self._condition(problem, raw.status.conditions, None)

    async def _condition(self, about: Problem, conditions: Any, problem: Problem | None) -> None:
        now = event_time()
        what = f"patch {about.label} status"
        if about.kind == "Pod":
            patch = problems.pod_scheduled_patch(conditions, problem, now)
            if patch is not None:
                await patch_pod_status(self.kube, about, patch)
        else:
            patch = problems.accepted_patch(conditions, problem, now)
            if patch is None:
                return
            if about.kind == "Queue":
                await self.kube.call(
                    what,
                    self.kube.custom.patch_cluster_custom_object_status,
                    "scheduling.run.ai",
                    "v2",
                    "queues",
                    about.name,
                    patch,
                    _content_type="application/merge-patch+json",
                )
            else:
                await self.kube.call(
                    what,
                    self.kube.custom.patch_namespaced_custom_object_status,
                    "scheduling.run.ai",
                    "v2alpha2",
                    about.namespace,
                    "podgroups",
                    about.name,
                    patch,
                    _content_type="application/merge-patch+json",
                )
        if patch is not None:
            self.ctx.counters["kube_status_patches"] += 1
