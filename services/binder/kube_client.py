"""The binder's `ClusterClient` against a Kubernetes API server (`--set cluster=kube`).

Called by `services.binder.commit` after a proposal's ledger commit and by its recovery scan, exactly like
the NATS client it replaces. A bind is a `pods/binding` POST; a binding with GPU groups (a fractional pod)
first runs `reservations.GpuSharing.prepare` (group labels, one reservation pod per shared device, the
pod's GPU-sharing ConfigMaps), while an ordinary pod's bind makes no other API call. An eviction is a
`pods/eviction` POST (the Eviction API, so that disruption budgets are honoured). Both are idempotent as
the protocol requires:

- a 409 on a binding means the pod already has a node: if it is ours, the earlier attempt (or another
  binder) succeeded and we are done; if it is another node, the pod is refused — never bound twice;
- a 404 on an eviction means the pod is already gone, which is what was asked.

429 and 5xx answers and no answer at all are retried with backoff; when the attempts run out the call
raises `TemporaryError` and the proposal is retried later. Other refusals raise `ClusterRefused`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from services.binder.cluster_client import ClusterRefused
from services.binder.reservations import GpuSharing, ReservationSettings
from shared.backoff import Backoff
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding, EvictionOrder
from shared.kube import wire
from shared.kubeapi.client import ApiError, Kube
from shared.kubeapi.paths import object_path
from shared.telemetry.spans import counting_retries, note_retry

CONFLICT = 409
NOT_FOUND = 404


@dataclass
class KubeClusterClient:
    kube: Kube
    counters: Counters = field(default_factory=Counters)
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    settings: ReservationSettings = field(default_factory=ReservationSettings)
    sharing: GpuSharing = field(init=False)
    """GPU sharing's calls, built from the fields above; `service` runs its sync."""

    def __post_init__(self) -> None:
        self.sharing = GpuSharing(
            self.kube, self.counters, settings=self.settings, backoff=self.backoff, rng=self.rng
        )

    async def bind(self, binding: Binding) -> None:
        what = f"pod {binding.namespace}/{binding.name}"
        if not binding.gpu_groups:
            await self._bind(binding, what)
            return
        async with self.sharing.binding(binding.gpu_groups):
            await self.sharing.prepare(binding)
            await self._bind(binding, what)

    async def _bind(self, binding: Binding, what: str) -> None:
        try:
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": binding.name, "namespace": binding.namespace},
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
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": eviction.name, "namespace": eviction.namespace},
        }
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
            raise ClusterRefused("evict", eviction.pod, str(exc)) from exc
        self.counters["kube_evictions"] += 1

    async def _confirm_bound(self, binding: Binding, what: str, conflict: ApiError) -> None:
        """After a 409: accepted if the pod is on our node already, refused if it is anywhere else."""
        try:
            raw = await self._retrying(
                f"get {what}", self.kube.core.read_namespaced_pod, binding.name, binding.namespace
            )
        except ApiError as exc:
            raise ClusterRefused("bind", binding.pod, f"{conflict}; then {exc}") from exc
        pod = wire.decode_pod(raw)
        if pod.spec.node_name == binding.node:
            self.counters["kube_binds_already_done"] += 1
            return
        where = pod.spec.node_name or "no node"
        raise ClusterRefused("bind", binding.pod, f"already bound to {where}, not {binding.node}")

    async def _retrying(self, what: str, method: Any, *args: Any, **kwargs: Any) -> bytes:
        return await self.kube.call_with_retries(
            what, counting_retries(method), *args, backoff=self.backoff, rng=self.rng, **kwargs
        )
