"""The Kubernetes objects the state service mirrors, and the model objects they become in KV.

Fed by `services.state.kube_source` (one `relist` per informer list, one `change` per watch event) and
drained by its flusher (`flush`), which writes the returned `Change`s through `services.state.kv_writer`.
Pure: no I/O, no clock; decoding and translation are `shared.kube`'s.

What KV gets must always be a consistent cluster for the core, so objects whose references do not resolve
are held back, each with the reason (`problems`), until they do:

- a queue whose parent is unknown or which sits on a cycle of parents, with every podgroup in it;
- a podgroup whose queue is not (yet) a valid queue, with every pod in it;
- a pod of this scheduler without a podgroup yet (the pod-grouper's work: `ungrouped`), or whose podgroup
  is held back or not yet seen;
- a podgroup whose `kairos.io/after` dependencies have not all succeeded (`services.state.dependencies`:
  waiting, blocked by a failure, or on a cycle), or whose annotation does not parse, with every pod in it. The
  verdicts (`stages`) are recomputed at a flush when a podgroup, pod or Job they read changed, from the
  podgroups, their pods and the Jobs the mirror watches (a Job's Complete or Failed condition decides its
  stage; other workloads' stages are read from their pods). Pods still carrying the `kairos.io/after`
  scheduling gate once their podgroup may run are listed by `ungatable`, for the gate keeper to lift.

A node's GPUs are what Kubernetes advertises, corrected by the node agent's latest inventory while it is fresh
(`services.state.gpu_inventory`: unhealthy devices are not handed out, memory per device is measured), and
carries the decayed use and health of each device from the agent's telemetry while it is fresh
(`services.state.gpu_usage`; rewritten only when a device moved by 10 points or its health changed).

Resources held on a node by pods Kairos does not schedule — another scheduler's pods, or a pod of ours
whose podgroup is gone — are taken off that node's capacity, so they are never handed out twice. The
binder's GPU reservation pods are the exception: the device one holds is its group's, already counted by
the group's sharers.

An object that does not translate (a bad annotation, a negative quota) keeps its last good translation
when it had one (a running pod must stay counted on its node) and is otherwise held back; either way the
problem is recorded under the object's name, for the write-back to report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.state.dependencies import (
    AFTER_ANNOTATION,
    Decision,
    Phase,
    Ref,
    Stage,
    Verdict,
    evaluate,
    parse_after,
)
from services.state.gate_patches import is_gated
from services.state.gpu_inventory import is_stale, mark_excluded, merge_inventory
from services.state.gpu_usage import NodeUsage, needs_rewrite, observe, settle, usage_of
from services.state.gpu_usage import is_stale as usage_is_stale
from services.state.kv_objects import Change, Obj, key_of
from services.state.problems import (
    INVALID_PODGROUP,
    INVALID_REASONS,
    STAGE_REASONS,
    WAITING_FOR_MIN_MEMBER,
    Problem,
    ProblemKind,
)
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import GpuTelemetry
from shared.contracts.inventory import GpuInventory
from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys, translate, wire
from shared.model import Node, Pod, PodGroup, Queue

NODES = "nodes"
PODS = "pods"
PODGROUPS = "podgroups"
QUEUES = "queues"
PRIORITY_CLASSES = "priorityclasses"
TOPOLOGIES = "topologies"
JOBS = "jobs"
KINDS = (NODES, PODS, PODGROUPS, QUEUES, PRIORITY_CLASSES, TOPOLOGIES, JOBS)

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
_STAGE_HOLDS = frozenset(STAGE_REASONS.values())


@dataclass
class _Usage:
    """What foreign pods hold on one node."""

    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    gpus: int = 0
    pods: int = 0


@dataclass
class Mirror:
    """Raw objects by kind and name, their translations, and what KV holds."""

    scheduler_name: str = "kai-scheduler"
    raw: dict[str, dict[str, Any]] = field(default_factory=lambda: {kind: {} for kind in KINDS})
    current: dict[str, Obj] = field(default_factory=dict)
    """What this mirror last told KV (by KV key)."""
    problems: dict[str, str] = field(default_factory=dict)
    """Object ("pod ns/name", "queue q") -> what is wrong with it (it did not decode or translate)."""
    held: dict[str, str] = field(default_factory=dict)
    """Object -> why it is held back from KV although it translates (recomputed by every `desired`)."""
    _dirty: dict[str, set[str]] = field(default_factory=lambda: {kind: set() for kind in KINDS})
    inventories: dict[str, GpuInventory] = field(default_factory=dict)
    """Node name -> the GPU agent's latest inventory."""
    usage: dict[str, NodeUsage] = field(default_factory=dict)
    """Node name -> its devices' decayed use and health from the agent's telemetry."""
    _members: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """PodGroup "ns/name" -> the "ns/name" of the pods that name it (for the write-back)."""
    _cache: dict[str, tuple[object, Any]] = field(default_factory=dict)
    """Object label -> (what it was translated from, its last good translation)."""
    _full: bool = True
    """The next flush recomputes everything (`desired`): at start, after a relist, and when a queue, priority
    class or topology changed (they reach every podgroup). Otherwise a flush recomputes only the podgroups,
    pods and nodes that changed, and what depends on them."""
    _queues: dict[str, Queue] = field(default_factory=dict)
    """The valid queues as of the last flush."""
    _groups: dict[str, PodGroup] = field(default_factory=dict)
    """The podgroups in KV as of the last flush, by "ns/name"."""
    _keys: dict[tuple[str, str], str] = field(default_factory=dict)
    """(kind, name) -> the KV key its object is under, for podgroups and nodes in KV."""
    _pod_out: dict[str, str | tuple[str, _Usage]] = field(default_factory=dict)
    """Pod name -> what it adds: its KV key, or (node, usage) when it holds a node for another scheduler."""
    _foreign: dict[str, _Usage] = field(default_factory=dict)
    """Node -> what pods Kairos does not schedule hold on it."""
    _ungrouped: dict[str, None] = field(default_factory=dict)
    """Pods of this scheduler, alive and without a podgroup (an ordered set)."""
    _undecodable: set[str] = field(default_factory=set)
    """Labels whose problem is that the object did not decode."""
    stages: dict[str, Decision] = field(default_factory=dict)
    """PodGroup "ns/name" with `kairos.io/after` -> its verdict as of the last flush."""
    _after_errors: dict[str, str] = field(default_factory=dict)
    """PodGroup "ns/name" -> why its `kairos.io/after` does not parse (it is held back as invalid)."""
    _errors_shown: dict[str, str] = field(default_factory=dict)
    """`_after_errors` as of the last verdicts (a change re-examines the podgroup)."""
    _afters: dict[str, tuple[Ref, ...]] = field(default_factory=dict)
    """PodGroup "ns/name" -> its parsed `kairos.io/after` (podgroups that have one)."""
    _owner_index: dict[Ref, str] = field(default_factory=dict)
    """(namespace, top owner name) -> the PodGroup made for it, so `after` may name the workload."""
    _relevant: set[str] = field(default_factory=set)
    """PodGroups the last verdicts read (dependants and what they name): a change to one or its pods
    recomputes the verdicts; changes elsewhere do not."""
    _relevant_jobs: set[str] = field(default_factory=set)
    """Jobs ("ns/name") the last verdicts read or named."""
    _stages_stale: bool = True
    _held_reasons: dict[str, str] = field(default_factory=dict)
    """Held label -> the Event reason when it is not the kind's Invalid* one (a waiting stage)."""
    _gated: dict[str, None] = field(default_factory=dict)
    """Pods of this scheduler, alive, carrying the `kairos.io/after` scheduling gate (an ordered set)."""
    _sharers: dict[str, set[str]] = field(default_factory=dict)
    """GPU group label value -> the live pods labelled with it (any namespace but the reservations')."""
    _reservations: dict[str, set[str]] = field(default_factory=dict)
    """GPU group label value -> its reservation pods, to recount when the group gains or loses sharers."""

    # --- input ------------------------------------------------------------------------------------------
    def relist(self, kind: str, objects: Iterable[bytes]) -> None:
        """Replace everything held of `kind` by a fresh list."""
        fresh: dict[str, Any] = {}
        for data in objects:
            obj = self._decode(kind, data)
            if obj is not None:
                fresh[_name_of(obj)] = obj
        old = self.raw[kind]
        for gone in old.keys() - fresh.keys():
            self._forget(kind, gone)
        if kind == PODGROUPS:
            self._afters.clear()
            self._after_errors.clear()
            self._owner_index.clear()
            for name, group in fresh.items():
                self._track_stage_group(name, None, group)
        if kind in (PODGROUPS, PODS, JOBS):
            self._stages_stale = True
        self._dirty[kind].update(old.keys() | fresh.keys())
        self.raw[kind] = fresh
        self._full = True
        if kind == PODS:
            self._members.clear()
            self._ungrouped.clear()
            self._gated.clear()
            self._sharers.clear()
            self._reservations.clear()
            for name, pod in fresh.items():
                self._index(name, None, pod)
                self._track_ungrouped(name, pod)
                self._track_gated(name, pod)
                self._track_sharing(name, None, pod)

    def change(self, kind: str, event: str, data: bytes) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        obj = self._decode(kind, data)
        if obj is None:
            return
        name = _name_of(obj)
        before = self.raw[kind].get(name)
        if event == "DELETED":
            self.raw[kind].pop(name, None)
            self._forget(kind, name)
        else:
            self.raw[kind][name] = obj
        after = None if event == "DELETED" else obj
        if kind == PODS:
            self._index(name, before, after)
            self._track_ungrouped(name, after)
            self._track_gated(name, after)
            self._track_sharing(name, before, after)
            if self._relevant and (_group_of(before) in self._relevant or _group_of(after) in self._relevant):
                self._stages_stale = True
        elif kind == PODGROUPS:
            self._track_stage_group(name, before, after)
        elif kind == JOBS:
            if name in self._relevant_jobs:
                self._stages_stale = True
        elif kind in (QUEUES, PRIORITY_CLASSES, TOPOLOGIES):
            self._full = True
        self._dirty[kind].add(name)

    def _ours_and_alive(self, pod: Any) -> bool:
        """A pod of this scheduler that has not finished and is not being deleted."""
        return (
            pod is not None
            and pod.spec.scheduler_name == self.scheduler_name
            and pod.status.phase not in _FINISHED_PHASES
            and pod.metadata.deletion_timestamp is None
        )

    def _track_ungrouped(self, name: str, pod: Any) -> None:
        if self._ours_and_alive(pod) and translate.podgroup_name_of(pod) is None:
            self._ungrouped[name] = None
        else:
            self._ungrouped.pop(name, None)

    def _track_gated(self, name: str, pod: Any) -> None:
        if self._ours_and_alive(pod) and is_gated(pod):
            self._gated[name] = None
        else:
            self._gated.pop(name, None)

    def _track_sharing(self, name: str, before: Any, after: Any) -> None:
        """Keep the GPU-group indexes; when a group gains its first sharer or loses its last, its
        reservation pods are recounted (see `_pod`)."""
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
            live = (
                sign > 0
                and pod.status.phase in gpu_sharing.LIVE_PHASES
                and pod.metadata.deletion_timestamp is None
            )
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
                    self._dirty[PODS].update(self._reservations.get(group, ()))

    def _index(self, name: str, before: Any, after: Any) -> None:
        old = _group_of(before)
        new = _group_of(after)
        if old == new:
            return
        if old is not None:
            self._members[old].discard(name)
            if not self._members[old]:
                del self._members[old]
        if new is not None:
            self._members[new].add(name)

    def members(self, namespace: str, podgroup: str) -> list[Any]:
        """The pods (raw) that belong to a podgroup, by name."""
        names = self._members.get(f"{namespace}/{podgroup}", ())
        return [self.raw[PODS][n] for n in sorted(names) if n in self.raw[PODS]]

    def node_count(self) -> int:
        return len(self.raw[NODES])

    def inventory(self, inventory: GpuInventory) -> None:
        """A node agent's inventory arrived."""
        self.inventories[inventory.node] = inventory
        self._dirty[NODES].add(inventory.node)

    def telemetry(self, telemetry: GpuTelemetry) -> None:
        """A node agent's telemetry arrived: folded into the decayed averages; the node is looked at again
        only when the change is worth a write."""
        usage = observe(self.usage.get(telemetry.node), telemetry)
        if usage is None:
            return
        self.usage[telemetry.node] = usage
        written = self.current.get(s.node_key(telemetry.node))
        if isinstance(written, Node) and needs_rewrite(written.gpu_devices, usage_of(usage)):
            self._dirty[NODES].add(telemetry.node)

    def touch_nodes(self) -> None:
        """Re-examine every node at the next flush (an inventory may have gone stale meanwhile)."""
        self._dirty[NODES].update(self.raw[NODES])

    def _decode(self, kind: str, data: bytes) -> Any:
        try:
            obj = wire.decode(kind, data)
        except InvalidObject as exc:
            label = f"{_SINGULAR[kind]} {exc.name}"
            self.problems[label] = str(exc)
            self._undecodable.add(label)
            return None
        # Decoding again clears a decoding problem (only that: a translation problem stays until the next
        # flush translates the object again, or the write-back would see it come and go).
        label = f"{_SINGULAR[kind]} {_name_of(obj)}"
        if label in self._undecodable:
            self._undecodable.discard(label)
            self.problems.pop(label, None)
        return obj

    # --- output -----------------------------------------------------------------------------------------
    def ungrouped(self) -> list[Any]:
        """Pods of this scheduler, alive and without a podgroup: the pod-grouper's work."""
        pods = self.raw[PODS]
        return [pods[name] for name in self._ungrouped if name in pods]

    def ungatable(self) -> list[Any]:
        """Pods carrying the `kairos.io/after` gate whose podgroup may run (its dependencies succeeded, or it
        has none): the gate keeper's work. A pod without a podgroup yet, or whose podgroup has not been
        seen, keeps its gate until the mirror knows what its podgroup waits for."""
        pods = self.raw[PODS]
        out = []
        for name in self._gated:
            pod = pods.get(name)
            if pod is None or (group := translate.podgroup_name_of(pod)) is None:
                continue
            key = f"{pod.metadata.namespace}/{group}"
            if key not in self.raw[PODGROUPS] or key in self._after_errors:
                continue
            decision = self.stages.get(key)
            if decision is None or decision.verdict == Verdict.READY:
                out.append(pod)
        return out

    def _track_stage_group(self, name: str, before: Any, after: Any) -> None:
        """Keep the parsed `kairos.io/after` of every podgroup that has one and the top-owner index up to
        date, and note when the verdicts may have changed."""
        old_value = before.metadata.annotations.get(AFTER_ANNOTATION, "") if before is not None else None
        new_value = after.metadata.annotations.get(AFTER_ANNOTATION, "") if after is not None else None
        old_owner = _owner_key(before)
        new_owner = _owner_key(after)
        if old_owner is not None and old_owner != new_owner and self._owner_index.get(old_owner) == name:
            del self._owner_index[old_owner]
        if new_owner is not None:
            self._owner_index[new_owner] = name
        if before is None or after is None or old_value != new_value or old_owner != new_owner:
            self._afters.pop(name, None)
            self._after_errors.pop(name, None)
            if after is not None and new_value and new_value.strip():
                meta = after.metadata
                try:
                    self._afters[name] = parse_after(new_value, meta.namespace, kind="PodGroup", name=name)
                except InvalidObject as exc:
                    self._after_errors[name] = str(exc)
            self._stages_stale = True
        elif name in self._relevant:
            self._stages_stale = True

    def _decide_stages(self) -> None:
        """Recompute the verdicts when something they read changed; podgroups whose verdict or annotation
        error changed are looked at again. Only the dependants and what they name are built."""
        if not self._stages_stale:
            return
        self._stages_stale = False
        groups = self.raw[PODGROUPS]
        stages: dict[Ref, Stage] = {}
        relevant: set[str] = set()
        jobs: set[str] = set()

        def add(name: str, after: tuple[Ref, ...] = ()) -> None:
            group = groups[name]
            meta = group.metadata
            top = meta.owner_references[0] if meta.owner_references else None
            if top is not None and top.kind == "Job":
                jobs.add(f"{meta.namespace}/{top.name}")
            relevant.add(name)
            stages[Ref(meta.namespace, meta.name)] = Stage(
                namespace=meta.namespace,
                name=meta.name,
                owner=top.name if top is not None else "",
                phase=self._phase(group, top),
                after=after,
            )

        for name, refs in self._afters.items():
            if name in groups:
                add(name, refs)
        for ref in sorted({ref for refs in self._afters.values() for ref in refs}):
            key = f"{ref.namespace}/{ref.name}"
            jobs.add(key)
            target = key if key in groups else self._owner_index.get(ref)
            if target is not None and target in groups:
                if Ref(ref.namespace, groups[target].metadata.name) not in stages:
                    add(target)
                continue
            # A Job named that has no podgroup (its pods are gone, or not grouped yet) still says how it
            # ended.
            job = self.raw[JOBS].get(key)
            if job is not None:
                stages[ref] = Stage(
                    namespace=ref.namespace,
                    name=ref.name,
                    owner=ref.name,
                    phase=_job_phase(job) or Phase.PENDING,
                )
        decisions = (
            {f"{key.namespace}/{key.name}": d for key, d in evaluate(stages).items()} if stages else {}
        )
        changed = {n for n in decisions.keys() | self.stages.keys() if decisions.get(n) != self.stages.get(n)}
        errors = self._after_errors
        changed |= {
            n for n in errors.keys() | self._errors_shown.keys() if errors.get(n) != self._errors_shown.get(n)
        }
        self.stages = decisions
        self._errors_shown = dict(errors)
        self._relevant = relevant
        self._relevant_jobs = jobs
        self._dirty[PODGROUPS].update(n for n in changed if n in groups)

    def _phase(self, group: Any, top: Any) -> Phase:
        """How far the podgroup got: its Job's condition when its top owner is a Job, else its pods'."""
        job = None
        if top is not None and top.kind == "Job":
            job = self.raw[JOBS].get(f"{group.metadata.namespace}/{top.name}")
            if job is not None and (ended := _job_phase(job)) is not None:
                return ended
        phases = [pod.status.phase for pod in self.members(group.metadata.namespace, group.metadata.name)]
        if not phases:
            return Phase.PENDING
        if job is not None or any(p not in _FINISHED_PHASES for p in phases):
            # A Job decides itself when it has ended; until then its pods say only whether it started.
            return Phase.RUNNING if any(p not in ("Pending", "") for p in phases) else Phase.PENDING
        need = max(1, group.spec.min_member or 1)
        return Phase.SUCCEEDED if phases.count("Succeeded") >= need else Phase.FAILED

    def _may_schedule(self, name: str, group: PodGroup, queues: Mapping[str, Queue]) -> bool:
        """Whether the podgroup goes to KV: its queue is valid and its dependencies succeeded; otherwise it
        is held with the reason."""
        if group.queue not in queues:
            self.held[f"podgroup {name}"] = _unknown_queue(
                name,
                group.queue,
                self.held.get(f"queue {group.queue}") or self.problems.get(f"queue {group.queue}"),
            )
            return False
        if (stage := self._stage_hold(name)) is not None:
            reason, message = stage
            self.held[f"podgroup {name}"] = message
            self._held_reasons[f"podgroup {name}"] = reason
            return False
        return True

    def _stage_hold(self, name: str) -> tuple[str, str] | None:
        """(Event reason, message) when the podgroup must wait for its dependencies, else None."""
        error = self._after_errors.get(name)
        if error is not None:
            return INVALID_PODGROUP, error
        decision = self.stages.get(name)
        if decision is None or decision.verdict == Verdict.READY:
            return None
        return STAGE_REASONS[decision.verdict], f"PodGroup {name!r}: {decision.reason}"

    def _release(self, label: str) -> None:
        self.held.pop(label, None)
        self._held_reasons.pop(label, None)

    def desired(self, now: float) -> dict[str, Obj]:
        """Every model object KV should hold now, by KV key (recomputed from the raw objects); `now` (epoch
        seconds, the agents' clock) decides which GPU inventories are stale."""
        out: dict[str, Obj] = {}
        self.held = {}
        self._held_reasons = {}
        self._keys = {}
        self._pod_out = {}
        priorities = {name: int(pc.value) for name, pc in self.raw[PRIORITY_CLASSES].items()}
        fallback = translate.default_priority(self.raw[PRIORITY_CLASSES].values())
        for topology in self.raw[TOPOLOGIES].values():
            translated = self._translate(
                "topology", _name_of(topology), topology, lambda t=topology: translate.topology_of(t)
            )
            if translated is not None:
                out[key_of(translated)] = translated
        queues = self._valid_queues()
        for queue in queues.values():
            out[key_of(queue)] = queue
        groups: dict[str, PodGroup] = {}
        for name, raw_group in self.raw[PODGROUPS].items():
            group = self._translate(
                "podgroup",
                name,
                (raw_group, priorities, fallback),
                lambda g=raw_group: translate.podgroup_of(
                    g, priority_classes=priorities, default_priority=fallback
                ),
            )
            if group is None:
                continue
            if not self._may_schedule(name, group, queues):
                continue
            groups[name] = group
            self._keys[("podgroup", name)] = key_of(group)
            out[key_of(group)] = group
        foreign: dict[str, _Usage] = defaultdict(_Usage)
        for name, raw_pod in self.raw[PODS].items():
            pod = self._pod(name, raw_pod, groups)
            if isinstance(pod, Pod):
                self._pod_out[name] = key_of(pod)
                out[key_of(pod)] = pod
            elif pod is not None:
                self._pod_out[name] = pod
                _accumulate(foreign[pod[0]], pod[1], 1)
        for name in self.raw[NODES]:
            node = self._node(name, foreign.get(name), now)
            if node is not None:
                self._keys[("node", name)] = key_of(node)
                out[key_of(node)] = node
        self._queues = queues
        self._groups = groups
        self._foreign = dict(foreign)
        return out

    def _node(self, name: str, used: _Usage | None, now: float) -> Node | None:
        """The node as KV should hold it: translated, corrected by a fresh inventory, less foreign usage."""
        raw_node = self.raw[NODES][name]
        inventory = self.inventories.get(name)
        if inventory is not None and is_stale(inventory, now):
            inventory = None
        node: Node | None = self._translate(
            "node",
            name,
            (raw_node, inventory),
            lambda n=raw_node, i=inventory: merge_inventory(translate.node_of(n), i),
        )
        if node is None:
            return None
        usage = self.usage.get(name)
        fresh = usage_of(usage) if usage is not None and not usage_is_stale(usage, now) else ()
        fresh = mark_excluded(fresh, inventory)
        written = self.current.get(key_of(node))
        devices = settle(written.gpu_devices if isinstance(written, Node) else (), fresh)
        if devices:
            node = msgspec.structs.replace(node, gpu_devices=devices)
        if used is None:
            return node
        return msgspec.structs.replace(
            node,
            cpu_millis=max(0.0, node.cpu_millis - used.cpu_millis),
            memory_bytes=max(0.0, node.memory_bytes - used.memory_bytes),
            gpus=max(0, node.gpus - used.gpus),
            max_pods=max(0, node.max_pods - used.pods),
        )

    def _changed(self, now: float) -> dict[str, Obj | None]:
        """What KV should hold under the keys the dirty podgroups, pods and nodes touch (None: nothing),
        with the bookkeeping of `desired` kept up to date; everything else stays as it is."""
        out: dict[str, Obj | None] = {}
        priorities = {name: int(pc.value) for name, pc in self.raw[PRIORITY_CLASSES].items()}
        fallback = translate.default_priority(self.raw[PRIORITY_CLASSES].values())
        pods = set(self._dirty[PODS])
        nodes = set(self._dirty[NODES])
        for name in self._dirty[PODGROUPS]:
            pods.update(self._members.get(name, ()))
            self._groups.pop(name, None)
            self._release(f"podgroup {name}")
            old_key = self._keys.pop(("podgroup", name), None)
            if old_key is not None:
                out[old_key] = None
            raw_group = self.raw[PODGROUPS].get(name)
            if raw_group is None:
                continue
            group = self._translate(
                "podgroup",
                name,
                (raw_group, priorities, fallback),
                lambda g=raw_group: translate.podgroup_of(
                    g, priority_classes=priorities, default_priority=fallback
                ),
            )
            if group is None:
                continue
            if not self._may_schedule(name, group, self._queues):
                continue
            self._groups[name] = group
            self._keys[("podgroup", name)] = key_of(group)
            out[key_of(group)] = group
        for name in pods:
            before = self._pod_out.pop(name, None)
            if isinstance(before, str):
                out.setdefault(before, None)
            elif before is not None:
                _accumulate(self._foreign[before[0]], before[1], -1)
                nodes.add(before[0])
            self.held.pop(f"pod {name}", None)
            raw_pod = self.raw[PODS].get(name)
            if raw_pod is None:
                continue
            pod = self._pod(name, raw_pod, self._groups)
            if isinstance(pod, Pod):
                self._pod_out[name] = key_of(pod)
                out[key_of(pod)] = pod
            elif pod is not None:
                self._pod_out[name] = pod
                _accumulate(self._foreign.setdefault(pod[0], _Usage()), pod[1], 1)
                nodes.add(pod[0])
        for name in nodes:
            old_key = self._keys.pop(("node", name), None)
            if old_key is not None:
                out.setdefault(old_key, None)
            used = self._foreign.get(name)
            if used is not None and used.pods == 0:
                del self._foreign[name]
                used = None
            if name not in self.raw[NODES]:
                continue
            node = self._node(name, used, now)
            if node is not None:
                self._keys[("node", name)] = key_of(node)
                out[key_of(node)] = node
        return out

    def flush(self, now: float) -> list[Change]:
        """The changes that bring KV from `current` to `desired(now)`; `current` then equals the latter."""
        if not any(self._dirty.values()):
            return []
        self._decide_stages()
        if self._full:
            for dirty in self._dirty.values():
                dirty.clear()
            self._full = False
            want = self.desired(now)
            changes = [
                Change(key, self.current.get(key), obj)
                for key, obj in want.items()
                if self.current.get(key) != obj
            ]
            changes += [Change(key, obj, None) for key, obj in self.current.items() if key not in want]
            self.current = want
            return changes
        # Only podgroups, pods and nodes changed: recompute those (and the pods of changed podgroups, the
        # nodes whose foreign usage moved), not the whole cluster on every flush.
        touched = self._changed(now)
        for dirty in self._dirty.values():
            dirty.clear()
        changes = []
        for key, obj in touched.items():
            before = self.current.get(key)
            if obj is None:
                if before is not None:
                    del self.current[key]
                    changes.append(Change(key, before, None))
            elif before != obj:
                self.current[key] = obj
                changes.append(Change(key, before, obj))
        return changes

    def adopt(self, objects: Mapping[str, Obj]) -> None:
        """Start from what KV holds (a restarted owner): the first flush then writes only differences."""
        self.current = dict(objects)
        self._full = True

    def reportable(self) -> dict[str, Problem]:
        """Queues, PodGroups and pods of ours held back for a fault of their own (not translating, an
        unknown or cyclic parent, an unknown queue), and gangs with fewer pods than their min member, by
        label: what the write-back shows as Events and conditions. A pod held only because its podgroup is
        is left out (the podgroup carries the problem)."""
        found: dict[str, Problem] = {}
        kinds: dict[str, ProblemKind] = {"queue": "Queue", "podgroup": "PodGroup", "pod": "Pod"}
        for label, message in (*self.problems.items(), *self.held.items()):
            singular, _, name = label.partition(" ")
            kind = kinds.get(singular)
            if kind is None or label in found:
                continue
            if kind == "Pod":
                raw_pod = self.raw[PODS].get(name)
                if (
                    label in self.held
                    or raw_pod is None
                    or raw_pod.spec.scheduler_name != self.scheduler_name
                ):
                    continue
            namespace, _, short = name.rpartition("/")
            found[label] = Problem(
                kind=kind,
                namespace=namespace,
                name=short,
                reason=self._held_reasons.get(label, INVALID_REASONS[kind]),
                message=message,
            )
        for name, group in self._groups.items():
            # Every pod counts, finished ones too (a Job whose pods completed is not short of its gang), as in
            # `shared.model.validate`.
            have = len(self._members.get(name, ()))
            if have == 0:
                continue
            need = sum(ps.min_available for ps in group.root.all_pod_sets())
            if have < need:
                found[f"podgroup {name}"] = Problem(
                    kind="PodGroup",
                    namespace=group.namespace,
                    name=group.name,
                    reason=WAITING_FOR_MIN_MEMBER,
                    message=(
                        f"PodGroup {name!r}: spec.minMember: waiting for min member: {have} of {need} pods "
                        "exist; the gang is placed whole or not at all"
                    ),
                )
        return found

    # --- helpers ----------------------------------------------------------------------------------------
    def _valid_queues(self) -> dict[str, Queue]:
        ordered = sorted(
            self.raw[QUEUES].items(), key=lambda item: (item[1].metadata.creation_timestamp or "", item[0])
        )
        translated: dict[str, Queue] = {}
        for index, (name, raw_queue) in enumerate(ordered):
            queue = self._translate(
                "queue",
                name,
                (raw_queue, index),
                lambda q=raw_queue, i=index: translate.queue_of(q, creation_index=i),
            )
            if queue is not None:
                translated[name] = queue
        valid: dict[str, Queue] = {}
        for name, queue in translated.items():
            chain = [name]
            current: Queue | None = queue
            problem = ""
            while current is not None and current.parent is not None:
                if current.parent in chain:
                    problem = "cycle of parent queues " + " -> ".join(
                        [*chain[chain.index(current.parent) :], current.parent]
                    )
                    break
                parent = translated.get(current.parent)
                if parent is None:
                    problem = f"parent queue {current.parent!r} does not exist"
                    if f"queue {current.parent}" in self.problems:
                        problem = f"parent queue {current.parent!r} is not valid"
                    break
                chain.append(current.parent)
                current = parent
            if problem and len(chain) > 1 and not problem.startswith("cycle"):
                # The fault is further up: say which parent is held back, and why.
                problem = f"parent queue {queue.parent!r} is held back ({problem})"
            if problem:
                self.held[f"queue {name}"] = f"Queue {name!r}: spec.parentQueue: {problem}"
            else:
                valid[name] = queue
        return valid

    def _pod(
        self, name: str, raw_pod: Any, groups: Mapping[str, PodGroup]
    ) -> Pod | tuple[str, _Usage] | None:
        """A pod of ours in a known podgroup, or the node usage of a pod we do not schedule, or nothing."""
        ours = raw_pod.spec.scheduler_name == self.scheduler_name
        group_name = translate.podgroup_name_of(raw_pod) if ours else None
        group_key = f"{raw_pod.metadata.namespace}/{group_name}" if group_name else None
        if ours and group_key is not None and group_key in groups:
            pod = self._translate(
                "pod", name, (raw_pod, group_key), lambda: translate.pod_of(raw_pod, podgroup=group_key)
            )
            if isinstance(pod, Pod):
                return pod
        if ours and group_key is None:
            self.held[f"pod {name}"] = f"pod {name}: waiting for its podgroup (pod-grouper)"
        elif (
            ours
            and group_key is not None
            and group_key not in groups
            and self._held_reasons.get(f"podgroup {group_key}") in _STAGE_HOLDS
            and (stage := self.stages.get(group_key)) is not None
        ):
            self.held[f"pod {name}"] = (
                f"pod {name}: {stage.reason} ({AFTER_ANNOTATION} of podgroup {group_key})"
            )
        elif ours and group_key not in groups:
            why = self.held.get(f"podgroup {group_key}") or self.problems.get(f"podgroup {group_key}")
            self.held[f"pod {name}"] = (
                f"pod {name}: podgroup {group_key} is not scheduled: {why}"
                if why
                else f"pod {name}: podgroup {group_key} does not exist (yet)"
            )
        node = raw_pod.spec.node_name
        if not node or raw_pod.status.phase in _FINISHED_PHASES:
            return None
        labels = raw_pod.metadata.labels
        if gpu_sharing.is_reservation_pod(raw_pod.metadata.namespace, labels) and self._sharers.get(
            labels[keys.KAI_GPU_GROUP_LABEL]
        ):
            # Its device is the GPU group its sharers already count on the node: counting it would take
            # the device off the node twice. Without live sharers it counts as what it is, a pod holding
            # a GPU, until the binder deletes it: else a whole-GPU pod placed there in the meantime would
            # be refused by the kubelet (UnexpectedAdmissionError).
            return None
        try:
            usage = translate.pod_requests(raw_pod)
        except InvalidObject:
            return None
        return node, _Usage(usage.cpu_millis, usage.memory_bytes, int(usage.gpus), 1)

    def _translate(self, kind: str, name: str, source: object, make: Any) -> Any:
        """`make()`, unless the cached translation came from the same `source`: the raw object itself
        (watch events replace it, so identity says unchanged) or a tuple of it and the other values the
        translation reads (compared by value). A failure keeps the last good translation."""
        label = f"{kind} {name}"
        cached = self._cache.get(label)
        if cached is not None and _same(cached[0], source):
            return cached[1]
        try:
            obj = make()
        except InvalidObject as exc:
            self.problems[label] = str(exc)
            return cached[1] if cached is not None else None
        self.problems.pop(label, None)
        self._cache[label] = (source, obj)
        return obj

    def _forget(self, kind: str, name: str) -> None:
        """Drop what is remembered of an object that is gone."""
        label = f"{_SINGULAR[kind]} {name}"
        self._cache.pop(label, None)
        self.problems.pop(label, None)
        self._undecodable.discard(label)


_SINGULAR = {
    NODES: "node",
    PODS: "pod",
    PODGROUPS: "podgroup",
    QUEUES: "queue",
    PRIORITY_CLASSES: "priorityclass",
    TOPOLOGIES: "topology",
    JOBS: "job",
}


def _job_phase(job: wire.Job) -> Phase | None:
    """A Job's end from its conditions (Complete or SuccessCriteriaMet; Failed or FailureTarget), or None
    while it runs."""
    for condition in job.status.conditions:
        if condition.status != "True":
            continue
        if condition.type in ("Complete", "SuccessCriteriaMet"):
            return Phase.SUCCEEDED
        if condition.type in ("Failed", "FailureTarget"):
            return Phase.FAILED
    return None


def _accumulate(total: _Usage, usage: _Usage, sign: int) -> None:
    total.cpu_millis += sign * usage.cpu_millis
    total.memory_bytes += sign * usage.memory_bytes
    total.gpus += sign * usage.gpus
    total.pods += sign * usage.pods


def _same(cached: object, source: object) -> bool:
    if isinstance(cached, tuple) and isinstance(source, tuple):
        return (
            len(cached) == len(source)
            and cached[0] is source[0]
            and all(a == b for a, b in zip(cached[1:], source[1:], strict=True))
        )
    return cached is source


def _unknown_queue(name: str, queue: str, why: str | None) -> str:
    if why:
        return f"PodGroup {name!r}: spec.queue: queue {queue!r} is held back ({why})"
    return f"PodGroup {name!r}: spec.queue: queue {queue!r} does not exist"


def _owner_key(group: Any) -> Ref | None:
    """(namespace, top owner name) of a PodGroup, None without an owner."""
    if group is None or not group.metadata.owner_references:
        return None
    return Ref(group.metadata.namespace, group.metadata.owner_references[0].name)


def _group_of(pod: Any) -> str | None:
    if pod is None:
        return None
    name = translate.podgroup_name_of(pod)
    return f"{pod.metadata.namespace}/{name}" if name else None


def _name_of(obj: Any) -> str:
    meta = obj.metadata
    return f"{meta.namespace}/{meta.name}" if meta.namespace else str(meta.name)
