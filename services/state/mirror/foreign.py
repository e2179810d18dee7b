"""What pods Kairos does not schedule hold on each node, so that KV never offers it twice.

Owned by the mirror (`services.state.mirror.cache.Mirror`). A pod that does not go to KV as a pod of ours but
sits on a node and has not finished — another scheduler's pod, or a pod of ours whose podgroup is gone or
held back — holds that node's CPU, memory, GPUs, a pod slot, its other countable resources (extended
resources, huge pages, ephemeral storage) and its host ports (`holding`); the mirror counts it here
(`count`, `uncount`) and takes each node's total (`on`) off its capacity (`subtract`).

The binder's GPU reservation pods are the exception: the device one holds is its GPU group's, already
counted by the group's sharers. The live sharers (`gpu_sharing.is_live_sharer`: Pending or Running, one
being deleted included, which KV holds as Releasing with its groups until its containers have stopped)
and the reservation pods of each group are indexed here
(`track`), and a group that gains its first sharer or loses its last has its reservation pods recounted.
Without live sharers a reservation pod counts as what it is, a pod holding a GPU, until the binder deletes
it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec

from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys, translate, wire
from shared.model import HostPort, Node


@dataclass
class Footprint:
    """What one pod, or all the pods counted on one node, take of that node."""

    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    gpus: int = 0
    pods: int = 0
    scalars: dict[str, float] = field(default_factory=dict)
    """`Node.scalars` taken (`Pod.scalars`)."""
    host_ports: Counter[HostPort] = field(default_factory=Counter)
    """Host ports bound, each as often as bound."""

    def add(self, other: Footprint, sign: int) -> None:
        self.cpu_millis += sign * other.cpu_millis
        self.memory_bytes += sign * other.memory_bytes
        self.gpus += sign * other.gpus
        self.pods += sign * other.pods
        for name, amount in other.scalars.items():
            self.scalars[name] = self.scalars.get(name, 0.0) + sign * amount
        if other.host_ports:
            if sign > 0:
                self.host_ports.update(other.host_ports)
            else:
                self.host_ports.subtract(other.host_ports)
                self.host_ports = +self.host_ports  # drops the ports no pod binds any more


class ForeignPods:
    """The pods counted on each node, and the GPU-group index that decides whether a reservation counts."""

    def __init__(self) -> None:
        self._counted: dict[str, tuple[str, Footprint]] = {}
        """Pod "ns/name" -> (its node, what it holds there), for the pods counted."""
        self._on: dict[str, Footprint] = {}
        """Node -> what the pods counted on it hold."""
        self._sharers: dict[str, set[str]] = {}
        """GPU group label value -> the live pods labelled with it (any namespace but the reservations')."""
        self._reservations: dict[str, set[str]] = {}
        """GPU group label value -> its reservation pods, to recount when the group gains or loses sharers."""

    # --- the GPU-group index ------------------------------------------------------------------------------
    def reindex(self) -> None:
        """Forget the index (the pods are being listed afresh; each is `track`ed again)."""
        self._sharers.clear()
        self._reservations.clear()

    def track(self, name: str, before: wire.Pod | None, after: wire.Pod | None) -> set[str]:
        """Keep the GPU-group index as pod `name` changes from `before` to `after` (None: absent); the
        reservation pods to recount because their group gained its first sharer or lost its last."""
        recount: set[str] = set()
        for pod, sign in ((before, -1), (after, 1)):
            if pod is None:
                continue
            labels = pod.metadata.labels
            if gpu_sharing.is_reservation_pod(pod.metadata.namespace, labels):
                group = labels[keys.KAI_GPU_GROUP_LABEL]
                members = self._reservations.setdefault(group, set())
                if sign > 0:
                    members.add(name)
                else:
                    members.discard(name)
                    if not members:
                        del self._reservations[group]
                continue
            live = sign > 0 and gpu_sharing.is_live_sharer(pod)
            for group in gpu_sharing.groups_of_labels(labels):
                sharers = self._sharers.get(group, set())
                was = bool(sharers)
                if sign < 0:
                    sharers.discard(name)
                elif live:
                    sharers.add(name)
                if sharers:
                    self._sharers[group] = sharers
                else:
                    self._sharers.pop(group, None)
                if was != bool(sharers):
                    recount.update(self._reservations.get(group, ()))
        return recount

    # --- what a pod holds ---------------------------------------------------------------------------------
    def holding(self, pod: wire.Pod) -> tuple[str, Footprint] | None:
        """(node, what it holds) for a pod that is not in KV as ours: None when it is on no node, has
        finished, is a reservation whose group has live sharers, or its requests do not translate."""
        node = pod.spec.node_name
        if not node or pod.status.phase in wire.FINISHED_PHASES:
            return None
        labels = pod.metadata.labels
        if gpu_sharing.is_reservation_pod(pod.metadata.namespace, labels) and self._sharers.get(
            labels[keys.KAI_GPU_GROUP_LABEL]
        ):
            # Its device is the GPU group its sharers already count on the node: counting it would take
            # the device off the node twice. Without live sharers it counts as what it is, a pod holding
            # a GPU, until the binder deletes it: else a whole-GPU pod placed there in the meantime would
            # be refused by the kubelet (UnexpectedAdmissionError).
            return None
        try:
            usage = translate.pod_requests(pod)
            ports = translate.host_ports_of(pod)
        except InvalidObject:
            return None
        scalars = {name: float(amount) for name, amount in (*usage.mig.items(), *usage.scalars.items())}
        return node, Footprint(
            usage.cpu_millis, usage.memory_bytes, int(usage.gpus), 1, scalars, Counter(ports)
        )

    # --- the totals ---------------------------------------------------------------------------------------
    def count(self, name: str, node: str, held: Footprint) -> None:
        """Pod `name` holds `held` on `node`."""
        self._counted[name] = (node, held)
        self._on.setdefault(node, Footprint()).add(held, 1)

    def uncount(self, name: str) -> str | None:
        """Pod `name` is counted no more; the node it was counted on, None when it was not."""
        counted = self._counted.pop(name, None)
        if counted is None:
            return None
        node, held = counted
        self._on[node].add(held, -1)
        return node

    def on(self, node: str) -> Footprint | None:
        """What the pods counted on `node` hold, None when none is."""
        used = self._on.get(node)
        if used is not None and used.pods == 0:
            del self._on[node]
            return None
        return used


def subtract(node: Node, used: Footprint) -> Node:
    """The node less what foreign pods hold on it (never below zero), with the host ports they bind."""
    scalars = node.scalars
    if any(used.scalars.values()):
        scalars = {name: max(0.0, have - used.scalars.get(name, 0.0)) for name, have in node.scalars.items()}
    return msgspec.structs.replace(
        node,
        cpu_millis=max(0.0, node.cpu_millis - used.cpu_millis),
        memory_bytes=max(0.0, node.memory_bytes - used.memory_bytes),
        gpus=max(0, node.gpus - used.gpus),
        max_pods=max(0, node.max_pods - used.pods),
        scalars=scalars,
        used_host_ports=tuple(sorted(used.host_ports, key=lambda p: (p.port, p.protocol, p.ip))),
    )
