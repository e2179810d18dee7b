"""The simulated cluster: the state service's source of truth when no Kubernetes cluster is attached.

Exactly one state replica owns it (`--set source=sim`, the default); it lives in that replica's memory and
every change to it goes through the owner's request handlers (`cluster.apply`, `cluster.bind`,
`cluster.evict`) or its timers. Called only by `services.state.service`, always under one lock, in order.

It holds nodes, queues, podgroups, pods and topologies keyed by their KV key (`shared.contracts.subjects`),
and behaves like KAI's test harness cluster: a bound pod starts Running `run_delay` seconds later (at once
when 0); a running pod with the `kairos.io/run-seconds` label succeeds that long after it started; an
evicted pod is back to Pending at once, its node and GPU groups cleared (the harness recreates it pending).

No I/O and no clock of its own: every operation takes `now` (the event loop's time) and returns the
`Change`s it made, which `services.state.sources.kv_writer` turns into KV writes. Timers are due times the service
polls with `next_due()` and fires with `fire(now)`.

Simulated GPU telemetry: every `telemetry_period` seconds (one more timer), each GPU node labelled
`kairos.io/simulated-telemetry=true` (the demo cluster's are) gets the telemetry an agent would send for
the pods placed on it, with seeded noise (`services.state.mirror.gpu_usage.simulated_telemetry`), folded into its
`gpu_devices` like an agent's; the node is rewritten only past the hysteresis threshold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from services.state.mirror.gpu_usage import (
    SIM_TELEMETRY_LABEL,
    NodeUsage,
    Occupancy,
    groups_of,
    observe,
    settle,
    simulated_telemetry,
    usage_of,
)
from services.state.sources.kv_objects import FINISHED, HOLDING, Change, Obj, key_of
from shared.clusterfile import RUN_SECONDS_LABEL, ClusterObjects, run_seconds
from shared.contracts import subjects as s
from shared.contracts.messages import (
    ApplyRequest,
    Binding,
    EvictionOrder,
    PodGroupStamps,
    StateRecord,
    record_object,
)
from shared.core.stamps import KEEP, latest, merged_stamps
from shared.errors import KairosError
from shared.model import Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.builders import gang, gpu_nodes
from shared.model.gather import snapshot_of
from shared.model.validate import validate_snapshot

RUN = "run"
FINISH = "finish"


class Refused(KairosError):  # noqa: N818 -- the cluster's answer, named like the tree's MalformedMessage
    """A well-formed request the cluster will not carry out (no such pod, bound elsewhere...)."""


@dataclass(frozen=True)
class Checkpoint:
    """The cluster as it was, to restore when its changes could not be written."""

    objects: dict[str, Obj]
    timers: dict[str, tuple[float, str]]
    usage: dict[str, NodeUsage]
    occupancy: dict[str, Occupancy]
    next_telemetry: float | None


TELEMETRY_PERIOD = 5.0
"""Seconds between simulated telemetry readings, as a GPU agent's default."""


def _measured(obj: Obj) -> bool:
    return isinstance(obj, Node) and obj.gpus > 0 and obj.labels.get(SIM_TELEMETRY_LABEL) == "true"


class SimulatedCluster:
    def __init__(self, run_delay: float = 0.0, telemetry_period: float = TELEMETRY_PERIOD) -> None:
        self.run_delay = run_delay
        self.telemetry_period = telemetry_period
        self._usage: dict[str, NodeUsage] = {}
        """Node name -> decayed use of its simulated devices."""
        self._occupancy: dict[str, Occupancy] = {}
        """Node name -> what holds each of its simulated devices (kept from reading to reading)."""
        self._next_telemetry: float | None = None
        self.objects: dict[str, Obj] = {}
        self._pod_keys: dict[str, str] = {}
        """Pod key (uid or namespace/name, what bindings name) -> KV key."""
        self._timers: dict[str, tuple[float, str]] = {}
        """KV key of a pod -> (due time, RUN or FINISH)."""

    # --- reading ---------------------------------------------------------------------------------------
    def pods(self) -> list[Pod]:
        return [o for o in self.objects.values() if isinstance(o, Pod)]

    def snapshot(self) -> Snapshot:
        return snapshot_of(self.objects.values())

    def next_due(self) -> float | None:
        due = min((due for due, _ in self._timers.values()), default=None)
        if self._next_telemetry is not None and (due is None or self._next_telemetry < due):
            return self._next_telemetry
        return due

    def checkpoint(self) -> Checkpoint:
        # Shallow copies suffice: objects are immutable and every operation replaces the dicts' entries.
        return Checkpoint(
            dict(self.objects),
            dict(self._timers),
            dict(self._usage),
            dict(self._occupancy),
            self._next_telemetry,
        )

    def restore(self, saved: Checkpoint) -> None:
        self.objects = dict(saved.objects)
        self._timers = dict(saved.timers)
        self._usage = dict(saved.usage)
        self._occupancy = dict(saved.occupancy)
        self._next_telemetry = saved.next_telemetry
        self._reindex()

    # --- operations --------------------------------------------------------------------------------------
    def adopt(self, records: Iterable[StateRecord], now: float) -> None:
        """Take over a cluster already in KV (a restarted owner continues where the last one stopped).

        Nothing changes, so nothing is returned; timers restart from `now` (the original start times are
        not kept in KV).
        """
        self.objects = {key_of(o): o for o in map(record_object, records)}
        self._reindex()
        self._timers.clear()
        for key, obj in self.objects.items():
            if isinstance(obj, Pod):
                self._retime(key, None, obj, now)
        self._usage.clear()
        self._occupancy.clear()
        self._next_telemetry = None
        self._retime_telemetry(now)

    def apply(self, request: ApplyRequest, now: float) -> list[Change]:
        """Add or replace the request's objects (with `replace`, drop every other object first).

        Without `replace` an existing pod keeps its placement (status, node, GPU groups): as with
        `kubectl apply`, the cluster owns a pod's status; bind and evict change it. The cluster that
        results must validate (`validate_snapshot`: known queues, parents and podgroups, no cycles), or
        the whole request is refused and nothing changes.
        """
        new: dict[str, Obj] = {} if request.replace else dict(self.objects)
        incoming: list[Obj] = [
            *request.nodes,
            *request.queues,
            *request.podgroups,
            *request.pods,
            *request.topologies,
        ]
        for given in incoming:
            key = key_of(given)
            old = self.objects.get(key)
            obj = given
            if isinstance(given, Pod):
                run_seconds(given)  # raises InvalidObject on a malformed label
                if not request.replace and isinstance(old, Pod):
                    obj = msgspec.structs.replace(
                        given, status=old.status, node=old.node, gpu_groups=old.gpu_groups
                    )
            elif isinstance(given, Node) and isinstance(old, Node) and not given.gpu_devices:
                # Measured use belongs to the cluster, like a pod's placement: an apply keeps it.
                obj = msgspec.structs.replace(given, gpu_devices=old.gpu_devices)
            new[key] = obj
        validate_snapshot(snapshot_of(new.values()))
        return self._commit(new, now)

    def bind(self, binding: Binding, now: float) -> list[Change]:
        """Bind a pod to a node. Idempotent: a pod already bound to that node changes nothing."""
        key, pod = self._find(binding.pod, binding.namespace, binding.name)
        if pod.status in HOLDING and pod.node is not None:
            if pod.node == binding.node:
                return []
            raise Refused(f"pod {pod.key!r} is already bound to {pod.node!r}")
        if pod.status in FINISHED:
            raise Refused(f"pod {pod.key!r} has finished ({pod.status})")
        if s.node_key(binding.node) not in self.objects:
            raise Refused(f"no node {binding.node!r}")
        status = PodStatus.RUNNING if self.run_delay <= 0 else PodStatus.BOUND
        bound = msgspec.structs.replace(pod, status=status, node=binding.node, gpu_groups=binding.gpu_groups)
        return self._commit({**self.objects, key: bound}, now)

    def evict(self, order: EvictionOrder, now: float) -> list[Change]:
        """Evict a pod from its node: it is Pending again at once. A pod on no node changes nothing."""
        key, pod = self._find(order.pod, order.namespace, order.name)
        if pod.status not in HOLDING or pod.node is None:
            return []
        if order.node and pod.node != order.node:
            raise Refused(f"pod {pod.key!r} is on {pod.node!r}, not {order.node!r}")
        pending = msgspec.structs.replace(pod, status=PodStatus.PENDING, node=None, gpu_groups=())
        return self._commit({**self.objects, key: pending}, now)

    def stamp(self, stamps: PodGroupStamps, now: float) -> list[Change]:
        """Store the podgroup stamps a binder sent (unknown podgroups are ignored). Only the stamped
        podgroups are compared: a binder sends stamps after most commits."""
        del now  # stamps set no timers
        wanted = (
            stamps.stale_since.keys()
            | stamps.last_start.keys()
            | stamps.last_eviction.keys()
            | stamps.bind_failure.keys()
        )
        touched: dict[str, Obj] = {}
        for kv, obj in self.objects.items():
            if isinstance(obj, PodGroup) and obj.key in wanted:
                stale, last = merged_stamps(
                    obj.stale_since,
                    obj.last_start_time,
                    new_stale_since=stamps.stale_since.get(obj.key, KEEP),
                    new_last_start=stamps.last_start.get(obj.key),
                )
                evicted = latest(obj.last_eviction_time, stamps.last_eviction.get(obj.key))
                failure = stamps.bind_failure.get(obj.key, obj.bind_failure)
                before = (obj.stale_since, obj.last_start_time, obj.last_eviction_time, obj.bind_failure)
                if (stale, last, evicted, failure) != before:
                    touched[kv] = msgspec.structs.replace(
                        obj,
                        stale_since=stale,
                        last_start_time=last,
                        last_eviction_time=evicted,
                        bind_failure=failure,
                    )
        changes = [Change(kv, self.objects[kv], after) for kv, after in sorted(touched.items())]
        if touched:
            self.objects = {**self.objects, **touched}
        return changes

    def delete(self, keys: Iterable[str], now: float) -> list[Change]:
        """Remove objects by KV key (unknown keys are ignored)."""
        gone = set(keys)
        return self._commit({k: o for k, o in self.objects.items() if k not in gone}, now)

    def fire(self, now: float) -> list[Change]:
        """Carry out the timers due by `now`: bound pods start running, finished ones succeed, and the
        simulated telemetry is read when it is due."""
        new = dict(self.objects)
        if self._next_telemetry is not None and self._next_telemetry <= now:
            new.update(self._telemetry(now))
            self._next_telemetry = now + self.telemetry_period
        for key, (due, what) in list(self._timers.items()):
            if due > now:
                continue
            pod = new.get(key)
            if not isinstance(pod, Pod):
                del self._timers[key]
                continue
            if what == RUN and pod.status == PodStatus.BOUND:
                new[key] = msgspec.structs.replace(pod, status=PodStatus.RUNNING)
            elif what == FINISH and pod.status == PodStatus.RUNNING:
                new[key] = msgspec.structs.replace(pod, status=PodStatus.SUCCEEDED)
            else:
                del self._timers[key]
        return self._commit(new, now)

    # --- internals ----------------------------------------------------------------------------------------
    def _telemetry(self, now: float) -> dict[str, Obj]:
        """The measured nodes whose devices moved enough to be written again, by KV key."""
        on: dict[str, list[Pod]] = {}
        for obj in self.objects.values():
            if isinstance(obj, Pod) and obj.node is not None and obj.status in HOLDING:
                on.setdefault(obj.node, []).append(obj)
        out: dict[str, Obj] = {}
        for key, node in self.objects.items():
            if not isinstance(node, Node) or not _measured(node):
                continue
            reading, occupancy = simulated_telemetry(
                node,
                on.get(node.name, []),
                now,
                self.telemetry_period,
                previous=self._occupancy.get(node.name),
            )
            usage = observe(self._usage.get(node.name), reading)
            if usage is None:
                continue
            self._usage[node.name] = usage
            self._occupancy[node.name] = occupancy
            devices = settle(node.gpu_devices, usage_of(usage, groups_of(occupancy)))
            if devices is not node.gpu_devices:
                out[key] = msgspec.structs.replace(node, gpu_devices=devices)
        return out

    def _find(self, pod_key: str, namespace: str, name: str) -> tuple[str, Pod]:
        key = self._pod_keys.get(pod_key) or s.pod_key(namespace, name)
        pod = self.objects.get(key)
        if not isinstance(pod, Pod):
            raise Refused(f"no pod {pod_key or f'{namespace}/{name}'!r}")
        return key, pod

    def _commit(self, new: dict[str, Obj], now: float) -> list[Change]:
        changes = [
            Change(key, self.objects.get(key), new.get(key))
            for key in sorted(self.objects.keys() | new.keys())
            if self.objects.get(key) != new.get(key)
        ]
        self.objects = new
        if any(isinstance(c.before, Pod) or isinstance(c.after, Pod) for c in changes):
            self._reindex()
        if any(isinstance(c.before, Node) or isinstance(c.after, Node) for c in changes):
            self._retime_telemetry(now)
        for change in changes:
            if isinstance(change.after, Pod) or isinstance(change.before, Pod):
                after = change.after if isinstance(change.after, Pod) else None
                before = change.before if isinstance(change.before, Pod) else None
                self._retime(change.key, before, after, now)
        return changes

    def _retime_telemetry(self, now: float) -> None:
        """Read telemetry while some node is measured; forget the nodes that left."""
        measured = {o.name for o in self.objects.values() if isinstance(o, Node) and _measured(o)}
        self._usage = {name: u for name, u in self._usage.items() if name in measured}
        self._occupancy = {name: o for name, o in self._occupancy.items() if name in measured}
        if not measured:
            self._next_telemetry = None
        elif self._next_telemetry is None:
            self._next_telemetry = now + self.telemetry_period

    def _reindex(self) -> None:
        self._pod_keys = {o.key: k for k, o in self.objects.items() if isinstance(o, Pod)}

    def _retime(self, key: str, before: Pod | None, after: Pod | None, now: float) -> None:
        """Set or clear the pod's timer for the status it moved into."""
        if after is None or after.status not in (PodStatus.BOUND, PodStatus.RUNNING):
            self._timers.pop(key, None)
            return
        moved = before is None or before.status != after.status or before.node != after.node
        if not moved and key in self._timers:
            return
        if after.status == PodStatus.BOUND:
            self._timers[key] = (now + self.run_delay, RUN)
            return
        seconds = run_seconds(after)
        if seconds is None:
            self._timers.pop(key, None)
        else:
            self._timers[key] = (now + seconds, FINISH)


def demo_cluster() -> ClusterObjects:
    """`--set demo=true`: the `kairos demo` cluster (4 nodes of 8 GPUs, with simulated telemetry; queues
    `org` > `research`, `product` with 16 deserved GPUs each) with a pending 4x2-GPU training gang and 6
    half-GPU inference pods."""
    unbounded = QueueResource(quota=-1, over_quota_weight=1, limit=-1)
    queues = [
        Queue(name="org", gpu=unbounded, cpu=unbounded, memory=unbounded),
        *(
            Queue(
                name=name,
                parent="org",
                creation_index=i,
                gpu=QueueResource(quota=16, over_quota_weight=1),
                cpu=unbounded,
                memory=unbounded,
            )
            for i, name in enumerate(("research", "product"))
        ),
    ]
    train, train_pods = gang("train-0", "research", 4, 2.0, priority=50)
    infer, infer_pods = gang("infer-0", "product", 6, 0.5, priority=125)
    pods = [
        msgspec.structs.replace(p, labels={**p.labels, RUN_SECONDS_LABEL: seconds})
        for group, seconds in ((train_pods, "600"), (infer_pods, "900"))
        for p in group
    ]
    return ClusterObjects(
        nodes=tuple(gpu_nodes(4, gpus=8, labels={SIM_TELEMETRY_LABEL: "true"})),
        queues=tuple(queues),
        podgroups=(train, infer),
        pods=tuple(pods),
    )
