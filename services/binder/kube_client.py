"""The binder's `ClusterClient` against a Kubernetes API server (`--set cluster=kube`).

Called by `services.binder.commit` after a proposal's ledger commit and by the recovery scan, exactly like
the NATS client it replaces. A bind is a `pods/binding` POST after the bind steps that apply to it
(`services.binder.steps`, built once here in `step_order`): by default a binding with volume decisions
first carries them out (`volumes.VolumeSteps`: a static volume reserved for its claim, or the claim's
selected-node set), then its resource claims' allocations and reservations (`claims.ClaimSteps`), then,
for a binding with GPU groups (a fractional pod), GPU sharing's reservation (`gpu_sharing_step.GpuSharing`:
group labels, one reservation pod per shared device, the pod's GPU-sharing ConfigMaps); a refused binding
undoes them in reverse; an ordinary pod's bind makes no other API call. An eviction is a
`pods/eviction` POST (the Eviction API, so that disruption budgets are honoured). Both carry the pod's uid
when the decision knows it (the Binding's `metadata.uid`, the eviction's `deleteOptions.preconditions.uid`,
as kube-scheduler sends them), so the API server refuses them (409) for a pod deleted and created again
under the same name since the decision. Both are idempotent as the protocol requires:

- a 409 on a binding means the pod already has a node, or is not the pod the decision was taken for: the
  pod is read back; the same pod on our node means the earlier attempt (or another binder) succeeded and
  we are done; another pod under that name, or our pod on another node, is refused (never bound twice,
  never taken for bound);
- a 404 on an eviction means the pod is already gone, which is what was asked; a 409 means the pod under
  that name is another one now, and is refused.

A PodDisruptionBudget that refuses an eviction (429 with a DisruptionBudget cause, or 500 for a pod several
budgets select: `ApiError.budget`) is a refusal, as kube-scheduler's preemption treats it: `ClusterRefused`
at once, no retry, and a Warning Event `FailedEviction` on the victim naming the budget and the decision
(once per victim and message every `repeat_after` seconds, however many cycles propose it again).
Other 429 answers (API Priority and Fairness throttling), 5xx and no answer at all are retried with
backoff; when the attempts run out the call raises `TemporaryError` and the proposal is retried later.
Other refusals raise `ClusterRefused`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.binder.claims import ClaimSteps
from services.binder.cluster_client import ClusterRefused, pod_replaced
from services.binder.gpu_sharing_step import EVENT_COMPONENT, GpuSharing, ReservationSettings
from services.binder.steps import DEFAULT_ORDER, BindSteps
from services.binder.volumes import VolumeSteps
from shared.backoff import Backoff
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding, EvictionOrder
from shared.errors import TemporaryError
from shared.kube import translate, wire
from shared.kubeapi.client import ApiError, Kube
from shared.kubeapi.paths import collection_path, object_path
from shared.telemetry.spans import counting_retries, note_retry

log = logging.getLogger("kairos.binder.kube")

CONFLICT = 409
NOT_FOUND = 404
FAILED_EVICTION = "FailedEviction"
"""The reason of the Warning Event on a victim whose eviction the cluster refused."""


@dataclass
class KubeClusterClient:
    kube: Kube
    counters: Counters = field(default_factory=Counters)
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    settings: ReservationSettings = field(default_factory=ReservationSettings)
    clock: Callable[[], float] = time.time
    """Wall clock (Unix s): Event times and their repeats."""
    repeat_after: float = 300.0
    """Seconds before the same refusal of the same victim is reported again (the state service's
    write-back repeats its FailedScheduling after as long)."""
    step_order: tuple[str, ...] = DEFAULT_ORDER
    """The bind steps every bind runs, by name, in order (`services.binder.steps`); an unknown or repeated
    name fails here, at start (`ConfigError`)."""
    sharing: GpuSharing = field(init=False)
    """GPU sharing's calls, built from the fields above: the ``gpusharing`` step; `service` runs its sync."""
    volumes: VolumeSteps = field(init=False)
    """The ``volumebinding`` step: a binding with WaitForFirstConsumer claims (`services.binder.volumes`)."""
    claims: ClaimSteps = field(init=False)
    """The ``dynamicresources`` step: a binding with resource claims (`services.binder.claims`)."""
    steps: BindSteps = field(init=False)
    """The steps of `step_order`, built once from the three above."""
    _reported: dict[str, tuple[str, float]] = field(default_factory=dict, init=False)
    """Victim pod key -> the refusal last reported on it, and when."""

    def __post_init__(self) -> None:
        self.sharing = GpuSharing(
            self.kube, self.counters, settings=self.settings, backoff=self.backoff, rng=self.rng
        )
        self.volumes = VolumeSteps(self.kube, self.counters, backoff=self.backoff, rng=self.rng)
        self.claims = ClaimSteps(self.kube, self.counters, backoff=self.backoff, rng=self.rng)
        self.steps = BindSteps.build(
            self.step_order, (self.volumes, self.claims, self.sharing), self.counters
        )

    async def bind(self, binding: Binding) -> None:
        """The steps that apply to `binding`, then its ``pods/binding`` POST (`BindSteps.run`)."""
        await self.steps.run(binding, self._bind)

    async def _bind(self, binding: Binding) -> None:
        what = f"pod {binding.namespace}/{binding.name}"
        try:
            metadata = {"name": binding.name, "namespace": binding.namespace}
            if binding.uid:
                metadata["uid"] = binding.uid  # the API server's precondition on the pod it binds
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": binding.node},
            }
            path = object_path("v1", "Pod", binding.namespace, binding.name) + "/binding"
            await self.kube.request_with_retries(
                f"bind {what}", "POST", path, body, backoff=self.backoff, rng=self.rng, on_retry=note_retry
            )
        except ApiError as exc:
            if exc.status == CONFLICT:
                await self._confirm_bound(binding, what, exc)
                return
            raise ClusterRefused("bind", binding.pod, str(exc)) from exc
        self.counters["kube_binds"] += 1

    async def evict(self, eviction: EvictionOrder) -> None:
        what = f"pod {eviction.namespace}/{eviction.name}"
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": eviction.name, "namespace": eviction.namespace},
        }
        if eviction.uid:
            body["deleteOptions"] = {"preconditions": {"uid": eviction.uid}}
        try:
            await self._retrying(
                f"evict {what}",
                self.kube.core.create_namespaced_pod_eviction,
                eviction.name,
                eviction.namespace,
                body,
            )
        except ApiError as exc:
            if exc.status == NOT_FOUND:
                self.counters["kube_evictions_gone"] += 1
                return
            if exc.budget:
                self.counters["kube_evictions_refused_by_budget"] += 1
                await self._report_refusal(eviction, exc.budget)
                raise ClusterRefused(
                    "evict", eviction.pod, f"refused by its disruption budget: {exc.budget}"
                ) from exc
            if exc.status == CONFLICT and eviction.uid:  # the uid precondition failed
                self.counters["kube_evictions_pod_replaced"] += 1
                raise pod_replaced("evict", eviction.pod, eviction.uid) from exc
            raise ClusterRefused("evict", eviction.pod, str(exc)) from exc
        self.counters["kube_evictions"] += 1

    async def _report_refusal(self, eviction: EvictionOrder, said: str) -> None:
        """A Warning Event on the victim saying what refused its eviction and what it was for; the same
        refusal of the same victim again within `repeat_after` is not reported again. A failure to write
        it is logged and counted, never raised (the refusal stands)."""
        now = self.clock()
        for key, (_, when) in list(self._reported.items()):
            if now - when >= self.repeat_after:
                del self._reported[key]
        message = (
            f"Not evicted ({eviction.message}): {said.rstrip('.')}. "
            "The scheduler decides again on the cluster as it then is."
        )
        if self._reported.get(eviction.pod, ("", 0.0))[0] == message:
            return
        self._reported[eviction.pod] = (message, now)
        about = translate.InvolvedObject(
            api_version="v1", kind="Pod", name=eviction.name, namespace=eviction.namespace, uid=eviction.uid
        )
        body = translate.event(
            about, reason=FAILED_EVICTION, message=message, now=now, type="Warning", component=EVENT_COMPONENT
        )
        what = f"create event on pod {eviction.namespace}/{eviction.name}"
        try:
            await self.kube.request_with_retries(
                what,
                "POST",
                collection_path("v1", "Event", eviction.namespace),
                body,
                backoff=self.backoff,
                rng=self.rng,
            )
        except (ApiError, TemporaryError) as exc:
            self.counters["event_errors"] += 1
            log.warning(
                "could not record %s on %s/%s: %s", FAILED_EVICTION, eviction.namespace, eviction.name, exc
            )
            return
        self.counters["kube_events"] += 1

    async def _confirm_bound(self, binding: Binding, what: str, conflict: ApiError) -> None:
        """After a 409: accepted if the pod decided on is on our node already; refused if it is anywhere
        else, or if the pod under that name is another one (created again since the decision)."""
        try:
            raw = await self._retrying(
                f"get {what}", self.kube.core.read_namespaced_pod, binding.name, binding.namespace
            )
        except ApiError as exc:
            raise ClusterRefused("bind", binding.pod, f"{conflict}; then {exc}") from exc
        pod = wire.decode_pod(raw)
        if binding.uid and pod.metadata.uid != binding.uid:
            # The pod under this name is not the one decided on: whatever its node, ours was never bound.
            self.counters["kube_binds_pod_replaced"] += 1
            raise pod_replaced("bind", binding.pod, binding.uid, pod.metadata.uid)
        if pod.spec.node_name == binding.node:
            self.counters["kube_binds_already_done"] += 1
            return
        where = pod.spec.node_name or "no node"
        raise ClusterRefused("bind", binding.pod, f"already bound to {where}, not {binding.node}")

    async def _retrying(self, what: str, method: Any, *args: Any, **kwargs: Any) -> bytes:
        return await self.kube.call_with_retries(
            what, counting_retries(method), *args, backoff=self.backoff, rng=self.rng, **kwargs
        )
