"""The gate keepers: lift Kairos's scheduling gates from pods that may now be scheduled.

Run by the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`), on the pod-work loop
(`services.state.controllers.podwork`), woken after each flush of the mirror. Each lifts one gate with a JSON patch
that tests and removes it (`services.state.webhook.gate_patches.ungate_patch`): a pod whose gates changed meanwhile
fails the test (422) and is looked at again once its next watch event arrives; a pod that is gone is done;
a temporary API failure is retried a second later.

- `GateKeeper`: the stages' gate `kairos.io/after`. The admission webhook (`services.state.webhook.webhook`)
  gates the pods of a workload that declares `kairos.io/after` when they are created; the mirror decides,
  from what it watches, which podgroups' dependencies have all succeeded and lists their gated pods
  (`Mirror.ungatable`).
- `QuotaGateKeeper`: the quota gate `kairos.io/admission` (the webhook sets it on every pod of ours with
  the state option `quota_gate`). It follows the queue leader's `podgroup-admission` events with an
  ordered consumer that starts from the newest event of each podgroup (so an owner that takes over knows
  every current verdict) and keeps the latest verdict per podgroup. It lifts the gate from the pods a
  verdict lets in (`pods`; the queue leader lets in new gated pods with a new verdict), and while a
  verdict holds some of a podgroup's gated pods it writes one Warning Event `QueueQuotaExceeded` on the
  PodGroup per distinct message (naming the queue and the resource), once those pods carry our gate (pods
  gated by someone else get no Event from us). It runs whatever `quota_gate` says, so pods gated before
  the option was turned off are still let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.state.controllers.podwork import RETRY_AFTER_TEMPORARY, PodWorkLoop
from services.state.mirror.cache import Mirror
from services.state.webhook.gate_patches import is_gated, ungate_patch
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.events import EVENTS, PodGroupAdmission
from shared.errors import MalformedMessage
from shared.explain import admission_hold
from shared.kube import translate, wire
from shared.kube.scheduling_gates import ADMISSION_GATE, GATE
from shared.kubeapi.client import ApiError, Kube

log = logging.getLogger("kairos.state.gates")

GONE = 404
QUOTA_EXCEEDED = "QueueQuotaExceeded"
"""The reason of the Warning Event on a PodGroup the quota gate holds."""
FOLLOW_RETRY = 5.0
"""Seconds between attempts to subscribe to the verdicts."""
ADMISSION_EVENTS = f"{s.PREFIX}.events.{s.token('podgroup-admission')}.>"
"""Every podgroup's `podgroup-admission` events."""


class GateKeeper(PodWorkLoop):
    """Lifts `gate` from the pods `candidates` lists (the stages' gate, from `Mirror.ungatable`)."""

    gate = GATE
    why = "dependencies met"
    """Logged with each lifted gate."""
    counter = "gate"
    """The prefix of its counters: `<counter>s_lifted`, `<counter>_api_errors`, `<counter>_refused`."""

    def __init__(self, ctx: ServiceContext, kube: Kube, mirror: Mirror, concurrency: int = 8) -> None:
        super().__init__()
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self._limit = asyncio.Semaphore(concurrency)

    def candidates(self) -> list[wire.Pod]:
        return self.mirror.ungatable()

    async def work(self, pod: wire.Pod) -> bool:
        """Lift the gate of one pod; True when it should be tried again soon (a temporary failure)."""
        meta = pod.metadata
        patch = ungate_patch(pod, self.gate)
        if patch is None:
            return False
        try:
            async with self._limit:
                await self.kube.call(
                    f"lift the scheduling gate {self.gate} of pod {meta.namespace}/{meta.name}",
                    self.kube.core.patch_namespaced_pod,
                    meta.name,
                    meta.namespace,
                    patch,
                    _content_type="application/json-patch+json",
                )
            self.ctx.counters[f"{self.counter}s_lifted"] += 1
            log.info(
                "pod %s/%s: %s, scheduling gate %s lifted", meta.namespace, meta.name, self.why, self.gate
            )
        except ApiError as exc:
            if exc.temporary:
                self.ctx.counters[f"{self.counter}_api_errors"] += 1
                log.warning(
                    "pod %s/%s: lifting the gate %s failed, will retry: %s",
                    meta.namespace,
                    meta.name,
                    self.gate,
                    exc,
                )
                return True
            if exc.status != GONE:
                self.refuse(pod)
                self.ctx.counters[f"{self.counter}_refused"] += 1
                log.warning(
                    "pod %s/%s: lifting the gate %s was refused: %s",
                    meta.namespace,
                    meta.name,
                    self.gate,
                    exc,
                )
        return False


class QuotaGateKeeper(GateKeeper):
    """The quota gate: follows the queue leader's verdicts, lifts `kairos.io/admission` from the pods of
    admitted podgroups and writes a Warning Event on held ones."""

    gate = ADMISSION_GATE
    why = "its queues have room for its gang"
    counter = "quota_gate"

    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        mirror: Mirror,
        component: str = "kai-scheduler",
        concurrency: int = 8,
    ) -> None:
        super().__init__(ctx, kube, mirror, concurrency)
        self.component = component
        self.verdicts: dict[str, PodGroupAdmission] = {}
        """PodGroup "ns/name" -> its latest verdict (podgroups the mirror holds)."""
        self.lifting: set[str] = set()
        """Podgroups whose pods let in may still carry the gate."""
        self.warns: Callable[[str], bool] | None = None
        """Which podgroups ("ns/name") this replica warns about (None: every one): with state partitions,
        those of its own partitions, so that one verdict gets one Warning."""
        self._warned: dict[str, set[str]] = {}
        """PodGroup "ns/name" -> the messages written as Events since its last verdict without one."""
        self._to_warn: dict[str, PodGroupAdmission] = {}
        self._warn_wake = asyncio.Event()
        self._warn_task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._follow_task: asyncio.Task[None] | None = None
        self._prune_at = 1024

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._warn_task = asyncio.create_task(self._warn_loop())

    def follow(self) -> None:
        """Subscribe to the verdicts (the newest of each podgroup the stream holds, then every new one), on
        a task that tries again every `FOLLOW_RETRY` seconds: a refused subscription (a permission table
        older than the quota gate) costs the quota gate, never the rest of the owner."""
        self._follow_task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        while True:
            try:
                self._sub = await self.ctx.bus.js.subscribe(
                    ADMISSION_EVENTS,
                    stream=s.EVENTS_STREAM,
                    ordered_consumer=True,
                    config=config,
                    cb=self._on_message,
                )
            except Exception as exc:  # noqa: BLE001 -- any failure: say so and try again
                self.ctx.counters["quota_gate_follow_errors"] += 1
                log.warning("cannot follow the quota verdicts (%s); trying again in %g s", exc, FOLLOW_RETRY)
                await asyncio.sleep(FOLLOW_RETRY)
            else:
                return

    async def stop(self) -> None:
        for task in (self._follow_task, self._warn_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._follow_task = self._warn_task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        await super().stop()

    # --- verdicts -----------------------------------------------------------------------------------------
    async def _on_message(self, msg: Msg) -> None:
        try:
            event = EVENTS.decode(msg.subject, msg.data)
        except MalformedMessage as exc:
            self.ctx.counters.message("malformed", msg.subject)
            log.warning("dropped malformed event on %s: %s", msg.subject, exc.problem)
            return
        if isinstance(event, PodGroupAdmission):
            self.on_verdict(event)

    def on_verdict(self, event: PodGroupAdmission) -> None:
        """A verdict arrived: remember it, lift the gates of the pods it lets in, warn about those it holds."""
        key = f"{event.namespace}/{event.podgroup}"
        if key not in self.mirror.raw.podgroups:
            return  # gone since (or long ago: the stream keeps a day of verdicts)
        self.verdicts[key] = event
        self.ctx.counters["quota_verdicts"] += 1
        if event.pods:
            self.lifting.add(key)
            self.wake()
        else:
            self.lifting.discard(key)
        if not event.message:
            self._warned.pop(key, None)
            self._to_warn.pop(key, None)
        elif event.message not in self._warned.get(key, ()) and (self.warns is None or self.warns(key)):
            self._to_warn[key] = event
            self._warn_wake.set()
        if len(self.verdicts) > self._prune_at:
            self._prune()

    def _prune(self) -> None:
        """Forget the verdicts of podgroups that are gone."""
        groups = self.mirror.raw.podgroups
        for key in [key for key in self.verdicts if key not in groups]:
            del self.verdicts[key]
            self._warned.pop(key, None)
            self.lifting.discard(key)
        self._prune_at = max(1024, 2 * len(self.verdicts))

    def candidates(self) -> list[wire.Pod]:
        """The pods let in that still carry the gate; a podgroup none of whose pods let in does is done."""
        out: list[wire.Pod] = []
        for key in sorted(self.lifting):
            verdict = self.verdicts.get(key)
            let_in = set(verdict.pods) if verdict is not None else set()
            namespace, _, name = key.partition("/")
            pods = [
                p
                for p in self.mirror.members(namespace, name)
                if p.metadata.name in let_in and is_gated(p, self.gate)
            ]
            if pods:
                out.extend(pods)
            else:
                self.lifting.discard(key)
        return out

    # --- Warning Events -----------------------------------------------------------------------------------
    async def _warn_loop(self) -> None:
        while True:
            await self._warn_wake.wait()
            self._warn_wake.clear()
            retry = False
            for key, event in list(self._to_warn.items()):
                if self._to_warn.get(key) is not event:
                    continue
                try:
                    await self._warn(key, event)
                except ApiError as exc:
                    if exc.temporary:
                        self.ctx.counters["quota_gate_api_errors"] += 1
                        log.warning("podgroup %s: the quota Event failed, will retry: %s", key, exc)
                        retry = True
                        continue
                    if exc.status != GONE:
                        self.ctx.counters["quota_gate_refused"] += 1
                        log.warning("podgroup %s: the quota Event was refused: %s", key, exc)
                if self._to_warn.get(key) is event:
                    del self._to_warn[key]
            if retry:
                await asyncio.sleep(RETRY_AFTER_TEMPORARY)
                self._warn_wake.set()

    async def _warn(self, key: str, event: PodGroupAdmission) -> None:
        """One Warning Event on the PodGroup, unless none of the pods it holds carries our gate."""
        group = self.mirror.raw.podgroups.get(key)
        if group is None or self.verdicts.get(key) is not event:
            return
        let_in = set(event.pods)
        members = self.mirror.members(event.namespace, event.podgroup)
        if not any(p.metadata.name not in let_in and is_gated(p, self.gate) for p in members):
            return
        body = translate.event(
            translate.involved_object(group),
            reason=QUOTA_EXCEEDED,
            message=admission_hold(event.message),
            now=time.time(),
            type="Warning",
            component=self.component,
        )
        await self.kube.call(
            f"create event on PodGroup {key}",
            self.kube.core.create_namespaced_event,
            group.metadata.namespace or "default",
            body,
        )
        self._warned.setdefault(key, set()).add(event.message)
        self.ctx.counters["kube_events"] += 1
        log.info("podgroup %s: held at admission: %s", key, event.message)
