"""How the binder reaches the cluster: the `ClusterClient` protocol (bind one pod, evict one pod) and its
NATS implementation (`--set cluster=nats`, the default), which asks the state replica that owns the
in-memory cluster on `cluster.bind` / `cluster.evict`. The Kubernetes implementation of the same protocol
is `services.binder.kube_client` (`--set cluster=kube`).

Called by `services.binder.commit` after a proposal's ledger commit and by the recovery scan (`services.binder.recovery`).

Contract of an implementation: return normally when the cluster accepted (binding a pod that is already
bound to the same node counts as accepted: the operation must be idempotent, because a redelivered
proposal or the recovery scan re-issues it); raise `ClusterRefused` when the cluster answered no and
asking again will not help: a pod bound elsewhere, a pod that is not the one decided on (a binding's or an
eviction's `uid`, when set, names it; another pod created under the same name is refused, never taken
for already bound), an eviction a disruption budget refuses; raise `TemporaryError` when it could not get
an answer after its retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Protocol

from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import (
    CLUSTER_REPLIES,
    Binding,
    BindRequest,
    ClusterReply,
    EvictionOrder,
    EvictRequest,
    encode,
)
from shared.errors import KairosError, MalformedMessage, TemporaryError
from shared.telemetry.spans import note_retry

log = logging.getLogger("kairos.binder.cluster")


class ClusterRefused(KairosError):  # noqa: N818 -- named like the tree's MalformedMessage: the cluster's answer
    """The cluster answered and refused (pod already bound elsewhere, pod gone or created again under its
    name, node gone, an eviction its disruption budget refuses): permanent for this proposal."""

    def __init__(self, operation: str, pod: str, reason: str) -> None:
        self.operation = operation
        self.pod = pod
        self.reason = reason
        self.step = ""
        """The bind step that refused (`services.binder.steps`), set by the runner; "": the binding itself."""
        super().__init__(f"{operation} {pod}: {reason}")

    def in_kube_scheduler_words(self) -> str:
        """The refusal as kube-scheduler's FailedScheduling words a failure of its binding cycle: a bind
        step is a PreBind plugin (``running PreBind plugin "VolumeBinding": binding volumes: ...``), the
        binding its DefaultBinder (``binding rejected: running Bind plugin "DefaultBinder": ...``)."""
        if self.step:
            return (
                f'running PreBind plugin "{KUBE_SCHEDULER_PLUGINS.get(self.step, self.step)}": {self.reason}'
            )
        return f'binding rejected: running Bind plugin "DefaultBinder": {self.reason}'


KUBE_SCHEDULER_PLUGINS = {"volumebinding": "VolumeBinding", "dynamicresources": "DynamicResources"}
"""The kube-scheduler plugin each bind step stands for, by step name (others are named as they are)."""


def pod_replaced(operation: str, pod: str, decided: str, found: str = "") -> ClusterRefused:
    """The refusal for a pod deleted and created again under its name since the decision: `decided` is the
    uid the decision names, `found` the uid under that name now (when known)."""
    now = f" as uid {found}" if found else ""
    return ClusterRefused(operation, pod, f"not the pod decided on (uid {decided}): re-created since{now}")


class ClusterClient(Protocol):
    async def bind(self, binding: Binding) -> None:
        """Bind `binding.pod` to `binding.node` (idempotent); `ClusterRefused` or `TemporaryError`."""
        ...

    async def evict(self, eviction: EvictionOrder) -> None:
        """Evict `eviction.pod` from its node (idempotent); `ClusterRefused` or `TemporaryError`."""
        ...


@dataclass
class NatsClusterClient:
    """`ClusterClient` over NATS request/reply to the state service (which owns the cluster source)."""

    bus: Bus
    counters: Counters = field(default_factory=Counters)
    timeout: float = 2.0
    """Seconds to wait for one reply."""
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)

    async def bind(self, binding: Binding) -> None:
        await self._call("bind", binding.pod, encode(BindRequest(binding=binding)))

    async def evict(self, eviction: EvictionOrder) -> None:
        await self._call("evict", eviction.pod, encode(EvictRequest(eviction=eviction)))

    async def _call(self, operation: str, pod: str, payload: bytes) -> None:
        subject = s.cluster(operation)
        problem = ""
        for attempt in range(self.backoff.attempts):
            if attempt:
                self.counters[f"{operation}_retries"] += 1
                note_retry()
                await asyncio.sleep(self.backoff.delay(attempt - 1, self.rng))
            try:
                msg = await self.bus.nc.request(subject, payload, timeout=self.timeout)
                reply: ClusterReply = CLUSTER_REPLIES.decode(subject, msg.data)
            except MalformedMessage as exc:
                # A reply we cannot read says nothing about whether the operation happened; the operation is
                # idempotent, so asking again is safe.
                problem = str(exc)
            except Exception as exc:  # noqa: BLE001 -- nats-py raises TimeoutError, NoRespondersError or a
                # connection error (reconnecting, draining): each means "no answer", and all are retried.
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if reply.ok:
                    return
                raise ClusterRefused(operation, pod, reply.error or "refused")
            log.debug("%s %s: attempt %d got no answer (%s)", operation, pod, attempt + 1, problem)
        raise TemporaryError(
            f"{operation} {pod}: no answer from {subject} after {self.backoff.attempts} attempts ({problem})",
            delay=self.backoff.cap,
        )
